package conditions

import (
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
)

// The agent's node Lease (A6) and what the shim concludes from it (Z2).
//
// Each agent with --fencing renews the Lease coroner-agent-<node> in its own namespace
// (coroner-system): spec.holderIdentity is the node, spec.renewTime the agent's last
// successful renewal, spec.leaseDurationSeconds its --fence-after in whole seconds, and
// the annotation AnnotationFenceAfter its --fence-after exactly. An agent that has not
// renewed for --fence-after stops the containers of the opted-in pods of its node
// (OptedInToForcefulDeletion) and keeps them stopped until it reaches the API server
// again; then it records AnnotationFencedAt on the Lease and an EventReasonFenced Event
// on the Node.
//
// The shim cannot hear from a partitioned agent, so it reasons from the Lease alone: once
// renewTime + fence-after + a margin (the agents' clock skew, their relist period, the
// time to stop containers) has passed, the agent has fenced, or the whole node is down;
// either way the opted-in pods of the node no longer run, and the shim may recover them
// without waiting (NodeFenced). An agent that is itself down on a running node would be
// taken for fenced: the DaemonSet restarts it, and the shim also requires the node to be
// tainted unreachable, that is its kubelet silent too.
const (
	// AgentLeasePrefix prefixes the node name in the agent's Lease name.
	AgentLeasePrefix = "coroner-agent-"
	// AnnotationFenceAfter (on the agent's Lease) is the agent's --fence-after as a Go
	// duration ("45s"); absent when the agent does not fence (an agent started without
	// --fencing takes it off the Lease an earlier one left).
	AnnotationFenceAfter = Prefix + "fence-after"
	// AnnotationFencedAt (on the agent's Lease) is when the agent last fenced its node,
	// RFC 3339; written once it can reach the API server again, for the record.
	AnnotationFencedAt = Prefix + "fenced-at"
)

// AgentLeaseName is the name of the agent's Lease for a node.
func AgentLeaseName(node string) string { return AgentLeasePrefix + node }

// FenceState is what a node's agent Lease says at some time.
type FenceState struct {
	// Fenced: the node's opted-in pods are known not to run any more.
	Fenced bool
	// Since is when the agent fenced (or at the latest would have), when Fenced.
	Since time.Time
	// Why says how the state was concluded, for messages.
	Why string
}

// NodeFenced reads a node's agent Lease (nil when there is none) at now: the node counts
// as fenced once the Lease has gone unrenewed for the agent's fence-after plus margin.
func NodeFenced(lease *coordinationv1.Lease, now time.Time, margin time.Duration) FenceState {
	if lease == nil {
		return FenceState{Why: "the node's agent has no Lease (fencing off)"}
	}
	v, ok := lease.Annotations[AnnotationFenceAfter]
	if !ok {
		return FenceState{Why: "the node's agent does not fence (no " + AnnotationFenceAfter + " on its Lease)"}
	}
	fenceAfter, ok := leaseFenceAfter(lease)
	if !ok {
		return FenceState{Why: fmt.Sprintf("the agent's Lease has an invalid %s %q", AnnotationFenceAfter, v)}
	}
	if lease.Spec.RenewTime == nil {
		return FenceState{Why: "the agent's Lease was never renewed"}
	}
	renewed := lease.Spec.RenewTime.Time
	if deadline, _ := FenceDeadline(lease, margin); now.Before(deadline) {
		return FenceState{Why: fmt.Sprintf("the agent's Lease was renewed %v ago (it fences after %v, plus a margin of %v)",
			now.Sub(renewed).Round(time.Second), fenceAfter, margin)}
	}
	return FenceState{Fenced: true, Since: renewed.Add(fenceAfter), Why: fmt.Sprintf("the node's agent has not renewed its Lease for %v: it fenced the node after %v",
		now.Sub(renewed).Round(time.Second), fenceAfter)}
}

// FenceDeadline is when NodeFenced turns true for the Lease, if ever (false when the
// agent does not fence), so that a caller can come back at that time.
func FenceDeadline(lease *coordinationv1.Lease, margin time.Duration) (time.Time, bool) {
	fenceAfter, ok := leaseFenceAfter(lease)
	if !ok || lease.Spec.RenewTime == nil {
		return time.Time{}, false
	}
	return lease.Spec.RenewTime.Add(fenceAfter + margin), true
}

// leaseFenceAfter is the agent's fence-after from its Lease; false when the Lease has none
// or an invalid one.
func leaseFenceAfter(lease *coordinationv1.Lease) (time.Duration, bool) {
	if lease == nil {
		return 0, false
	}
	d, err := time.ParseDuration(lease.Annotations[AnnotationFenceAfter])
	return d, err == nil && d > 0
}
