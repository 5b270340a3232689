// Command nodeloss measures requirement P3 on the lab: from the loss of a node (its network
// cut with the lab's Partition, as `coronerctl chaos partition` does) to a replacement pod
// Running on another node, for the same one-pod Job handled three ways in one run:
//
//   - coroner: managed by coroner-shim, opted in (coroner.dev/safe-to-forcefully-delete),
//     podFailurePolicy Ignore on DisruptionTarget; the lab's agents fence after 30s.
//   - built-in, podFailurePolicy: the built-in Job controller with the same policy, whose
//     podReplacementPolicy is then Failed: it waits for the pod to fail, which no kubelet
//     can report while the node is cut off.
//   - built-in, TerminatingOrFailed: the built-in controller replacing a pod as soon as it
//     is terminating (the taint manager deletes it after its toleration): fast, but the
//     old pod may still run on the lost node: two copies.
//
// Kueue's failure recovery (KEP-6757) fails an opted-in terminating pod a threshold after
// its deletion, which is coroner's Z1 path; with fencing coroner does not wait for the
// deletion. The program prints Kueue's timeline computed from the deletion time it
// measured, since Kueue is not installed in the lab.
//
// Every pod tolerates the unreachable and not-ready taints for --toleration (30s here; 300s
// by default in Kubernetes, which adds 270s to the upstream rows and to the Z1 path, not
// to the fenced one). It uses the lab that is up, or brings one up (without the demo) and
// takes it down at the end. Root. About 3 minutes.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"text/tabwriter"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/test/images"
	"github.com/coroner-dev/coroner/test/lab"
)

const (
	victim    = "lab-node-3"
	namespace = "bench-nodeloss"
)

type variant struct {
	name, job string
	managed   bool // by coroner-shim
	optIn     bool
	policy    bool // podFailurePolicy Ignore on DisruptionTarget
	replace   batchv1.PodReplacementPolicy

	first              types.UID
	deletedAt, running time.Time // the first pod's deletion, the replacement Running
	firstRecovered     string    // ForcefullyTerminated reason, if any
	replacementOn      string
}

func main() {
	toleration := flag.Duration("toleration", 30*time.Second, "how long the pods tolerate the unreachable and not-ready taints")
	timeout := flag.Duration("timeout", 150*time.Second, "how long to wait for replacements after the partition")
	kueueThreshold := flag.Duration("kueue-threshold", 60*time.Second, "Kueue's wait after an opted-in pod's deletion, for the computed Kueue row")
	flag.Parse()
	if os.Geteuid() != 0 {
		fail(fmt.Errorf("the lab needs root"))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *toleration, *timeout, *kueueThreshold); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "nodeloss:", err)
	os.Exit(1)
}

func run(ctx context.Context, toleration, timeout, kueueThreshold time.Duration) error {
	cfg, err := lab.DefaultConfig()
	if err != nil {
		return err
	}
	cfg.Out = os.Stderr
	up, err := cfg.IsUp(ctx)
	if err != nil {
		return err
	}
	if !up {
		c := cfg
		c.SkipDemo = true
		if err := lab.Up(ctx, c); err != nil {
			return err
		}
		defer func() { _ = lab.Down(context.Background(), cfg) }()
	}
	cs, err := cfg.Clientset()
	if err != nil {
		return err
	}
	variants := []*variant{
		{name: "coroner (opted in, agents fence after 30s)", job: "coroner", managed: true, optIn: true, policy: true, replace: batchv1.Failed},
		{name: "built-in, podFailurePolicy (replacement: Failed)", job: "builtin-failed", policy: true, replace: batchv1.Failed},
		{name: "built-in, TerminatingOrFailed", job: "builtin-terminating", replace: batchv1.TerminatingOrFailed},
	}

	// Fresh namespace; the other nodes cordoned until every first pod runs on the victim.
	_ = cs.CoreV1().Namespaces().Delete(ctx, namespace, metav1.DeleteOptions{})
	if err := lab.Poll(ctx, 2*time.Minute, "the namespace to go", func() (bool, error) {
		_, err := cs.CoreV1().Namespaces().Get(ctx, namespace, metav1.GetOptions{})
		return err != nil, nil
	}); err != nil {
		return fmt.Errorf("the previous %s namespace did not go: %w", namespace, err)
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	defer func() { _ = cs.CoreV1().Namespaces().Delete(context.Background(), namespace, metav1.DeleteOptions{}) }()
	if err := lab.Poll(ctx, time.Minute, "the default ServiceAccount", func() (bool, error) {
		_, err := cs.CoreV1().ServiceAccounts(namespace).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	}); err != nil {
		return fmt.Errorf("no default ServiceAccount in %s: %w", namespace, err)
	}
	others := []string{}
	for _, n := range cfg.Nodes {
		if n.Name != victim {
			others = append(others, n.Name)
		}
	}
	for _, n := range others {
		if err := cordon(ctx, cs, n, true); err != nil {
			return err
		}
	}
	uncordoned := false
	uncordonAll := func() {
		if !uncordoned {
			uncordoned = true
			for _, n := range others {
				_ = cordon(context.Background(), cs, n, false)
			}
		}
	}
	defer uncordonAll()

	for _, v := range variants {
		if _, err := cs.BatchV1().Jobs(namespace).Create(ctx, jobFor(v, toleration), metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	for _, v := range variants {
		if err := lab.Poll(ctx, time.Minute, "the first pod", func() (bool, error) {
			p := runningPod(ctx, cs, v.job)
			if p != nil {
				v.first = p.UID
			}
			return p != nil, nil
		}); err != nil {
			return fmt.Errorf("the first pod of %s did not run on %s: %w", v.job, victim, err)
		}
	}
	uncordonAll()
	fmt.Fprintf(os.Stderr, "nodeloss: 3 Jobs run a pod each on %s; partitioning it\n", victim)

	start := time.Now()
	if err := cfg.Partition(victim); err != nil {
		return err
	}
	healed := false
	heal := func() {
		if !healed {
			healed = true
			_ = cfg.Heal(victim)
		}
	}
	defer heal()

	var taintedAt time.Time
	// Until every variant has a replacement Running or timeout passes ("none within").
	_ = lab.Poll(ctx, timeout, "replacements", func() (bool, error) {
		if taintedAt.IsZero() {
			if n, err := cs.CoreV1().Nodes().Get(ctx, victim, metav1.GetOptions{}); err == nil {
				for _, t := range n.Spec.Taints {
					if t.Key == corev1.TaintNodeUnreachable {
						taintedAt = time.Now()
					}
				}
			}
		}
		done := true
		for _, v := range variants {
			observe(ctx, cs, v)
			done = done && !v.running.IsZero()
		}
		return done, nil
	})
	if ctx.Err() != nil {
		return ctx.Err()
	}
	heal()
	// The agent of the victim says, once back, what it stopped.
	fenceEvent := ""
	_ = lab.Poll(ctx, time.Minute, "the Fenced Event", func() (bool, error) {
		evs, err := cs.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Node,involvedObject.name=" + victim + ",reason=" + conditions.EventReasonFenced})
		if err != nil {
			return false, nil
		}
		for _, e := range evs.Items {
			if e.LastTimestamp.After(start) {
				fenceEvent = e.Message
				return true, nil
			}
		}
		return false, nil
	})

	report(variants, start, taintedAt, toleration, timeout, kueueThreshold, fenceEvent)
	return nil
}

func jobFor(v *variant, toleration time.Duration) *batchv1.Job {
	secs := int64(toleration.Seconds())
	j := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: v.job, Namespace: namespace},
		Spec: batchv1.JobSpec{
			BackoffLimit:         ptr.To[int32](3),
			PodReplacementPolicy: ptr.To(v.replace),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{}},
				Spec: corev1.PodSpec{
					RestartPolicy:                 corev1.RestartPolicyNever,
					TerminationGracePeriodSeconds: ptr.To[int64](1),
					Containers: []corev1.Container{{Name: "main", Image: images.BusyboxName, ImagePullPolicy: corev1.PullNever,
						Command: []string{"sleep", "600"}}},
					Tolerations: []corev1.Toleration{
						{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: &secs},
						{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: &secs},
					},
				},
			},
		},
	}
	if v.managed {
		j.Spec.ManagedBy = ptr.To(lab.ManagedBy)
	}
	if v.optIn {
		j.Spec.Template.Annotations[conditions.AnnotationSafeToForcefullyDelete] = "true"
	}
	if v.policy {
		j.Spec.PodFailurePolicy = &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{{
			Action:          batchv1.PodFailurePolicyActionIgnore,
			OnPodConditions: []batchv1.PodFailurePolicyOnPodConditionsPattern{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue}},
		}}}
	}
	return j
}

// observe records the first pod's deletion and recovery, and the replacement Running.
func observe(ctx context.Context, cs kubernetes.Interface, v *variant) {
	pods, err := cs.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + v.job})
	if err != nil {
		return
	}
	for _, p := range pods.Items {
		if p.UID == v.first {
			if p.DeletionTimestamp != nil && v.deletedAt.IsZero() {
				v.deletedAt = time.Now()
			}
			if c := conditions.Find(&p.Status, conditions.ForcefullyTerminated); c != nil && c.Status == corev1.ConditionTrue {
				v.firstRecovered = c.Reason
			}
			continue
		}
		if v.running.IsZero() && p.Status.Phase == corev1.PodRunning && p.Spec.NodeName != victim {
			v.running = time.Now()
		}
	}
}

func report(variants []*variant, start, taintedAt time.Time, toleration, timeout, kueueThreshold time.Duration, fenceEvent string) {
	since := func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return fmt.Sprintf("%.1fs", t.Sub(start).Seconds())
	}
	fmt.Printf("P3: node %s partitioned; pods tolerate unreachable for %v; times from the partition\n", victim, toleration)
	fmt.Printf("node tainted unreachable after %s\n\n", since(taintedAt))
	w := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(w, "handled by\tfirst pod deleted\treplacement Running\tfirst pod then")
	var coroner, fast time.Duration
	for _, v := range variants {
		repl := since(v.running)
		if v.running.IsZero() {
			repl = fmt.Sprintf("none within %v", timeout)
		}
		then := "still on the lost node: nobody knows if it runs"
		switch {
		case v.firstRecovered == conditions.ReasonNodeFenced:
			then = "stopped by the node's agent (fenced), then failed (NodeFenced)"
		case v.firstRecovered != "":
			then = "failed by coroner (" + v.firstRecovered + ")"
		case !v.running.IsZero():
			then = "may still run on the lost node: two copies"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", v.name, since(v.deletedAt), repl, then)
		if v.managed && !v.running.IsZero() {
			coroner = v.running.Sub(start)
		}
		if v.replace == batchv1.TerminatingOrFailed && !v.running.IsZero() {
			fast = v.running.Sub(start)
		}
	}
	var deleted time.Time
	for _, v := range variants {
		if !v.managed && !v.deletedAt.IsZero() {
			deleted = v.deletedAt
		}
	}
	if !deleted.IsZero() {
		fmt.Fprintf(w, "Kueue failure recovery (computed)\t%s\t%s\t%s\n", since(deleted),
			fmt.Sprintf("~%.1fs", deleted.Sub(start).Seconds()+kueueThreshold.Seconds()),
			fmt.Sprintf("failed %v after its deletion, not known stopped", kueueThreshold))
	}
	w.Flush()
	fmt.Println()
	if coroner > 0 && fast > 0 {
		fmt.Printf("ratio: built-in TerminatingOrFailed / coroner = %.2f (and only coroner's first pod is known stopped)\n", fast.Seconds()/coroner.Seconds())
	}
	if coroner > 0 && !deleted.IsZero() {
		k := deleted.Sub(start) + kueueThreshold
		fmt.Printf("ratio: Kueue (computed) / coroner = %.2f; with the default 300s toleration: %.2f\n",
			k.Seconds()/coroner.Seconds(), (k+300*time.Second-toleration).Seconds()/coroner.Seconds())
	}
	if fenceEvent != "" {
		fmt.Printf("the agent of %s, once back: %s\n", victim, fenceEvent)
	}
}

func runningPod(ctx context.Context, cs kubernetes.Interface, job string) *corev1.Pod {
	pods, err := cs.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + job})
	if err != nil {
		return nil
	}
	for i, p := range pods.Items {
		if p.Status.Phase == corev1.PodRunning && p.Spec.NodeName == victim {
			return &pods.Items[i]
		}
	}
	return nil
}

func cordon(ctx context.Context, cs kubernetes.Interface, node string, on bool) error {
	patch := fmt.Sprintf(`{"spec":{"unschedulable":%v}}`, on)
	_, err := cs.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}
