package conditions

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// DisruptionClass sorts a failed pod's cause of death into the few kinds an operator
// budgets and blames by: the classes of coroner.dev/disruption-budget, the cause label of
// the node-blame metrics and the value of the coroner.dev/quarantined taint. The names
// are part of the annotations' format and of the docs (docs/choices.md, "Which deaths
// blame a node").
type DisruptionClass string

const (
	// DisruptionDevice: killed by a failing device (CauseDevice), including a pod the
	// kubelet refused at admission because its device turned Unhealthy (the agent stamps
	// both DeviceFailure). Blames the node.
	DisruptionDevice DisruptionClass = "device"
	// DisruptionNodeOOM: killed by the node's OOM killer, not over its own limit
	// (CauseNodeOOM). Blames the node.
	DisruptionNodeOOM DisruptionClass = "node-oom"
	// DisruptionNodePressure: evicted by the kubelet because the node ran low on a
	// resource (DisruptionTarget TerminationByKubelet, the pod's reason Evicted and the
	// kubelet's "The node was low on resource" message). Blames the node.
	DisruptionNodePressure DisruptionClass = "node-pressure"
	// DisruptionNodeLost: lost with its node (LostWithNode: coroner-shim's
	// ForcefullyTerminated, or DisruptionTarget DeletionByTaintManager or
	// DeletionByPodGC). Blames the node.
	DisruptionNodeLost DisruptionClass = "node-lost"
	// DisruptionNodeShutdown: terminated by the kubelet for any other reason, a graceful
	// node shutdown first of all, or to admit a critical pod. Does not blame the node: a
	// node that shuts down in order is being maintained, not failing.
	DisruptionNodeShutdown DisruptionClass = "node-shutdown"
	// DisruptionPreemption: preempted by kube-scheduler. Does not blame the node.
	DisruptionPreemption DisruptionClass = "preemption"
	// DisruptionEviction: evicted through the Eviction API (a drain, a descheduler, a
	// user). Does not blame the node: someone chose to move the pod.
	DisruptionEviction DisruptionClass = "eviction"
	// DisruptionDefault: everything else a podFailurePolicy Ignore rule may match (an exit
	// code, an OOM kill over the pod's own limit, another DisruptionTarget reason). Never
	// blames the node. In coroner.dev/disruption-budget it is the budget of every class
	// not named.
	DisruptionDefault DisruptionClass = "default"
)

// DisruptionClasses are the classes, in the order the docs and explain list them.
var DisruptionClasses = []DisruptionClass{
	DisruptionDevice, DisruptionNodeOOM, DisruptionNodePressure, DisruptionNodeLost,
	DisruptionNodeShutdown, DisruptionPreemption, DisruptionEviction, DisruptionDefault,
}

// BlamesNode reports whether deaths of class c are the node's fault: device, node-oom,
// node-pressure, node-lost.
func (c DisruptionClass) BlamesNode() bool {
	switch c {
	case DisruptionDevice, DisruptionNodeOOM, DisruptionNodePressure, DisruptionNodeLost:
		return true
	}
	return false
}

// Valid reports whether c is one of DisruptionClasses.
func (c DisruptionClass) Valid() bool {
	for _, k := range DisruptionClasses {
		if c == k {
			return true
		}
	}
	return false
}

// kubeletPressureMessage begins the message of the kubelet's eviction under node
// pressure (pkg/kubelet/eviction, v1.36: "The node was low on resource: memory. ..."),
// on the pod's status and on its DisruptionTarget condition.
const kubeletPressureMessage = "The node was low on resource"

// DisruptionClassOf is the class of p's cause of death (CauseOfDeath), read from p only:
// DisruptionDefault when no more specific class applies, including for a pod that did
// not fail.
func DisruptionClassOf(p *corev1.Pod) DisruptionClass {
	if LostWithNode(p) != "" {
		return DisruptionNodeLost
	}
	c := CauseOfDeath(p)
	switch c.Class {
	case CauseDevice:
		return DisruptionDevice
	case CauseNodeOOM:
		return DisruptionNodeOOM
	case CauseDisruption:
		switch c.Reason {
		case ReasonPreemptionByScheduler:
			return DisruptionPreemption
		case ReasonEvictionByEvictionAPI:
			return DisruptionEviction
		case ReasonTerminationByKubelet:
			if strings.HasPrefix(p.Status.Message, kubeletPressureMessage) || strings.HasPrefix(c.Message, kubeletPressureMessage) {
				return DisruptionNodePressure
			}
			return DisruptionNodeShutdown
		}
	}
	return DisruptionDefault
}

// NodeBlame is, for a pod that failed (phase Failed, or being deleted after a node
// loss) of a cause that blames its node, the node and the class; ok is false otherwise,
// and for a pod never bound to a node.
func NodeBlame(p *corev1.Pod) (node string, class DisruptionClass, ok bool) {
	if p.Spec.NodeName == "" {
		return "", "", false
	}
	if p.Status.Phase != corev1.PodFailed && LostWithNode(p) == "" {
		return "", "", false
	}
	class = DisruptionClassOf(p)
	if !class.BlamesNode() {
		return "", "", false
	}
	return p.Spec.NodeName, class, true
}
