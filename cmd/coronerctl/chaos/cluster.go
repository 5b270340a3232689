// Package chaos is `coronerctl chaos`: it injects failures on purpose, so that coroner's
// handling of them can be watched. The cluster-side actions (evict, drain, uncordon, preempt,
// unpreempt) work on any cluster through the API server; the node-side ones (partition,
// heal, kill-kubelet, start-kubelet, oom) work in coroner's lab on this machine.
//
// Each action prints what it does, as it does it, to an io.Writer, and returns how to undo
// it: a full command line such as "coronerctl chaos uncordon lab-node-2", or a sentence
// saying why there is nothing to undo.
package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// Timings of the cluster-side actions. They are variables so that tests can shorten them.
var (
	// evictRetryInterval is the wait between eviction attempts the API server answered
	// 429 Too Many Requests (a PodDisruptionBudget allows no disruption right now).
	evictRetryInterval = time.Second
	// apiPollInterval is the wait between two looks at the API while waiting for pods to
	// go or for the preemptor to be scheduled.
	apiPollInterval = 500 * time.Millisecond
)

// clusterDefaultTimeout bounds the waits of drain, preempt and unpreempt when no timeout
// is given.
const clusterDefaultTimeout = 2 * time.Minute

// lookupNode reads the node, with an error naming it when it does not exist.
func lookupNode(ctx context.Context, cs kubernetes.Interface, name string) (*corev1.Node, error) {
	node, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("node %s not found", name)
	}
	if err != nil {
		return nil, fmt.Errorf("reading node %s: %w", name, err)
	}
	return node, nil
}

// lookupPod reads the pod, with an error naming it when it does not exist.
func lookupPod(ctx context.Context, cs kubernetes.Interface, namespace, name string) (*corev1.Pod, error) {
	pod, err := cs.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("pod %s/%s not found", namespace, name)
	}
	if err != nil {
		return nil, fmt.Errorf("reading pod %s/%s: %w", namespace, name, err)
	}
	return pod, nil
}

// nodePods lists the pods of every namespace bound to the node (spec.nodeName), in the
// API server's order.
func nodePods(ctx context.Context, cs kubernetes.Interface, node string) ([]corev1.Pod, error) {
	list, err := cs.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String(),
	})
	if err != nil {
		return nil, fmt.Errorf("listing the pods on node %s: %w", node, err)
	}
	// The field selector is the server's filter; keep the check for clients that ignore it.
	pods := make([]corev1.Pod, 0, len(list.Items))
	for _, p := range list.Items {
		if p.Spec.NodeName == node {
			pods = append(pods, p)
		}
	}
	return pods, nil
}

// patchUnschedulable sets the node's spec.unschedulable with a merge patch.
func patchUnschedulable(ctx context.Context, cs kubernetes.Interface, node string, unschedulable bool) error {
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{"unschedulable": unschedulable}})
	if err != nil {
		return err
	}
	if _, err := cs.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("setting spec.unschedulable=%t on node %s: %w", unschedulable, node, err)
	}
	return nil
}

// podTerminal reports whether the pod has finished for good (phase Succeeded or Failed).
func podTerminal(pod *corev1.Pod) bool {
	return pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
}

// podNsName is the pod's "namespace/name".
func podNsName(pod *corev1.Pod) string {
	return pod.Namespace + "/" + pod.Name
}

// nodePodsByUID lists the pods bound to the node, by UID: one request however many pods
// a wait follows.
func nodePodsByUID(ctx context.Context, cs kubernetes.Interface, node string) (map[types.UID]*corev1.Pod, error) {
	pods, err := nodePods(ctx, cs, node)
	if err != nil {
		return nil, err
	}
	byUID := make(map[types.UID]*corev1.Pod, len(pods))
	for i := range pods {
		byUID[pods[i].UID] = &pods[i]
	}
	return byUID, nil
}

// podFate says what became of a pod someone waits for, given what the API holds now under
// its UID (nil when nothing): "" while it is there and not terminal, else words for the
// output: "gone", or "terminated, phase Failed" (or Succeeded). Going by UID, a StatefulSet's
// replacement of the same name is not taken for the pod.
func podFate(cur *corev1.Pod) string {
	switch {
	case cur == nil:
		return "gone"
	case podTerminal(cur):
		return "terminated, phase " + string(cur.Status.Phase)
	}
	return ""
}

// pollAPI calls check at once and then every apiPollInterval until it reports done or an
// error, or ctx ends; once ctx has ended, its error is ctx's, whatever check said, so that a
// caller tells a timeout (errors.Is(ctx.Err(), context.DeadlineExceeded)) from a failure.
//
// check must make its requests with the context it is given, not with ctx: that one carries
// ctx's cancellation but not its deadline. A request made with a context whose deadline has
// passed, or is closer than the client's rate limiter would make it wait, is refused by the
// limiter before it is sent ("client rate limiter Wait returned an error: rate: Wait(n=1)
// would exceed context deadline"), and that error is no context error. Go closes a
// context's Done channel from a goroutine of its own, a moment after the deadline: a poll
// tick that falls on the deadline (a timeout that is a multiple of apiPollInterval) ran the
// check in that moment, the check failed with the limiter's error while ctx.Err() was still
// nil, and the wait reported that error instead of the timeout.
func pollAPI(ctx context.Context, check func(ctx context.Context) (done bool, err error)) error {
	reqCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stop := context.AfterFunc(ctx, cancel)
	defer stop()
	err := wait.PollUntilContextCancel(ctx, apiPollInterval, true, func(context.Context) (bool, error) { return check(reqCtx) })
	if err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// sleepOrDone waits for d or until ctx ends, whichever comes first; it returns ctx's error in
// the second case.
func sleepOrDone(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// elapsedText formats a duration for the output, as "3.2s".
func elapsedText(d time.Duration) string {
	return fmt.Sprintf("%.1fs", d.Seconds())
}
