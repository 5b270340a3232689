package agent

// Finding a container item's pod: from the cache, else waiting for it, asking the API
// server whether it is this node's, or dropping the item (counted).

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/coroner-dev/coroner/agent/metrics"
	"github.com/coroner-dev/coroner/cri"
)

// apiCheckTimeout bounds the GET that asks whether a pod missing from the cache exists.
const apiCheckTimeout = 10 * time.Second

// podFor returns the container's pod from the cache. When it is not there, it decides
// between a pod not in the cache yet (retry shortly), a pod deleted or bound to another
// node (drop, counted), and a pod the cache is far behind on (retry, up to PodWaitMax).
// It returns nil when the item was re-queued or dropped. ev is the container's last
// event.
func (a *Agent) podFor(ctx context.Context, logger klog.Logger, ev cri.ContainerEvent, it item) *corev1.Pod {
	uid := types.UID(ev.PodUID)
	if pod := a.podByUID(uid); pod != nil {
		return pod
	}
	now := a.clock.Now()
	if reason, gone := a.goneReason(uid); gone {
		a.drop(logger, it, reason, now)
		return nil
	}
	first, checked := a.ledger.AwaitPod(it.id, it.ledgerItem(), now)

	waited := now.Sub(first)
	switch {
	case waited > a.cfg.PodWaitMax:
		a.drop(logger, it, metrics.DroppedNotInCache, now)
		return nil
	case waited < a.cfg.PodCacheWait:
		// Not in the cache yet: the pod's watch event is usually a moment away.
		a.queue.AddAfter(it, min(max(waited/2, 50*time.Millisecond), 500*time.Millisecond))
		return nil
	case checked:
		a.queue.AddAfter(it, time.Second)
		return nil
	}
	reason, err := a.checkPod(ctx, ev)
	if err != nil {
		logger.Error(err, "Cannot tell whether the container's pod exists; retrying")
		a.queue.AddAfter(it, time.Second)
		return nil
	}
	if reason != "" {
		a.markGone(reason, now, uid)
		a.drop(logger, it, reason, now)
		return nil
	}
	a.ledger.PodConfirmed(it.id)
	logger.V(2).Info("The pod exists on this node but is not in the cache yet; waiting", "waited", waited)
	a.queue.AddAfter(it, time.Second)
	return nil
}

// checkPod asks the API server about a container's pod: "" when it exists on this node,
// else the reason to drop its events.
func (a *Agent) checkPod(ctx context.Context, ev cri.ContainerEvent) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, apiCheckTimeout)
	defer cancel()
	pod, err := a.cfg.Client.CoreV1().Pods(ev.PodNamespace).Get(ctx, ev.PodName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return metrics.DroppedPodGone, nil
	case err != nil:
		return "", err
	case string(runtimeUID(pod)) != ev.PodUID && string(pod.UID) != ev.PodUID:
		// Re-created under the same name (a static pod's mirror pod says its node
		// UID in an annotation).
		return metrics.DroppedPodGone, nil
	case pod.Spec.NodeName != a.cfg.NodeName:
		return metrics.DroppedOtherNode, nil
	}
	return "", nil
}

// drop gives up on an item, counted by reason; the runtime's states of a pod that is
// gone or not this node's are forgotten.
func (a *Agent) drop(logger klog.Logger, it item, reason string, now time.Time) {
	a.ledger.Drop(it.id, it.ledgerItem(), now, reason != metrics.DroppedNotInCache)
	a.metrics.Dropped(reason)
	logger.V(2).Info("Leaving the container's event alone", "event", it.kind.String(), "reason", reason)
}
