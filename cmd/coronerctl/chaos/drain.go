package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// DrainOptions are the options of Drain.
type DrainOptions struct {
	// Timeout bounds the wait for the evicted pods to be gone (default 2m when zero). It
	// starts once the node is cordoned and also bounds the retries of the evictions a
	// PodDisruptionBudget refuses.
	Timeout time.Duration
}

// drainAction is what Drain does with one pod of the node.
type drainAction int

const (
	// drainEvict: evict the pod and wait until it is gone.
	drainEvict drainAction = iota
	// drainAwait: the pod is being deleted already; wait until it is gone.
	drainAwait
	// drainLeaveDaemonSet: a DaemonSet's pod, left (--ignore-daemonsets).
	drainLeaveDaemonSet
	// drainLeaveMirror: a static pod's mirror, which the API cannot remove, left.
	drainLeaveMirror
	// drainSkipTerminal: the pod has finished (Succeeded or Failed); nothing to evict.
	drainSkipTerminal
)

// drainStep is one pod of the node and what Drain does with it.
type drainStep struct {
	pod    *corev1.Pod
	action drainAction
}

// awaitedPod is a pod Drain waits for, with the time its wait began.
type awaitedPod struct {
	pod   *corev1.Pod
	since time.Time
}

// Drain cordons the node (spec.unschedulable=true, a merge patch; no-op when already cordoned)
// and evicts every pod bound to it, like `kubectl drain --ignore-daemonsets --delete-emptydir-data
// --force`: DaemonSet pods and mirror (static) pods (annotation kubernetes.io/config.mirror) are
// left, pods already terminal (Succeeded/Failed) are skipped, pods already being deleted are not
// evicted again but are waited for. Evictions answered 429 are retried every second. It then waits
// until every evicted pod is gone from the API or terminal, printing one line per pod as it goes.
// Undo: "coronerctl chaos uncordon NODE".
//
// Once the node is cordoned, Drain returns the undo hint with its error too.
func Drain(ctx context.Context, cs kubernetes.Interface, w io.Writer, node string, opts DrainOptions) (undo string, err error) {
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = clusterDefaultTimeout
	}
	n, err := lookupNode(ctx, cs, node)
	if err != nil {
		return "", err
	}
	if err := cordonNode(ctx, cs, w, n); err != nil {
		return "", err
	}
	undo = "coronerctl chaos uncordon " + node
	pods, err := nodePods(ctx, cs, node)
	if err != nil {
		return undo, err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	start := time.Now()
	var toEvict []*corev1.Pod
	var awaited []awaitedPod
	left := 0
	for _, s := range planDrain(pods) {
		key := podNsName(s.pod)
		switch s.action {
		case drainEvict:
			toEvict = append(toEvict, s.pod)
		case drainAwait:
			fmt.Fprintf(w, "drain: %s is being deleted already; waiting for it\n", key)
			awaited = append(awaited, awaitedPod{pod: s.pod, since: start})
		case drainLeaveDaemonSet:
			fmt.Fprintf(w, "drain: leaving %s (DaemonSet pod)\n", key)
			left++
		case drainLeaveMirror:
			fmt.Fprintf(w, "drain: leaving %s (mirror of a static pod)\n", key)
			left++
		case drainSkipTerminal:
			fmt.Fprintf(w, "drain: skipping %s (%s already)\n", key, s.pod.Status.Phase)
		}
	}
	evicted, err := evictPods(ctx, cs, w, toEvict)
	if err != nil {
		return undo, err
	}
	if err := awaitPodsGone(ctx, cs, w, node, timeout, append(awaited, evicted...)); err != nil {
		return undo, err
	}
	fmt.Fprintf(w, "drain: %s drained: %d pods evicted, %d left (DaemonSet or static)\n", node, len(evicted), left)
	return undo, nil
}

// Uncordon makes the node schedulable again. Undo: drain.
//
// When the node is schedulable already, Uncordon changes nothing and says so, and there is
// nothing to undo.
func Uncordon(ctx context.Context, cs kubernetes.Interface, w io.Writer, node string) (undo string, err error) {
	n, err := lookupNode(ctx, cs, node)
	if err != nil {
		return "", err
	}
	if !n.Spec.Unschedulable {
		fmt.Fprintf(w, "uncordon: %s is schedulable already\n", node)
		return "nothing to undo: node " + node + " was schedulable already", nil
	}
	if err := patchUnschedulable(ctx, cs, node, false); err != nil {
		return "", err
	}
	fmt.Fprintf(w, "uncordon: uncordoned %s\n", node)
	return "coronerctl chaos drain " + node, nil
}

// cordonNode marks the node unschedulable unless it is already.
func cordonNode(ctx context.Context, cs kubernetes.Interface, w io.Writer, node *corev1.Node) error {
	if node.Spec.Unschedulable {
		fmt.Fprintf(w, "drain: %s is cordoned already\n", node.Name)
		return nil
	}
	if err := patchUnschedulable(ctx, cs, node.Name, true); err != nil {
		return err
	}
	fmt.Fprintf(w, "drain: cordoned %s\n", node.Name)
	return nil
}

// planDrain decides, in the pods' order, what Drain does with each pod of the node: a mirror
// pod or a DaemonSet's pod is left, a terminal pod skipped, a pod being deleted awaited, and
// every other pod evicted (whatever its controller or volumes, as with --force and
// --delete-emptydir-data).
func planDrain(pods []corev1.Pod) []drainStep {
	steps := make([]drainStep, 0, len(pods))
	for i := range pods {
		p := &pods[i]
		action := drainEvict
		switch {
		case isMirrorPod(p):
			action = drainLeaveMirror
		case isDaemonSetPod(p):
			action = drainLeaveDaemonSet
		case podTerminal(p):
			action = drainSkipTerminal
		case p.DeletionTimestamp != nil:
			action = drainAwait
		}
		steps = append(steps, drainStep{pod: p, action: action})
	}
	return steps
}

// isMirrorPod reports whether the pod is the API's mirror of a kubelet's static pod.
func isMirrorPod(pod *corev1.Pod) bool {
	_, ok := pod.Annotations[corev1.MirrorPodAnnotationKey]
	return ok
}

// isDaemonSetPod reports whether the pod's controller is a DaemonSet.
func isDaemonSetPod(pod *corev1.Pod) bool {
	ref := metav1.GetControllerOf(pod)
	return ref != nil && ref.Kind == "DaemonSet" && strings.HasPrefix(ref.APIVersion, "apps/")
}

// evictPods evicts the pods. Those answered 429 are tried again every evictRetryInterval
// while the others go ahead, until each eviction is accepted (or the pod is gone already) or
// ctx ends. It returns the evicted pods, each with the time its eviction was accepted.
func evictPods(ctx context.Context, cs kubernetes.Interface, w io.Writer, pods []*corev1.Pod) ([]awaitedPod, error) {
	var evicted []awaitedPod
	refused := map[string]bool{}
	pending := pods
	for first := true; ; first = false {
		var blocked []*corev1.Pod
		for _, p := range pending {
			key := podNsName(p)
			if first {
				fmt.Fprintf(w, "drain: evicting %s\n", key)
			}
			err := requestEviction(ctx, cs, p.Namespace, p.Name)
			switch {
			case err == nil:
				evicted = append(evicted, awaitedPod{pod: p, since: time.Now()})
			case apierrors.IsNotFound(err):
				fmt.Fprintf(w, "drain: %s gone already\n", key)
			case apierrors.IsTooManyRequests(err):
				blocked = append(blocked, p)
				if !refused[key] {
					fmt.Fprintf(w, "drain: %s: eviction refused for now (%v); retrying every %s\n", key, err, evictRetryInterval)
					refused[key] = true
				}
			default:
				return evicted, fmt.Errorf("evicting pod %s: %w", key, err)
			}
		}
		if len(blocked) == 0 {
			return evicted, nil
		}
		if err := sleepOrDone(ctx, evictRetryInterval); err != nil {
			return evicted, fmt.Errorf("evicting %s: gave up (%w) while the evictions were refused", podNsNames(blocked), err)
		}
		pending = blocked
	}
}

// awaitPodsGone waits until every pod is gone from the API or terminal, printing a line for
// each as it goes. When ctx ends first, the error names the pods still there.
func awaitPodsGone(ctx context.Context, cs kubernetes.Interface, w io.Writer, node string, timeout time.Duration, pods []awaitedPod) error {
	remaining := pods
	err := pollAPI(ctx, func(rctx context.Context) (bool, error) {
		now, err := nodePodsByUID(rctx, cs, node)
		if err != nil {
			return false, err
		}
		var still []awaitedPod
		for _, a := range remaining {
			fate := podFate(now[a.pod.UID])
			if fate == "" {
				still = append(still, a)
				continue
			}
			fmt.Fprintf(w, "drain: %s %s (%s)\n", podNsName(a.pod), fate, elapsedText(time.Since(a.since)))
		}
		remaining = still
		return len(remaining) == 0, nil
	})
	if err == nil {
		return nil
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		keys := make([]*corev1.Pod, len(remaining))
		for i, a := range remaining {
			keys[i] = a.pod
		}
		return fmt.Errorf("%d pods still on node %s after %s: %s", len(remaining), node, timeout, podNsNames(keys))
	}
	return fmt.Errorf("waiting for the pods on node %s to go: %w", node, err)
}

// podNsNames joins the pods' "namespace/name" with commas.
func podNsNames(pods []*corev1.Pod) string {
	keys := make([]string, len(pods))
	for i, p := range pods {
		keys[i] = podNsName(p)
	}
	return strings.Join(keys, ", ")
}
