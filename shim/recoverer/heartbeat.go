package recoverer

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/coroner-dev/coroner/conditions"
)

// HeartbeatTTL is how long one read of a node's kubelet Lease and of its agent's pod
// serves the decisions about that node's pods. Both are read from the API server, on
// demand, only for a node tainted unreachable whose agent fences on its kubelet's node
// Lease (conditions.FencesOnNodeLease): there is no informer of the 5,000 node Leases a
// large cluster renews 500 times a second, for the few nodes recovery ever looks at. A
// node that comes back renews its Lease and loses its taint within the node controller's
// monitor period (5 s); a read at most this old, on a node still tainted, is the window in
// which the shim may act on the silence the node has just ended (the same as with the
// agent Lease's informer, which lags too).
const HeartbeatTTL = 5 * time.Second

// heartbeat is one read of a node's kubelet Lease and its agent's pod (nil when missing),
// the pod the agent's Lease named then, and when.
type heartbeat struct {
	nodeLease *coordinationv1.Lease
	agentPod  *corev1.Pod
	podName   types.NamespacedName
	read      time.Time
}

// fenceEvidence is what recovery.Decide needs to know of the node's agent: its Lease (from
// the informer) and, when that agent fences on its kubelet's node Lease and the node is
// tainted unreachable, that Lease and the agent's pod, read at most HeartbeatTTL ago.
func (r *Recoverer) fenceEvidence(ctx context.Context, node *corev1.Node, agent *coordinationv1.Lease) (conditions.FenceEvidence, error) {
	ev := conditions.FenceEvidence{Node: node.Name, Agent: agent}
	if _, ok := conditions.FencesOnNodeLease(agent); !ok || !tainted(node, corev1.TaintNodeUnreachable) {
		return ev, nil
	}
	now := r.cfg.Clock.Now()
	r.mu.Lock()
	hb, ok := r.heartbeats[node.Name]
	r.mu.Unlock()
	podName, _ := conditions.AgentPodName(agent)
	if !ok || now.Sub(hb.read) >= HeartbeatTTL || hb.podName != podName {
		var err error
		if hb, err = r.readHeartbeat(ctx, node.Name, agent, now); err != nil {
			return ev, err
		}
		r.mu.Lock()
		r.heartbeats[node.Name] = hb
		r.mu.Unlock()
	}
	ev.NodeLease, ev.AgentPod = hb.nodeLease, hb.agentPod
	return ev, nil
}

// readHeartbeat reads the node's kubelet Lease and the agent's pod its Lease names.
func (r *Recoverer) readHeartbeat(ctx context.Context, node string, agent *coordinationv1.Lease, now time.Time) (heartbeat, error) {
	hb := heartbeat{read: now}
	hb.podName, _ = conditions.AgentPodName(agent)
	l, err := r.client.CoordinationV1().Leases(conditions.NodeLeaseNamespace).Get(ctx, node, metav1.GetOptions{})
	switch {
	case err == nil:
		hb.nodeLease = l
	case !apierrors.IsNotFound(err):
		return hb, fmt.Errorf("reading the kubelet's Lease %s/%s: %w", conditions.NodeLeaseNamespace, node, err)
	}
	if name, ok := conditions.AgentPodName(agent); ok {
		p, err := r.client.CoreV1().Pods(name.Namespace).Get(ctx, name.Name, metav1.GetOptions{})
		switch {
		case err == nil:
			hb.agentPod = p
		case !apierrors.IsNotFound(err):
			return hb, fmt.Errorf("reading the agent's pod %s: %w", name, err)
		}
	}
	return hb, nil
}

// forgetHeartbeat drops the node's cached heartbeat (its taints changed, or it is gone).
func (r *Recoverer) forgetHeartbeat(node string) {
	r.mu.Lock()
	delete(r.heartbeats, node)
	r.mu.Unlock()
}

// tainted reports whether the node has a taint of the key (any effect).
func tainted(n *corev1.Node, key string) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == key {
			return true
		}
	}
	return false
}
