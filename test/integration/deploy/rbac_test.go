package deploy_test

import (
	"context"
	"fmt"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// TestLeastPrivilege asks the API server's RBAC authorizer, through SubjectAccessReviews,
// what the two service accounts of deploy/ may do. What the agent may do to pods and
// Leases, and the shim to Jobs' status and pods, is narrowed further by the admission
// policies (admission_test.go).
func TestLeastPrivilege(t *testing.T) {
	env := deployed(t)
	client := kubernetes.NewForConfigOrDie(env.Config)
	const (
		agentSA = "coroner-agent"
		shimSA  = "coroner-shim"
		other   = "default" // a namespace of users' workloads
	)
	type access struct {
		verb, group, resource, subresource, namespace, name string
	}
	type sarCase struct {
		sa    string
		a     access
		allow bool
	}
	cases := []sarCase{
		// The agent: its node's pods, their status and exit-history annotation, events, its node, its Lease.
		{agentSA, access{verb: "list", resource: "pods"}, true},
		{agentSA, access{verb: "watch", resource: "pods"}, true},
		{agentSA, access{verb: "get", resource: "pods", namespace: other}, true},
		{agentSA, access{verb: "patch", resource: "pods", subresource: "status", namespace: other}, true},
		{agentSA, access{verb: "patch", resource: "pods", namespace: other}, false},
		{agentSA, access{verb: "update", resource: "pods", subresource: "status", namespace: other}, false},
		{agentSA, access{verb: "update", resource: "pods", namespace: other}, false},
		{agentSA, access{verb: "delete", resource: "pods", namespace: other}, false},
		{agentSA, access{verb: "deletecollection", resource: "pods", namespace: other}, false},
		{agentSA, access{verb: "create", resource: "pods", namespace: other}, false},
		{agentSA, access{verb: "create", resource: "pods", subresource: "eviction", namespace: other}, false},
		{agentSA, access{verb: "create", resource: "events", namespace: other}, true},
		{agentSA, access{verb: "create", group: "events.k8s.io", resource: "events", namespace: other}, true},
		{agentSA, access{verb: "get", resource: "nodes", name: "node-a"}, true},
		{agentSA, access{verb: "list", resource: "nodes"}, false},
		{agentSA, access{verb: "patch", resource: "nodes", name: "node-a"}, false},
		{agentSA, access{verb: "patch", resource: "nodes", subresource: "status", name: "node-a"}, false},
		{agentSA, access{verb: "create", group: "coordination.k8s.io", resource: "leases", namespace: namespace}, true},
		{agentSA, access{verb: "update", group: "coordination.k8s.io", resource: "leases", namespace: namespace, name: "coroner-agent-node-a"}, true},
		{agentSA, access{verb: "create", group: "coordination.k8s.io", resource: "leases", namespace: other}, false},
		{agentSA, access{verb: "create", group: "coordination.k8s.io", resource: "leases", namespace: "kube-node-lease"}, false},
		// Its kubelet's heartbeat, which it fences on (--fence-signal=node-lease): read only.
		{agentSA, access{verb: "watch", group: "coordination.k8s.io", resource: "leases", namespace: "kube-node-lease"}, true},
		{agentSA, access{verb: "get", group: "coordination.k8s.io", resource: "leases", namespace: "kube-node-lease", name: "node-a"}, true},
		{agentSA, access{verb: "update", group: "coordination.k8s.io", resource: "leases", namespace: "kube-node-lease", name: "node-a"}, false},
		{agentSA, access{verb: "delete", group: "coordination.k8s.io", resource: "leases", namespace: namespace}, false},
		{agentSA, access{verb: "get", group: "batch", resource: "jobs", namespace: other}, false},
		{agentSA, access{verb: "update", group: "batch", resource: "jobs", namespace: other}, false},
		{agentSA, access{verb: "update", group: "batch", resource: "jobs", subresource: "status", namespace: other}, false},

		// The shim: Jobs (status only), their pods, nodes read-only, events, its leader Lease.
		{shimSA, access{verb: "list", group: "batch", resource: "jobs"}, true},
		{shimSA, access{verb: "watch", group: "batch", resource: "jobs"}, true},
		{shimSA, access{verb: "update", group: "batch", resource: "jobs", subresource: "status", namespace: other}, true},
		{shimSA, access{verb: "patch", group: "batch", resource: "jobs", subresource: "status", namespace: other}, true},
		{shimSA, access{verb: "update", group: "batch", resource: "jobs", subresource: "finalizers", namespace: other}, true},
		{shimSA, access{verb: "update", group: "batch", resource: "jobs", namespace: other}, false},
		{shimSA, access{verb: "patch", group: "batch", resource: "jobs", namespace: other}, false},
		{shimSA, access{verb: "create", group: "batch", resource: "jobs", namespace: other}, false},
		{shimSA, access{verb: "delete", group: "batch", resource: "jobs", namespace: other}, false},
		{shimSA, access{verb: "create", resource: "pods", namespace: other}, true},
		{shimSA, access{verb: "delete", resource: "pods", namespace: other}, true},
		{shimSA, access{verb: "patch", resource: "pods", namespace: other}, true},
		{shimSA, access{verb: "patch", resource: "pods", subresource: "status", namespace: other}, true},
		{shimSA, access{verb: "update", resource: "pods", namespace: other}, false},
		{shimSA, access{verb: "create", resource: "pods", subresource: "eviction", namespace: other}, false},
		{shimSA, access{verb: "create", resource: "pods", subresource: "exec", namespace: other}, false},
		{shimSA, access{verb: "watch", resource: "nodes"}, true},
		// Nodes: patch for the quarantine taint only (the policy coroner-shim-node-quarantine
		// narrows it to that taint); no update, status, create or delete.
		{shimSA, access{verb: "patch", resource: "nodes", name: "node-a"}, true},
		{shimSA, access{verb: "update", resource: "nodes", name: "node-a"}, false},
		{shimSA, access{verb: "patch", resource: "nodes", subresource: "status", name: "node-a"}, false},
		{shimSA, access{verb: "create", resource: "nodes"}, false},
		{shimSA, access{verb: "delete", resource: "nodes", name: "node-a"}, false},
		{shimSA, access{verb: "create", resource: "events", namespace: other}, true},
		{shimSA, access{verb: "create", group: "coordination.k8s.io", resource: "leases", namespace: namespace}, true},
		{shimSA, access{verb: "update", group: "coordination.k8s.io", resource: "leases", namespace: namespace, name: "coroner-shim"}, true},
		{shimSA, access{verb: "update", group: "coordination.k8s.io", resource: "leases", namespace: namespace, name: "coroner-agent-node-a"}, false},
		{shimSA, access{verb: "watch", group: "coordination.k8s.io", resource: "leases", namespace: namespace}, true},
		{shimSA, access{verb: "create", group: "coordination.k8s.io", resource: "leases", namespace: other}, false},
		// A node's kubelet Lease, read when its agent fences on it: get only.
		{shimSA, access{verb: "get", group: "coordination.k8s.io", resource: "leases", namespace: "kube-node-lease", name: "node-a"}, true},
		{shimSA, access{verb: "watch", group: "coordination.k8s.io", resource: "leases", namespace: "kube-node-lease"}, false},
		{shimSA, access{verb: "update", group: "coordination.k8s.io", resource: "leases", namespace: "kube-node-lease", name: "node-a"}, false},
	}
	// Neither reads Secrets or ConfigMaps, in its own namespace or elsewhere, nor touches RBAC
	// or admission configuration.
	for _, sa := range []string{agentSA, shimSA} {
		for _, ns := range []string{namespace, other, ""} {
			for _, verb := range []string{"get", "list", "watch"} {
				cases = append(cases,
					sarCase{sa, access{verb: verb, resource: "secrets", namespace: ns}, false},
					sarCase{sa, access{verb: verb, resource: "configmaps", namespace: ns}, false})
			}
		}
		for _, a := range []access{
			{verb: "create", resource: "serviceaccounts", subresource: "token", namespace: namespace, name: sa},
			{verb: "escalate", group: "rbac.authorization.k8s.io", resource: "clusterroles"},
			{verb: "bind", group: "rbac.authorization.k8s.io", resource: "clusterroles"},
			{verb: "update", group: "rbac.authorization.k8s.io", resource: "clusterroles", name: sa},
			{verb: "delete", group: "admissionregistration.k8s.io", resource: "validatingadmissionpolicies", name: policyName},
			{verb: "delete", group: "admissionregistration.k8s.io", resource: "validatingadmissionpolicybindings", name: policyName},
			{verb: "delete", group: "admissionregistration.k8s.io", resource: "validatingadmissionpolicies", name: shimPolicyName},
			{verb: "delete", group: "admissionregistration.k8s.io", resource: "validatingadmissionpolicybindings", name: shimPolicyName},
			{verb: "delete", group: "admissionregistration.k8s.io", resource: "validatingadmissionpolicies", name: nodePolicyName},
			{verb: "delete", group: "admissionregistration.k8s.io", resource: "validatingadmissionpolicybindings", name: nodePolicyName},
			{verb: "impersonate", resource: "serviceaccounts", namespace: namespace},
		} {
			cases = append(cases, sarCase{sa, a, false})
		}
	}

	ctx := context.Background()
	for _, tc := range cases {
		a := tc.a
		name := fmt.Sprintf("%s %s %s/%s", tc.sa, a.verb, a.resource, a.subresource)
		if a.group != "" {
			name = fmt.Sprintf("%s %s %s.%s/%s", tc.sa, a.verb, a.resource, a.group, a.subresource)
		}
		if a.namespace != "" {
			name += " in " + a.namespace
		}
		t.Run(name, func(t *testing.T) {
			sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User:   "system:serviceaccount:" + namespace + ":" + tc.sa,
				Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
				ResourceAttributes: &authorizationv1.ResourceAttributes{
					Verb: a.verb, Group: a.group, Resource: a.resource, Subresource: a.subresource,
					Namespace: a.namespace, Name: a.name,
				},
			}}
			got, err := client.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got.Status.Allowed != tc.allow {
				t.Errorf("allowed = %v, want %v (reason %q)", got.Status.Allowed, tc.allow, got.Status.Reason)
			}
		})
	}
}
