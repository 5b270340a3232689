// Package v1alpha1 is coroner's API, group coroner.dev, version v1alpha1: the JobRecord
// object and every format that one of coroner's programs writes and another reads.
//
//   - jobrecord.go: the JobRecord (CRD deploy/base/jobrecord-crd.yaml, a copy in the Helm
//     chart's crds/), coroner-shim's record of the pods that left a Job, which
//     `coronerctl explain` reads (docs/explain.md);
//   - exithistory.go: the annotation coroner.dev/exit-history, in which coroner-agent
//     keeps a pod's last container exits (docs/agent.md);
//   - memory.go: the annotation coroner.dev/oom-memory-retry by which a Job opts in to
//     retries with more memory, and coroner.dev/memory-given, which says on a pod what the
//     shim gave it (docs/choices.md, docs/explain.md).
//
// The cause of death in a JobRecord's entries is conditions.Cause: it is computed from
// pod conditions that package conditions owns with the rest of coroner's vocabulary, and
// stays there; the CRD's schema of it is checked against that type with the JobRecord's.
//
// This package depends only on k8s.io/api, k8s.io/apimachinery and package conditions. It
// holds the types, their encodings and their pure helpers; the decisions that fill them
// (which entry a pod gets, how a record is written, how an exit history is bounded, how
// memory grows) stay with the programs that make them.
package v1alpha1

import "k8s.io/apimachinery/pkg/runtime/schema"

// The API group and version, and the JobRecord's kind and resource.
const (
	Group    = "coroner.dev"
	Version  = "v1alpha1"
	Kind     = "JobRecord"
	Resource = "jobrecords"
)

// GroupVersion is the API's group and version.
var GroupVersion = schema.GroupVersion{Group: Group, Version: Version}

// GroupVersionResource is the JobRecords' resource, for a dynamic client.
var GroupVersionResource = GroupVersion.WithResource(Resource)
