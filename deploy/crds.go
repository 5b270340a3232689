// Package deploy holds coroner's manifests (kustomize bases and overlays, the Helm chart;
// see README.md). Its Go side is the CRDs, embedded for the programs that install them
// without kustomize: the integration tests' API server (test/harness).
package deploy

import _ "embed"

// JobRecordCRD is base/jobrecord-crd.yaml: the CustomResourceDefinition of coroner-shim's
// JobRecords (api/v1alpha1.JobRecord).
//
//go:embed base/jobrecord-crd.yaml
var JobRecordCRD []byte
