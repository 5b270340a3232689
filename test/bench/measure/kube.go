package measure

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
)

// NodeReady reports whether the node's Ready condition is True.
func NodeReady(n *corev1.Node) bool { return NodeCondition(n, corev1.NodeReady) }

// NodeCondition reports whether the node's condition of type t is True.
func NodeCondition(n *corev1.Node, t corev1.NodeConditionType) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == t {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// WatchPods follows the pods of namespace ns that match selector from resourceVersion rv
// (not "" or "0": a watch that resumes where it broke needs a place to start) until ctx
// ends, and hands each version that is not a deletion to observe, with the time it came.
func WatchPods(ctx context.Context, cs kubernetes.Interface, ns, selector, rv string, observe func(*corev1.Pod, time.Time)) error {
	lw := &cache.ListWatch{WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		o.LabelSelector = selector
		return cs.CoreV1().Pods(ns).Watch(ctx, o)
	}}
	w, err := watchtools.NewRetryWatcherWithContext(ctx, rv, lw)
	if err != nil {
		return err
	}
	go func() {
		defer w.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-w.ResultChan():
				if !ok {
					return
				}
				at := time.Now()
				if p, ok := ev.Object.(*corev1.Pod); ok && ev.Type != watch.Deleted {
					observe(p, at)
				}
			}
		}
	}()
	return nil
}
