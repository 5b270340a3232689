package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/conditions"
)

const (
	// preemptorPriorityClass is the PriorityClass of the preemptor pods and the prefix of
	// their names.
	preemptorPriorityClass = "coroner-chaos-preemptor"
	// preemptorContainer is the name of the preemptor pod's only container.
	preemptorContainer = "preemptor"
	// preemptorManagedByLabel and preemptorManagedBy mark what coronerctl chaos creates.
	preemptorManagedByLabel = "app.kubernetes.io/managed-by"
	preemptorManagedBy      = "coronerctl-chaos"

	defaultPreemptNamespace  = metav1.NamespaceDefault
	defaultPreemptorImage    = "registry.k8s.io/pause:3.10"
	defaultPreemptorPriority = 1000000
)

// PreemptOptions are the options of Preempt; zero fields take their defaults.
type PreemptOptions struct {
	Namespace  string            // where the preemptor pod goes; default "default"
	Image      string            // the preemptor's image; default "registry.k8s.io/pause:3.10"
	PullPolicy corev1.PullPolicy // default IfNotPresent
	Priority   int32             // the preemptor's priority; default 1000000
	Timeout    time.Duration     // default 2m
}

// withDefaults returns the options with their zero fields defaulted.
func (o PreemptOptions) withDefaults() PreemptOptions {
	if o.Namespace == "" {
		o.Namespace = defaultPreemptNamespace
	}
	if o.Image == "" {
		o.Image = defaultPreemptorImage
	}
	if o.PullPolicy == "" {
		o.PullPolicy = corev1.PullIfNotPresent
	}
	if o.Priority == 0 {
		o.Priority = defaultPreemptorPriority
	}
	if o.Timeout <= 0 {
		o.Timeout = clusterDefaultTimeout
	}
	return o
}

// PreemptorName is the preemptor pod's name for a node.
func PreemptorName(node string) string {
	return preemptorPriorityClass + "-" + node
}

// Preempt makes the scheduler preempt the pods of lower priority on the node: it ensures a
// PriorityClass "coroner-chaos-preemptor" (value opts.Priority, preemptionPolicy
// PreemptLowerPriority, globalDefault false, a description saying coronerctl made it), and creates
// a pod "coroner-chaos-preemptor-<node>" in opts.Namespace with that priorityClassName, a
// nodeSelector kubernetes.io/hostname=<node's label>, and a cpu request (and equal limit) of
// all the cpu of the node that the pods it cannot preempt (priority >= opts.Priority) leave.
// It fits only once every pod of lower priority with a cpu request is gone, so kube-scheduler
// preempts them all (pods without a cpu request are not in its way and stay).
//
// Preempt prints the candidates, then waits up to opts.Timeout for the preemptor to be bound
// to the node, printing each candidate as it becomes a victim (DisruptionTarget with reason
// PreemptionByScheduler, or gone). Undo: "coronerctl chaos unpreempt NODE" (with -n NAMESPACE
// when the namespace is not "default"); it is returned with the error too once the
// preemptor exists.
func Preempt(ctx context.Context, cs kubernetes.Interface, w io.Writer, node string, opts PreemptOptions) (undo string, err error) {
	opts = opts.withDefaults()
	n, err := lookupNode(ctx, cs, node)
	if err != nil {
		return "", err
	}
	hostname := n.Labels[corev1.LabelHostname]
	if hostname == "" {
		return "", fmt.Errorf("node %s has no %s label for the preemptor's nodeSelector", node, corev1.LabelHostname)
	}
	name := PreemptorName(node)
	undoCmd := unpreemptCommand(node, opts.Namespace)
	switch _, err := cs.CoreV1().Pods(opts.Namespace).Get(ctx, name, metav1.GetOptions{}); {
	case err == nil:
		return "", fmt.Errorf("preemptor pod %s/%s exists already; run `%s` first", opts.Namespace, name, undoCmd)
	case !apierrors.IsNotFound(err):
		return "", fmt.Errorf("reading pod %s/%s: %w", opts.Namespace, name, err)
	}
	pods, err := nodePods(ctx, cs, node)
	if err != nil {
		return "", err
	}
	cpu, err := preemptorCPU(n, pods, opts.Priority)
	if err != nil {
		return "", err
	}
	candidates := preemptionCandidates(pods, opts.Priority)
	printCandidates(w, node, opts.Priority, candidates)
	if err := ensurePriorityClass(ctx, cs, w, opts.Priority); err != nil {
		return "", err
	}
	pod := preemptorPod(name, hostname, cpu, opts)
	if err := createPreemptor(ctx, cs, pod); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return "", fmt.Errorf("preemptor pod %s/%s exists already; run `%s` first", opts.Namespace, name, undoCmd)
		}
		return "", fmt.Errorf("creating preemptor pod %s/%s: %w", opts.Namespace, name, err)
	}
	fmt.Fprintf(w, "preempt: created %s/%s (priority class %s, cpu %s, node %s)\n", opts.Namespace, name, preemptorPriorityClass, cpu.String(), node)
	if err := awaitPreemption(ctx, cs, w, node, pod, candidates, opts.Timeout); err != nil {
		return undoCmd, err
	}
	return undoCmd, nil
}

// classLagRetries and classLagWait bound how long createPreemptor waits for the API
// server's Priority admission to see a PriorityClass created a moment ago.
const (
	classLagRetries = 25
	classLagWait    = 200 * time.Millisecond
)

// createPreemptor creates the preemptor pod. The API server's Priority admission plugin
// looks the pod's PriorityClass up in its informer cache, which can lag a class created a
// moment earlier: it then refuses the pod ("no PriorityClass with name ... was found").
// That refusal is retried for up to 5 s; any other answer is final.
func createPreemptor(ctx context.Context, cs kubernetes.Interface, pod *corev1.Pod) error {
	for attempt := 0; ; attempt++ {
		_, err := cs.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
		if err == nil || attempt >= classLagRetries || !apierrors.IsForbidden(err) ||
			!strings.Contains(err.Error(), "no PriorityClass with name "+pod.Spec.PriorityClassName) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(classLagWait):
		}
	}
}

// Unpreempt deletes the preemptor pod of the node (with its own grace period, 1s) and waits
// until it is gone; the PriorityClass is left (it is cluster-wide and harmless), and Unpreempt
// says so. An empty namespace is "default". Undo: "coronerctl chaos preempt NODE" (with
// -n NAMESPACE when the namespace is not "default").
func Unpreempt(ctx context.Context, cs kubernetes.Interface, w io.Writer, node, namespace string) (undo string, err error) {
	if namespace == "" {
		namespace = defaultPreemptNamespace
	}
	name := PreemptorName(node)
	pod, err := cs.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", fmt.Errorf("preemptor pod %s/%s not found", namespace, name)
	}
	if err != nil {
		return "", fmt.Errorf("reading pod %s/%s: %w", namespace, name, err)
	}
	start := time.Now()
	err = cs.CoreV1().Pods(namespace).Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &pod.UID}})
	if err != nil && !apierrors.IsNotFound(err) {
		return "", fmt.Errorf("deleting pod %s/%s: %w", namespace, name, err)
	}
	fmt.Fprintf(w, "unpreempt: deleted %s/%s\n", namespace, name)
	wctx, cancel := context.WithTimeout(ctx, clusterDefaultTimeout)
	defer cancel()
	err = pollAPI(wctx, func(ctx context.Context) (bool, error) {
		cur, err := cs.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		if err != nil {
			return false, fmt.Errorf("reading pod %s/%s: %w", namespace, name, err)
		}
		return cur.UID != pod.UID, nil
	})
	if err != nil {
		return "", fmt.Errorf("waiting for pod %s/%s to go: %w", namespace, name, err)
	}
	fmt.Fprintf(w, "unpreempt: %s/%s gone (%s)\n", namespace, name, elapsedText(time.Since(start)))
	fmt.Fprintf(w, "unpreempt: left PriorityClass %s: it is cluster-wide and harmless (`kubectl delete priorityclass %s` removes it)\n",
		preemptorPriorityClass, preemptorPriorityClass)
	undo = "coronerctl chaos preempt " + node
	if namespace != defaultPreemptNamespace {
		undo += " -n " + namespace
	}
	return undo, nil
}

// unpreemptCommand is the command line that undoes Preempt.
func unpreemptCommand(node, namespace string) string {
	cmd := "coronerctl chaos unpreempt " + node
	if namespace != defaultPreemptNamespace {
		cmd += " -n " + namespace
	}
	return cmd
}

// podPriority is the pod's resolved priority; a pod without one has priority 0.
func podPriority(pod *corev1.Pod) int32 {
	return ptr.Deref(pod.Spec.Priority, 0)
}

// podCPURequest is the pod's effective cpu request in millicores, as kube-scheduler counts
// it: the pod-level request when set, else the sum of the containers' requests (sidecars,
// restartable init containers, included) or the largest need of an init container if
// greater; plus the pod's overhead.
func podCPURequest(pod *corev1.Pod) int64 {
	var req int64
	if pod.Spec.Resources != nil && !pod.Spec.Resources.Requests.Cpu().IsZero() {
		req = pod.Spec.Resources.Requests.Cpu().MilliValue()
	} else {
		for _, c := range pod.Spec.Containers {
			req += c.Resources.Requests.Cpu().MilliValue()
		}
		var sidecars, initMax int64
		for _, c := range pod.Spec.InitContainers {
			r := c.Resources.Requests.Cpu().MilliValue()
			need := r + sidecars
			if ptr.Deref(c.RestartPolicy, "") == corev1.ContainerRestartPolicyAlways {
				req += r
				sidecars += r
				need = sidecars
			}
			initMax = max(initMax, need)
		}
		req = max(req, initMax)
	}
	return req + pod.Spec.Overhead.Cpu().MilliValue()
}

// preemptorCPU is the cpu the preemptor asks for: the node's allocatable cpu minus the
// effective cpu requests of the pods bound to it that are not terminal and whose priority
// is at least priority (those the preemptor cannot preempt). An error when nothing is left.
func preemptorCPU(node *corev1.Node, pods []corev1.Pod, priority int32) (resource.Quantity, error) {
	alloc := node.Status.Allocatable.Cpu().MilliValue()
	if alloc <= 0 {
		return resource.Quantity{}, fmt.Errorf("node %s reports no allocatable cpu", node.Name)
	}
	var kept int64
	for i := range pods {
		p := &pods[i]
		if p.Spec.NodeName != node.Name || podTerminal(p) || podPriority(p) < priority {
			continue
		}
		kept += podCPURequest(p)
	}
	if free := alloc - kept; free > 0 {
		return *resource.NewMilliQuantity(free, resource.DecimalSI), nil
	}
	return resource.Quantity{}, fmt.Errorf("no cpu on node %s for a preemptor of priority %d: the pods it cannot preempt (priority %d or more) request %s of the node's allocatable %s",
		node.Name, priority, priority, milliCPU(kept), milliCPU(alloc))
}

// preemptionCandidates are the pods the scheduler has to preempt for the preemptor to fit:
// not terminal, of priority below priority, with a cpu request.
func preemptionCandidates(pods []corev1.Pod, priority int32) []*corev1.Pod {
	var out []*corev1.Pod
	for i := range pods {
		p := &pods[i]
		if !podTerminal(p) && podPriority(p) < priority && podCPURequest(p) > 0 {
			out = append(out, p)
		}
	}
	return out
}

// printCandidates prints the pods the preemption should take, one a line.
func printCandidates(w io.Writer, node string, priority int32, candidates []*corev1.Pod) {
	if len(candidates) == 0 {
		fmt.Fprintf(w, "preempt: no pod on %s of priority below %d has a cpu request: the preemptor should fit without preempting anything\n", node, priority)
		return
	}
	fmt.Fprintf(w, "preempt: %d candidates on %s (priority below %d, with a cpu request):\n", len(candidates), node, priority)
	for _, p := range candidates {
		fmt.Fprintf(w, "preempt: candidate %s (priority %d, cpu %s)\n", podNsName(p), podPriority(p), milliCPU(podCPURequest(p)))
	}
}

// milliCPU formats millicores as a quantity ("500m", "2").
func milliCPU(m int64) string {
	return resource.NewMilliQuantity(m, resource.DecimalSI).String()
}

// ensurePriorityClass creates the preemptor's PriorityClass unless it exists; an existing
// one must have the value asked for (a PriorityClass's value cannot change) and may preempt.
func ensurePriorityClass(ctx context.Context, cs kubernetes.Interface, w io.Writer, value int32) error {
	pcs := cs.SchedulingV1().PriorityClasses()
	pc, err := pcs.Get(ctx, preemptorPriorityClass, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = pcs.Create(ctx, preemptorPriorityClassObject(value), metav1.CreateOptions{})
		if err == nil {
			fmt.Fprintf(w, "preempt: created PriorityClass %s (value %d)\n", preemptorPriorityClass, value)
			return nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating PriorityClass %s: %w", preemptorPriorityClass, err)
		}
		pc, err = pcs.Get(ctx, preemptorPriorityClass, metav1.GetOptions{})
	}
	if err != nil {
		return fmt.Errorf("reading PriorityClass %s: %w", preemptorPriorityClass, err)
	}
	if pc.Value != value {
		return fmt.Errorf("PriorityClass %s exists with value %d, not %d, and its value cannot change: preempt with priority %d or delete it (kubectl delete priorityclass %s)",
			preemptorPriorityClass, pc.Value, value, pc.Value, preemptorPriorityClass)
	}
	if ptr.Deref(pc.PreemptionPolicy, corev1.PreemptLowerPriority) != corev1.PreemptLowerPriority {
		return fmt.Errorf("PriorityClass %s exists with preemptionPolicy %s: delete it (kubectl delete priorityclass %s)",
			preemptorPriorityClass, *pc.PreemptionPolicy, preemptorPriorityClass)
	}
	fmt.Fprintf(w, "preempt: using PriorityClass %s (value %d)\n", preemptorPriorityClass, value)
	return nil
}

// preemptorPriorityClassObject is the preemptor's PriorityClass.
func preemptorPriorityClassObject(value int32) *schedulingv1.PriorityClass {
	return &schedulingv1.PriorityClass{
		ObjectMeta: metav1.ObjectMeta{
			Name:   preemptorPriorityClass,
			Labels: map[string]string{preemptorManagedByLabel: preemptorManagedBy},
		},
		Value:            value,
		GlobalDefault:    false,
		PreemptionPolicy: ptr.To(corev1.PreemptLowerPriority),
		Description: "Made by coronerctl chaos preempt: the priority of its preemptor pods, which make kube-scheduler " +
			"preempt the pods of lower priority on a node. Safe to delete when no preemptor pod exists.",
	}
}

// preemptorPod is the preemptor pod: the priority class, a nodeSelector on the node's
// hostname label, and cpu requests equal to limits.
func preemptorPod(name, hostname string, cpu resource.Quantity, opts PreemptOptions) *corev1.Pod {
	res := corev1.ResourceList{corev1.ResourceCPU: cpu}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:      name,
			Namespace: opts.Namespace,
			Labels:    map[string]string{preemptorManagedByLabel: preemptorManagedBy},
		},
		Spec: corev1.PodSpec{
			PriorityClassName:             preemptorPriorityClass,
			NodeSelector:                  map[string]string{corev1.LabelHostname: hostname},
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers: []corev1.Container{{
				Name:            preemptorContainer,
				Image:           opts.Image,
				ImagePullPolicy: opts.PullPolicy,
				Resources:       corev1.ResourceRequirements{Requests: res, Limits: res.DeepCopy()},
			}},
		},
	}
}

// awaitPreemption waits up to timeout for the preemptor to be bound to the node, printing
// each candidate as it becomes a victim, then those that did not.
func awaitPreemption(ctx context.Context, cs kubernetes.Interface, w io.Writer, node string, preemptor *corev1.Pod, candidates []*corev1.Pod, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	watch := newPreemptionWatch(candidates)
	key := podNsName(preemptor)
	var last *corev1.Pod
	err := pollAPI(ctx, func(rctx context.Context) (bool, error) {
		now, err := nodePodsByUID(rctx, cs, node)
		if err != nil {
			return false, err
		}
		watch.observe(w, now, time.Since(start))
		cur, err := cs.CoreV1().Pods(preemptor.Namespace).Get(rctx, preemptor.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, fmt.Errorf("preemptor pod %s was deleted before it was scheduled", key)
		}
		if err != nil {
			return false, fmt.Errorf("reading preemptor pod %s: %w", key, err)
		}
		last = cur
		return cur.Spec.NodeName != "", nil
	})
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return fmt.Errorf("preemptor pod %s still unscheduled after %s: %s", key, timeout, scheduledMessage(last))
		}
		return err
	}
	if last.Spec.NodeName != node {
		return fmt.Errorf("preemptor pod %s was bound to node %s, not %s", key, last.Spec.NodeName, node)
	}
	fmt.Fprintf(w, "preempt: %s bound to %s (%s)\n", key, node, elapsedText(time.Since(start)))
	// The scheduler binds once the victims are gone; a last look prints those not seen yet.
	if now, err := nodePodsByUID(ctx, cs, node); err == nil {
		watch.observe(w, now, time.Since(start))
	}
	for _, p := range watch.spared() {
		fmt.Fprintf(w, "preempt: %s was not preempted\n", podNsName(p))
	}
	fmt.Fprintf(w, "preempt: %d of %d candidates preempted\n", len(watch.victims), len(candidates))
	return nil
}

// scheduledMessage says why a pod is not scheduled: its PodScheduled condition's reason and
// message, and its nominated node if any.
func scheduledMessage(pod *corev1.Pod) string {
	if pod == nil {
		return "the pod could not be read"
	}
	msg := "no PodScheduled condition yet"
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled {
			msg = fmt.Sprintf("PodScheduled=%s (%s): %s", c.Status, c.Reason, c.Message)
		}
	}
	if pod.Status.NominatedNodeName != "" {
		msg += "; nominated node " + pod.Status.NominatedNodeName
	}
	return msg
}

// preemptionWatch follows the candidates of a preemption and tells each victim once.
type preemptionWatch struct {
	candidates []*corev1.Pod
	victims    map[types.UID]bool
}

// newPreemptionWatch follows the candidates.
func newPreemptionWatch(candidates []*corev1.Pod) *preemptionWatch {
	return &preemptionWatch{candidates: candidates, victims: map[types.UID]bool{}}
}

// observe takes the node's pods now (by UID) and prints the candidates newly seen preempted:
// with DisruptionTarget=True for reason PreemptionByScheduler, or gone.
func (pw *preemptionWatch) observe(w io.Writer, now map[types.UID]*corev1.Pod, elapsed time.Duration) {
	for _, c := range pw.candidates {
		if pw.victims[c.UID] {
			continue
		}
		cur, ok := now[c.UID]
		switch {
		case !ok:
			fmt.Fprintf(w, "preempt: victim %s gone (%s)\n", podNsName(c), elapsedText(elapsed))
		case preemptedByScheduler(cur):
			fmt.Fprintf(w, "preempt: victim %s: %s=True, reason %s (%s)\n", podNsName(c), conditions.DisruptionTarget, conditions.ReasonPreemptionByScheduler, elapsedText(elapsed))
		default:
			continue
		}
		pw.victims[c.UID] = true
	}
}

// spared are the candidates not seen preempted.
func (pw *preemptionWatch) spared() []*corev1.Pod {
	var out []*corev1.Pod
	for _, c := range pw.candidates {
		if !pw.victims[c.UID] {
			out = append(out, c)
		}
	}
	return out
}

// preemptedByScheduler reports whether the pod has DisruptionTarget=True with reason
// PreemptionByScheduler.
func preemptedByScheduler(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == conditions.DisruptionTarget {
			return c.Status == corev1.ConditionTrue && c.Reason == conditions.ReasonPreemptionByScheduler
		}
	}
	return false
}
