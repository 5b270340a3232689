// Package recovery decides what the shim does about the pods that a node failure left
// behind (requirements Z1-Z4). Decide is a pure function of a pod, its node,
// the node's agent Lease and a time; the controller carries the Decision out (one status
// write, an Event, a forced deletion) and comes back at Decision.RequeueAfter.
//
// The cases, in the order Decide checks them:
//
//   - Orphan (Z3): the pod is bound to a node that no longer exists (the caller has
//     confirmed it with the API server, not only its cache) and has not come back for
//     OrphanQuarantine (a node deleted and registered again by its kubelet keeps its
//     pods, as with kube-controller-manager's pod GC, whose quarantine is 40 s). Phase Failed with
//     DisruptionTarget reason DeletionByPodGC (as kube-controller-manager's pod GC does
//     after its quarantine) and ForcefullyTerminated reason NodeDeleted, then deleted.
//
//   - Fenced (Z2): the pod is opted in (conditions.OptedInToForcefulDeletion), still
//     Pending or Running, its node is tainted node.kubernetes.io/unreachable, and the
//     node's agent has fenced by what the shim can read (conditions.NodeFenced: the agent's
//     Lease, and its kubelet's node Lease and the agent's pod when it fences on that): its containers
//     are stopped, so the pod is recovered at once, being deleted or not (without waiting
//     for the taint manager's eviction after the pod's toleration, 300 s by default).
//
//   - Zombie (Z1): the pod is opted in, Pending or Running, being deleted, on a node
//     tainted unreachable, and deletionTimestamp + Threshold has passed: nobody can
//     confirm its containers stopped, but its owner said that is acceptable.
//
//   - Stale disruption (Z4): DisruptionTarget=True for over StaleAfter on a pod that is
//     neither being deleted nor terminal (an eviction or preemption that did not happen):
//     the condition is set to False, so that a podFailurePolicy does not later take a
//     real failure of the pod for a disruption.
//
//   - Terminal left behind: the pod is opted in, already Failed or Succeeded (its containers
//     stopped: the kubelet, the agent or a recovery said so), being deleted, and its node is
//     tainted unreachable, so no kubelet will ever confirm the deletion: it is force-deleted
//     at once (Action DeleteTerminal), as newer Kueue releases do. (The API server deletes a
//     pod that is terminal when its deletion is asked for at once; such a pod became terminal
//     after its deletion began: its kubelet's last status before the partition, or a
//     controller such as Kueue's failure recovery, which fails pods without deleting them.)
//
// Which pods: every case applies to the pods of the Jobs the shim manages. Pods of anything
// else (a built-in Job, a JobSet's Jobs, a bare pod, ...) are covered only when the shim is
// told to recover every opted-in pod (Input.OptedInOnly), as Kueue's failure recovery does,
// and then only for what the opt-in allows: Fenced, Zombie and Terminal left behind. Orphans
// (Z3) are left to kube-controller-manager's pod GC and stale DisruptionTargets (Z4) to the
// pod's own controller: neither needs the owner's consent to a second copy, and the shim does
// not second-guess other controllers.
//
// A recovered pod gets phase Failed, the condition coroner.dev/ForcefullyTerminated (what
// coroner did, reason NodeUnreachable or NodeFenced) and, unless it has one already,
// DisruptionTarget=True with the same reason (why it died: a node failure is a
// disruption, so that `Ignore on DisruptionTarget` rules replace the pod without
// counting it), and is then force-deleted (grace period 0). A recovered pod that is still
// there and was not force-deleted yet (the deletion failed after the status write) is
// deleted again: Action FinishDeletion.
package recovery

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/coroner-dev/coroner/conditions"
)

// Defaults of Config.
const (
	DefaultThreshold   = 60 * time.Second
	DefaultFenceMargin = 15 * time.Second
	DefaultStaleAfter  = 2 * time.Minute
	// DefaultOrphanQuarantine is kube-controller-manager's pod GC quarantine.
	DefaultOrphanQuarantine = 40 * time.Second
)

// Config holds the times Decide works with.
type Config struct {
	// Threshold is how long after its deletionTimestamp a zombie pod is recovered (Z1).
	Threshold time.Duration
	// FenceMargin is added to the agent's fence-after before its silence counts as
	// fenced (Z2): clock skew between the agent and the shim, the agent's relist period,
	// the time to stop containers.
	FenceMargin time.Duration
	// StaleAfter is how long a DisruptionTarget may stay True on a pod that is not
	// deleted (Z4).
	StaleAfter time.Duration
	// OrphanQuarantine is how long a pod's node must have been missing before the pod
	// counts as an orphan (Z3).
	OrphanQuarantine time.Duration
}

// Input is what Decide looks at.
type Input struct {
	Pod *corev1.Pod
	// Node is the pod's node; nil when it is not bound or the node is not known.
	Node *corev1.Node
	// NodeGone says the API server confirmed that the pod's node does not exist;
	// NodeMissingFor is for how long it has been missing as far as the caller knows.
	NodeGone       bool
	NodeMissingFor time.Duration
	// Fence is what is known of the node's agent and its heartbeat
	// (conditions.FenceEvidence): its Lease (conditions.AgentLeaseName), nil when none,
	// and, when the agent fences on its kubelet's node Lease, that Lease and the agent's pod.
	Fence conditions.FenceEvidence
	Now   time.Time
	// OptedInOnly says the pod is not of a Job the shim manages: only the cases its opt-in
	// annotation allows apply (Z1, Z2, the deletion of a terminal pod), and nothing at all
	// without the annotation.
	OptedInOnly bool
}

// Action is what to do with a pod.
type Action string

const (
	None            Action = ""
	FailOrphan      Action = "FailOrphan"      // Z3
	ForceTerminate  Action = "ForceTerminate"  // Z1, Z2
	ClearDisruption Action = "ClearDisruption" // Z4
	// FinishDeletion force-deletes a pod recovered earlier whose deletion did not happen.
	FinishDeletion Action = "FinishDeletion"
	// DeleteTerminal force-deletes an opted-in pod that is terminal and being deleted on an
	// unreachable node: nothing to write, its containers have stopped, but no kubelet will
	// confirm the deletion.
	DeleteTerminal Action = "DeleteTerminal"
)

// EventReasonForcefullyDeleted is the reason of the Warning Event on a pod deleted by
// DeleteTerminal. (It belongs with the other Event reasons in package conditions; it is
// here until that package, owned elsewhere, takes it.)
const EventReasonForcefullyDeleted = "ForcefullyDeleted"

// Decision is what Decide decided.
type Decision struct {
	Action Action
	// Conditions to write: with phase Failed for FailOrphan and ForceTerminate, alone for
	// ClearDisruption.
	Conditions []corev1.PodCondition
	// Reason and Message of the Warning Event on the pod and its Job (ForceTerminate,
	// FailOrphan, DeleteTerminal), or the Normal one (ClearDisruption).
	Reason, Message string
	// Delete says to force-delete the pod after the status write.
	Delete bool
	// RequeueAfter is when to look at the pod again (0: only on a change).
	RequeueAfter time.Duration
}

// Decide says what to do about the pod.
func (c Config) Decide(in Input) Decision {
	c = c.withDefaults()
	p := in.Pod
	if p == nil {
		return Decision{}
	}
	optedIn := conditions.OptedInToForcefulDeletion(p.Annotations)
	if in.OptedInOnly && !optedIn {
		return Decision{}
	}
	if conditions.IsTerminalPhase(p.Status.Phase) {
		if recoveredNotDeleted(p) {
			return Decision{Action: FinishDeletion, Delete: true}
		}
		if in.Node != nil && unreachable(in.Node) && terminalLeftBehind(p) {
			msg := fmt.Sprintf("pod %s/%s: phase %s, being deleted on node %s, which is unreachable: force-deleted (opted in by %s)",
				p.Namespace, p.Name, p.Status.Phase, in.Node.Name, optInAnnotation(p))
			return Decision{Action: DeleteTerminal, Reason: EventReasonForcefullyDeleted, Message: msg, Delete: true}
		}
		return Decision{}
	}
	if in.OptedInOnly {
		in.NodeGone = false // Z3 is pod GC's for pods not of managed Jobs
	}
	if in.NodeGone && p.Spec.NodeName != "" && in.NodeMissingFor < c.OrphanQuarantine {
		return Decision{RequeueAfter: c.OrphanQuarantine - in.NodeMissingFor}
	}
	if in.NodeGone && p.Spec.NodeName != "" {
		msg := fmt.Sprintf("node %s no longer exists: the pod is failed and deleted", p.Spec.NodeName)
		conds := []corev1.PodCondition{{Type: conditions.ForcefullyTerminated, Status: corev1.ConditionTrue,
			Reason: conditions.ReasonNodeDeleted, Message: "Pod forcefully terminated: " + msg}}
		if !conditions.IsTrue(&p.Status, corev1.DisruptionTarget) {
			conds = append(conds, corev1.PodCondition{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue,
				Reason: conditions.ReasonDeletionByPodGC, Message: "coroner-shim: " + msg})
		}
		return Decision{Action: FailOrphan, Conditions: conds, Reason: conditions.EventReasonForcefullyTerminated,
			Message: fmt.Sprintf("pod %s/%s: %s", p.Namespace, p.Name, msg), Delete: true}
	}

	var next time.Duration
	later := func(d time.Duration) {
		if d > 0 && (next == 0 || d < next) {
			next = d
		}
	}
	if in.Node != nil && unreachable(in.Node) && optedIn {
		optIn := optInAnnotation(p)
		if fs := conditions.NodeFenced(in.Fence, in.Now, c.FenceMargin); fs.Fenced {
			msg := fmt.Sprintf("Pod forcefully terminated: node %s is unreachable and fenced (%s; opted in by %s)", in.Node.Name, fs.Why, optIn)
			return c.forceTerminate(p, conditions.ReasonNodeFenced, msg)
		} else if deadline, ok := conditions.FenceDeadline(in.Fence, c.FenceMargin); ok {
			later(deadline.Sub(in.Now))
		}
		if p.DeletionTimestamp != nil {
			deadline := p.DeletionTimestamp.Add(c.Threshold)
			if !in.Now.Before(deadline) {
				msg := fmt.Sprintf("Pod forcefully terminated after %v: node %s is unreachable (opted in by %s)",
					in.Now.Sub(p.DeletionTimestamp.Time).Round(time.Second), in.Node.Name, optIn)
				return c.forceTerminate(p, conditions.ReasonNodeUnreachable, msg)
			}
			later(deadline.Sub(in.Now))
		}
	}

	if dt := conditions.Find(&p.Status, corev1.DisruptionTarget); !in.OptedInOnly && dt != nil && dt.Status == corev1.ConditionTrue && p.DeletionTimestamp == nil {
		deadline := dt.LastTransitionTime.Add(c.StaleAfter)
		if !in.Now.Before(deadline) {
			msg := fmt.Sprintf("DisruptionTarget (%s) cleared: the pod was not deleted within %v of it", dt.Reason, c.StaleAfter)
			return Decision{Action: ClearDisruption, Reason: conditions.ReasonStaleDisruptionTarget,
				Message: fmt.Sprintf("pod %s/%s: %s", p.Namespace, p.Name, msg),
				Conditions: []corev1.PodCondition{{Type: corev1.DisruptionTarget, Status: corev1.ConditionFalse,
					Reason: conditions.ReasonStaleDisruptionTarget, Message: "coroner-shim: " + msg}}}
		}
		later(deadline.Sub(in.Now))
	}
	return Decision{RequeueAfter: next}
}

func (c Config) forceTerminate(p *corev1.Pod, reason, msg string) Decision {
	conds := []corev1.PodCondition{{Type: conditions.ForcefullyTerminated, Status: corev1.ConditionTrue, Reason: reason, Message: msg}}
	if !conditions.IsTrue(&p.Status, corev1.DisruptionTarget) {
		conds = append(conds, corev1.PodCondition{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: reason, Message: "coroner-shim: " + msg})
	}
	return Decision{Action: ForceTerminate, Conditions: conds, Reason: conditions.EventReasonForcefullyTerminated,
		Message: fmt.Sprintf("pod %s/%s: %s", p.Namespace, p.Name, msg), Delete: true}
}

func (c Config) withDefaults() Config {
	if c.Threshold <= 0 {
		c.Threshold = DefaultThreshold
	}
	if c.FenceMargin <= 0 {
		c.FenceMargin = DefaultFenceMargin
	}
	if c.StaleAfter <= 0 {
		c.StaleAfter = DefaultStaleAfter
	}
	if c.OrphanQuarantine <= 0 {
		c.OrphanQuarantine = DefaultOrphanQuarantine
	}
	return c
}

// FenceMatters reports whether Decide may read the fence of the pod's node (Input.Fence):
// the pod is opted in and not terminal. A caller reads the node's heartbeat only then.
func FenceMatters(p *corev1.Pod) bool {
	return p != nil && conditions.OptedInToForcefulDeletion(p.Annotations) && !conditions.IsTerminalPhase(p.Status.Phase)
}

// unreachable reports whether the node has the node.kubernetes.io/unreachable taint
// (NoSchedule or NoExecute: the node controller adds both).
func unreachable(n *corev1.Node) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == corev1.TaintNodeUnreachable {
			return true
		}
	}
	return false
}

// optInAnnotation names the annotation that opted the pod in.
func optInAnnotation(p *corev1.Pod) string {
	for _, k := range conditions.SafeToForcefullyDeleteAnnotations {
		if p.Annotations[k] == "true" {
			return k
		}
	}
	return ""
}

// recoveredNotDeleted: the shim recovered the pod (ForcefullyTerminated=True) but has not
// force-deleted it yet (a deletion with grace period 0 leaves deletionGracePeriodSeconds 0
// while finalizers keep the object).
func recoveredNotDeleted(p *corev1.Pod) bool {
	if !conditions.IsTrue(&p.Status, conditions.ForcefullyTerminated) {
		return false
	}
	return p.DeletionTimestamp == nil || p.DeletionGracePeriodSeconds == nil || *p.DeletionGracePeriodSeconds != 0
}

// terminalLeftBehind: the terminal pod is opted in and being deleted, and has not been
// force-deleted yet (grace period 0, kept only by finalizers).
func terminalLeftBehind(p *corev1.Pod) bool {
	return p.DeletionTimestamp != nil && conditions.OptedInToForcefulDeletion(p.Annotations) &&
		(p.DeletionGracePeriodSeconds == nil || *p.DeletionGracePeriodSeconds != 0)
}

// Relevant reports whether a change of the pod may change Decide's answer, so that
// event handlers enqueue only those pods: bound and not terminal, and being deleted, opted
// in or carrying DisruptionTarget=True; or terminal and recovered but not deleted yet, or
// opted in and being deleted. With optedInOnly (a pod not of a managed Job, see
// Input.OptedInOnly) only opted-in pods are.
func Relevant(p *corev1.Pod, optedInOnly bool) bool {
	if p == nil || p.Spec.NodeName == "" {
		return false
	}
	optedIn := conditions.OptedInToForcefulDeletion(p.Annotations)
	if optedInOnly && !optedIn {
		return false
	}
	if conditions.IsTerminalPhase(p.Status.Phase) {
		return recoveredNotDeleted(p) || terminalLeftBehind(p)
	}
	return p.DeletionTimestamp != nil || optedIn || conditions.IsTrue(&p.Status, corev1.DisruptionTarget)
}
