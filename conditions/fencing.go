package conditions

import (
	"fmt"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// The agent's node Lease (A6) and what the shim concludes from it (Z2).
//
// Each agent with --fencing keeps the Lease coroner-agent-<node> in its own namespace
// (coroner-system), spec.holderIdentity the node. It says, by which annotation it carries,
// what the agent fences on:
//
//   - AnnotationFenceOnNodeLease (--fence-signal=node-lease, the default): the agent
//     watches its kubelet's own heartbeat, the Lease <node> in kube-node-lease
//     (NodeLeaseNamespace), which the kubelet renews every 10 s, and fences when that
//     Lease's renewTime is more than fence-after old: its kubelet has lost the API server
//     (or the agent has; or the kubelet is down, whose pods the control plane replaces
//     anyway). The agent writes its own Lease only when it starts and when a fence ends, so
//     it adds no write at rest. The kubelet and the agent read one clock (the node's), so
//     the agent fences at the very renewTime + fence-after the shim computes; a renewal the
//     agent did not see makes it fence earlier, never later. AnnotationAgentPod names the
//     agent's pod: a dead agent fences nothing, so the shim trusts the fence only if that
//     pod was ready when the kubelet was last heard from (AgentAlive).
//   - AnnotationFenceAfter (--fence-signal=agent-lease, the first design): the agent
//     renews its own Lease every fence-after/4 (at most 10 s) and fences when it has not
//     renewed it for fence-after. spec.renewTime is its last renewal.
//
// Either way the agent stops the containers of the opted-in pods of its node
// (OptedInToForcefulDeletion) and keeps them stopped until it hears from the API server
// again; then it records AnnotationFencedAt on its Lease and an EventReasonFenced Event on
// the Node.
//
// The shim cannot hear from a partitioned agent, so it reasons from what it can read
// (FenceEvidence): once the heartbeat's renewTime + fence-after + a margin (the clock skew
// between the node and the shim, the agent's check period, the time to stop containers)
// has passed, the agent has fenced, or the whole node is down; either way the opted-in pods
// of the node no longer run, and the shim may recover them without waiting (NodeFenced).
// The shim also requires the node to be tainted unreachable, that is its kubelet silent.
// With the first design an agent that is itself down on a running node is taken for
// fenced (the DaemonSet restarts it); with the node Lease, AgentAlive guards that case.
//
// A shim older than AnnotationFenceOnNodeLease finds no AnnotationFenceAfter on such a
// Lease and reads "the node's agent does not fence": it waits for the zombie threshold,
// which is safe.
const (
	// AgentLeasePrefix prefixes the node name in the agent's Lease name.
	AgentLeasePrefix = "coroner-agent-"
	// AnnotationFenceAfter (on the agent's Lease) is the agent's --fence-after as a Go
	// duration ("45s") when it fences on its own Lease's renewals
	// (--fence-signal=agent-lease); absent otherwise (an agent started without --fencing
	// takes it off the Lease an earlier one left).
	AnnotationFenceAfter = Prefix + "fence-after"
	// AnnotationFenceOnNodeLease (on the agent's Lease) is the agent's --fence-after as a
	// Go duration when it fences on its kubelet's node Lease (--fence-signal=node-lease);
	// absent otherwise.
	AnnotationFenceOnNodeLease = Prefix + "fence-on-node-lease"
	// AnnotationAgentPod (on the agent's Lease) is the agent's pod, "<namespace>/<name>",
	// as of the agent's start.
	AnnotationAgentPod = Prefix + "agent-pod"
	// AnnotationFencedAt (on the agent's Lease) is when the agent last fenced its node,
	// RFC 3339; written once it can reach the API server again, for the record.
	AnnotationFencedAt = Prefix + "fenced-at"
	// NodeLeaseNamespace holds the kubelets' node Leases, each named after its node.
	NodeLeaseNamespace = "kube-node-lease"
)

// The values of the agent's --fence-signal: what it fences on.
const (
	FenceSignalNodeLease  = "node-lease"
	FenceSignalAgentLease = "agent-lease"
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

// FenceEvidence is what the shim reads about a node to tell whether its agent has fenced.
type FenceEvidence struct {
	// Node is the node's name.
	Node string
	// Agent is the node's agent Lease (AgentLeaseName); nil when there is none.
	Agent *coordinationv1.Lease
	// NodeLease is the kubelet's Lease (NodeLeaseNamespace/Node); nil when not read or
	// missing. Read only when the agent fences on it (FencesOnNodeLease).
	NodeLease *coordinationv1.Lease
	// AgentPod is the pod AnnotationAgentPod names; nil when not read or missing. Read only
	// when the agent fences on the node Lease.
	AgentPod *corev1.Pod
}

// FencesOnNodeLease reports whether the agent's Lease says its agent fences on its
// kubelet's node Lease, and with which fence-after: the caller then reads the node Lease
// and the agent's pod (AgentPodName) into the FenceEvidence.
func FencesOnNodeLease(agent *coordinationv1.Lease) (time.Duration, bool) {
	return annotatedDuration(agent, AnnotationFenceOnNodeLease)
}

// AgentPodName is the agent's pod that its Lease names (AnnotationAgentPod); false when
// none or malformed.
func AgentPodName(agent *coordinationv1.Lease) (types.NamespacedName, bool) {
	if agent == nil {
		return types.NamespacedName{}, false
	}
	ns, name, ok := strings.Cut(agent.Annotations[AnnotationAgentPod], "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return types.NamespacedName{}, false
	}
	return types.NamespacedName{Namespace: ns, Name: name}, true
}

// AgentAlive reports whether the agent's pod was running and ready on node when its
// kubelet was last heard from (heard, the node Lease's renewTime), and says why not:
// phase Running, not being deleted, and the Ready condition True, or False with no reason
// and a transition at or after heard. The node lifecycle controller marks every pod of a
// node it has stopped hearing from not ready, keeping the reason of the kubelet's
// Ready=True (none); the kubelet's own Ready=False always has one (ContainersNotReady,
// PodCompleted, ReadinessGatesNotReady). An agent that died less than a readiness probe
// period (10 s) before the partition can still read as alive: the residual case, in which
// the shim recovers the pods at the deadline though nothing stopped them.
func AgentAlive(pod *corev1.Pod, node string, heard time.Time) (bool, string) {
	switch {
	case pod == nil:
		return false, "the agent's pod is not found"
	case pod.Spec.NodeName != node:
		return false, fmt.Sprintf("the agent's pod %s/%s is not on node %s", pod.Namespace, pod.Name, node)
	case pod.DeletionTimestamp != nil:
		return false, fmt.Sprintf("the agent's pod %s/%s is being deleted", pod.Namespace, pod.Name)
	case pod.Status.Phase != corev1.PodRunning:
		return false, fmt.Sprintf("the agent's pod %s/%s is %s", pod.Namespace, pod.Name, pod.Status.Phase)
	}
	ready := Find(&pod.Status, corev1.PodReady)
	switch {
	case ready == nil:
		return false, fmt.Sprintf("the agent's pod %s/%s has no Ready condition", pod.Namespace, pod.Name)
	case ready.Status == corev1.ConditionTrue:
		return true, ""
	case ready.Status == corev1.ConditionFalse && ready.Reason == "" && !ready.LastTransitionTime.Time.Before(heard):
		return true, "" // the node lifecycle controller's mark, after the kubelet went silent
	}
	return false, fmt.Sprintf("the agent's pod %s/%s was not ready when its kubelet was last heard from (Ready=%s, reason %q)",
		pod.Namespace, pod.Name, ready.Status, ready.Reason)
}

// NodeFenced reads what the shim knows of a node at now: the node counts as fenced once
// the agent's heartbeat (its own Lease's renewals, or its kubelet's node Lease's with a
// live agent) has been silent for the agent's fence-after plus margin.
func NodeFenced(ev FenceEvidence, now time.Time, margin time.Duration) FenceState {
	deadline, heard, fenceAfter, why := fenceDeadline(ev, margin)
	if deadline.IsZero() {
		return FenceState{Why: why}
	}
	if now.Before(deadline) {
		return FenceState{Why: fmt.Sprintf("%s was renewed %v ago (the agent fences after %v, plus a margin of %v)",
			why, now.Sub(heard).Round(time.Second), fenceAfter, margin)}
	}
	return FenceState{Fenced: true, Since: heard.Add(fenceAfter), Why: fmt.Sprintf("%s has not been renewed for %v: the node's agent fenced the node after %v",
		why, now.Sub(heard).Round(time.Second), fenceAfter)}
}

// FenceDeadline is when NodeFenced turns true for ev, if ever (false when the agent does
// not fence, or its fence cannot be trusted), so that a caller can come back at that time.
func FenceDeadline(ev FenceEvidence, margin time.Duration) (time.Time, bool) {
	deadline, _, _, _ := fenceDeadline(ev, margin)
	return deadline, !deadline.IsZero()
}

// fenceDeadline is NodeFenced's reading of ev: the deadline (zero when there is none, and
// why not), the heartbeat's renewTime, the fence-after, and which heartbeat it read.
func fenceDeadline(ev FenceEvidence, margin time.Duration) (deadline, heard time.Time, fenceAfter time.Duration, why string) {
	lease := ev.Agent
	if lease == nil {
		return time.Time{}, time.Time{}, 0, "the node's agent has no Lease (fencing off)"
	}
	if v, ok := lease.Annotations[AnnotationFenceOnNodeLease]; ok {
		fenceAfter, ok := FencesOnNodeLease(lease)
		if !ok {
			return time.Time{}, time.Time{}, 0, fmt.Sprintf("the agent's Lease has an invalid %s %q", AnnotationFenceOnNodeLease, v)
		}
		if ev.NodeLease == nil || ev.NodeLease.Spec.RenewTime == nil {
			return time.Time{}, time.Time{}, 0, fmt.Sprintf("the kubelet's Lease %s/%s is not known or was never renewed", NodeLeaseNamespace, ev.Node)
		}
		heard := ev.NodeLease.Spec.RenewTime.Time
		if alive, whyNot := AgentAlive(ev.AgentPod, ev.Node, heard); !alive {
			return time.Time{}, time.Time{}, 0, "the node's agent cannot be trusted to have fenced: " + whyNot
		}
		return heard.Add(fenceAfter + margin), heard, fenceAfter, "the kubelet's Lease " + NodeLeaseNamespace + "/" + ev.Node
	}
	v, ok := lease.Annotations[AnnotationFenceAfter]
	if !ok {
		return time.Time{}, time.Time{}, 0, "the node's agent does not fence (neither " + AnnotationFenceOnNodeLease + " nor " + AnnotationFenceAfter + " on its Lease)"
	}
	fenceAfter, ok = annotatedDuration(lease, AnnotationFenceAfter)
	if !ok {
		return time.Time{}, time.Time{}, 0, fmt.Sprintf("the agent's Lease has an invalid %s %q", AnnotationFenceAfter, v)
	}
	if lease.Spec.RenewTime == nil {
		return time.Time{}, time.Time{}, 0, "the agent's Lease was never renewed"
	}
	heard = lease.Spec.RenewTime.Time
	return heard.Add(fenceAfter + margin), heard, fenceAfter, "the agent's Lease"
}

// annotatedDuration is the positive duration in the Lease's annotation key; false when
// the Lease has none or an invalid one.
func annotatedDuration(lease *coordinationv1.Lease, key string) (time.Duration, bool) {
	if lease == nil {
		return 0, false
	}
	v, ok := lease.Annotations[key]
	if !ok {
		return 0, false
	}
	d, err := time.ParseDuration(v)
	return d, err == nil && d > 0
}
