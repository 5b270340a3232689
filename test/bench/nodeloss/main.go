// Command nodeloss measures requirement P3 on the lab: from the loss of a node (its network
// cut with the lab's Partition, as `coronerctl chaos partition` does) to a replacement pod
// Running on another node, for the same one-pod Job handled several ways in one run:
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
// With -kueue (Kueue installed on the lab: LAB_PLATFORMS=1 make lab, or make platforms,
// FailureRecoveryPolicy on) the opted-in pods carry Kueue's annotation too
// (kueue.x-k8s.io/safe-to-forcefully-delete), so Kueue's failure recovery (KEP-6757: it
// fails and force-deletes an opted-in pod one minute after its deletion, on a node tainted
// unreachable) runs beside coroner on the coroner rows, and a second partition of the same
// node measures, with the agents' fencing off and coroner-shim recovering only its own
// Jobs' pods (--recover-pods=managed):
//
//   - coroner without fencing: the shim's recovery after the pod's deletion (Z1).
//   - Kueue alone: a built-in Job's pod with both annotations, which only Kueue recovers.
//
// Each coroner row says who recovered the lost pod (coroner's ForcefullyTerminated, Kueue's
// KueueFailureRecovery, both), how often it was seen deleted and re-created (once each is
// right) and the phases it went through (one move to Failed: no fight over the phase).
// Without -kueue, a Kueue row computed from the measured deletion time is printed.
//
// Every pod tolerates the unreachable and not-ready taints for --toleration (30s here; 300s
// by default in Kubernetes, which adds 270s to the upstream rows and to the Z1 path, not
// to the fenced one). It uses the lab that is up, or brings one up (without the demo) and
// takes it down at the end. Root. About 3 minutes; 8 with -kueue.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
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

// namespace is the partition's: the second partition has its own, since the first's is
// still being deleted then (its pods on the healed node go at the kubelet's pace).
var namespace = "bench-nodeloss"

const (
	victim = "lab-node-3"
	// kueueRecovered is the condition Kueue's failure recovery adds to a pod it fails.
	kueueRecovered = "KueueFailureRecovery"
)

type variant struct {
	name, job string
	managed   bool // by coroner-shim
	optIn     bool // coroner's annotation (and Kueue's, with -kueue)
	policy    bool // podFailurePolicy Ignore on DisruptionTarget
	replace   batchv1.PodReplacementPolicy

	first              types.UID
	deletedAt, running time.Time // the first pod's deletion, the replacement Running
	firstRecovered     string    // coroner's ForcefullyTerminated reason, if any
	kueueRecovered     bool      // Kueue's KueueFailureRecovery condition
	phases             []corev1.PodPhase
	replacementOn      string
	replacements       map[types.UID]bool // the pods of the Job made after the first
}

// options are the flags.
type options struct {
	toleration, timeout, kueueThreshold time.Duration
	kueue                               bool
}

func main() {
	var o options
	flag.DurationVar(&o.toleration, "toleration", 30*time.Second, "how long the pods tolerate the unreachable and not-ready taints")
	flag.DurationVar(&o.timeout, "timeout", 150*time.Second, "how long to wait for replacements after the partition")
	flag.DurationVar(&o.kueueThreshold, "kueue-threshold", 60*time.Second, "Kueue's wait after an opted-in pod's deletion, for the computed Kueue row (without -kueue)")
	flag.BoolVar(&o.kueue, "kueue", false, "Kueue is installed (make platforms): measure its failure recovery for real, beside coroner and alone, in a second partition")
	flag.Parse()
	if os.Geteuid() != 0 {
		fail(fmt.Errorf("the lab needs root"))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "nodeloss:", err)
	os.Exit(1)
}

func say(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "nodeloss: "+format+"\n", args...)
}

func run(ctx context.Context, o options) error {
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
		if o.kueue {
			return errors.New("-kueue needs the lab up with Kueue installed (LAB_PLATFORMS=1 make lab)")
		}
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
	if o.kueue {
		if _, err := cs.Discovery().ServerResourcesForGroupVersion("kueue.x-k8s.io/v1beta2"); err != nil {
			return fmt.Errorf("-kueue: Kueue is not installed on the lab (make platforms): %w", err)
		}
	}

	fenced := []*variant{
		{name: "coroner (opted in, agents fence after 30s)", job: "coroner", managed: true, optIn: true, policy: true, replace: batchv1.Failed},
		{name: "built-in, podFailurePolicy (replacement: Failed)", job: "builtin-failed", policy: true, replace: batchv1.Failed},
		{name: "built-in, TerminatingOrFailed", job: "builtin-terminating", replace: batchv1.TerminatingOrFailed},
	}
	if o.kueue {
		fenced[0].name = "coroner + Kueue (both opted in, agents fence after 30s)"
	}
	start, tainted, fenceEvent, err := partitionRun(ctx, cfg, cs, o, fenced)
	if err != nil {
		return err
	}
	fmt.Printf("P3: node %s partitioned; pods tolerate unreachable for %v; times from the partition\n", victim, o.toleration)
	fmt.Printf("node tainted unreachable after %s\n\n", since(start, tainted))
	report(fenced, start, o)
	if fenceEvent != "" {
		fmt.Printf("the agent of %s, once back: %s\n", victim, fenceEvent)
	}
	if !o.kueue {
		return nil
	}

	// The second partition: no fencing, coroner-shim recovers its own Jobs' pods only.
	restore, err := unfenced(ctx, cfg)
	if restore != nil {
		defer restore()
	}
	if err != nil {
		return err
	}
	namespace = "bench-nodeloss-unfenced"
	alone := []*variant{
		{name: "coroner + Kueue (both opted in), no fencing", job: "coroner-unfenced", managed: true, optIn: true, policy: true, replace: batchv1.Failed},
		{name: "Kueue alone (built-in Job, both opted in; shim: its own Jobs only)", job: "kueue-alone", optIn: true, policy: true, replace: batchv1.Failed},
	}
	start2, tainted2, _, err := partitionRun(ctx, cfg, cs, o, alone)
	if err != nil {
		return err
	}
	fmt.Printf("\nsecond partition of %s, the agents' fencing off, coroner-shim --recover-pods=managed; node tainted unreachable after %s\n\n", victim, since(start2, tainted2))
	report(alone, start2, o)
	kueueErrors(ctx, cfg, start)
	return nil
}

// partitionRun makes the variants' Jobs in a fresh namespace, their first pods on the
// victim, partitions it, and observes until every variant has a replacement Running or
// the timeout; then heals the node and waits for it to be Ready again.
func partitionRun(ctx context.Context, cfg lab.Config, cs kubernetes.Interface, o options, variants []*variant) (start, tainted time.Time, fenceEvent string, err error) {
	_ = cs.CoreV1().Namespaces().Delete(ctx, namespace, metav1.DeleteOptions{})
	if err := lab.FreshNamespace(ctx, cs, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, 2*time.Minute); err != nil {
		return start, tainted, "", err
	}
	defer func() { _ = cs.CoreV1().Namespaces().Delete(context.Background(), namespace, metav1.DeleteOptions{}) }()
	// The other nodes cordoned until every first pod runs on the victim.
	var others []string
	for _, n := range cfg.Nodes {
		if n.Name != victim {
			others = append(others, n.Name)
		}
	}
	for _, n := range others {
		if err := cordon(ctx, cs, n, true); err != nil {
			return start, tainted, "", err
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
		if _, err := cs.BatchV1().Jobs(namespace).Create(ctx, jobFor(v, o), metav1.CreateOptions{}); err != nil {
			return start, tainted, "", err
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
			return start, tainted, "", fmt.Errorf("the first pod of %s did not run on %s: %w", v.job, victim, err)
		}
	}
	uncordonAll()
	say("%d Jobs run a pod each on %s; partitioning it", len(variants), victim)

	start = time.Now()
	if err := cfg.Partition(victim); err != nil {
		return start, tainted, "", err
	}
	healed := false
	heal := func() {
		if !healed {
			healed = true
			_ = cfg.Heal(victim)
		}
	}
	defer heal()

	// Until every variant has a replacement Running or timeout passes ("none within").
	_ = lab.Poll(ctx, o.timeout, "replacements", func() (bool, error) {
		if tainted.IsZero() {
			if n, err := cs.CoreV1().Nodes().Get(ctx, victim, metav1.GetOptions{}); err == nil {
				for _, t := range n.Spec.Taints {
					if t.Key == corev1.TaintNodeUnreachable {
						tainted = time.Now()
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
		return start, tainted, "", ctx.Err()
	}
	// A little longer for Kueue's late recovery of a pod coroner already replaced: the
	// rows say whether it acted too.
	if o.kueue {
		_ = lab.Sleep(ctx, 20*time.Second)
		for _, v := range variants {
			observe(ctx, cs, v)
		}
	}
	heal()
	// The agent of the victim says, once back, what it stopped.
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
	err = lab.Poll(ctx, 3*time.Minute, victim+" Ready again", func() (bool, error) {
		n, err := cs.CoreV1().Nodes().Get(ctx, victim, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue && !slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == corev1.TaintNodeUnreachable }) {
				return true, nil
			}
		}
		return false, nil
	})
	return start, tainted, fenceEvent, err
}

// unfenced turns the agents' fencing off and narrows coroner-shim's recovery to its own
// Jobs' pods, and returns what puts both back.
func unfenced(ctx context.Context, cfg lab.Config) (func(), error) {
	kubectl := func(args ...string) error {
		cmd := exec.CommandContext(ctx, filepath.Join(cfg.BinDir, "kubectl"), append([]string{"--kubeconfig=" + cfg.Kubeconfig(), "-n", "coroner-system"}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	cs, err := cfg.Clientset()
	if err != nil {
		return nil, err
	}
	ds, err := cs.AppsV1().DaemonSets("coroner-system").Get(ctx, "coroner-agent", metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	dep, err := cs.AppsV1().Deployments("coroner-system").Get(ctx, "coroner-shim", metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	agentArgs, shimArgs := ds.Spec.Template.Spec.Containers[0].Args, dep.Spec.Template.Spec.Containers[0].Args
	set := func(agent, shim []string) error {
		a, _ := json.Marshal(agent) // a []string always marshals
		s, _ := json.Marshal(shim)
		if err := kubectl("patch", "daemonset", "coroner-agent", "--type=json", "-p", `[{"op":"replace","path":"/spec/template/spec/containers/0/args","value":`+string(a)+`}]`); err != nil {
			return err
		}
		if err := kubectl("patch", "deployment", "coroner-shim", "--type=json", "-p", `[{"op":"replace","path":"/spec/template/spec/containers/0/args","value":`+string(s)+`}]`); err != nil {
			return err
		}
		if err := kubectl("rollout", "status", "daemonset/coroner-agent", "--timeout=3m"); err != nil {
			return err
		}
		return kubectl("rollout", "status", "deployment/coroner-shim", "--timeout=3m")
	}
	var noFence, managedOnly []string
	for _, a := range agentArgs {
		if a != "--fencing" && !strings.HasPrefix(a, "--fence-after") {
			noFence = append(noFence, a)
		}
	}
	for _, a := range shimArgs {
		if !strings.HasPrefix(a, "--recover-pods") {
			managedOnly = append(managedOnly, a)
		}
	}
	managedOnly = append(managedOnly, "--recover-pods=managed")
	restore := func() {
		if err := set(agentArgs, shimArgs); err != nil {
			say("could not restore coroner's arguments: %v (make lab-redeploy puts them back)", err)
		}
	}
	say("turning the agents' fencing off and coroner-shim's recovery to --recover-pods=managed")
	return restore, set(noFence, managedOnly)
}

func jobFor(v *variant, o options) *batchv1.Job {
	secs := int64(o.toleration.Seconds())
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
		if o.kueue {
			j.Spec.Template.Annotations[conditions.AnnotationKueueSafeToForcefullyDelete] = "true"
		}
	}
	if v.policy {
		j.Spec.PodFailurePolicy = &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{{
			Action:          batchv1.PodFailurePolicyActionIgnore,
			OnPodConditions: []batchv1.PodFailurePolicyOnPodConditionsPattern{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue}},
		}}}
	}
	return j
}

// observe records the first pod's deletion, phases and recovery, and the replacement
// Running.
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
			if len(v.phases) == 0 || v.phases[len(v.phases)-1] != p.Status.Phase {
				v.phases = append(v.phases, p.Status.Phase)
			}
			if c := conditions.Find(&p.Status, conditions.ForcefullyTerminated); c != nil && c.Status == corev1.ConditionTrue {
				v.firstRecovered = c.Reason
			}
			if c := conditions.Find(&p.Status, kueueRecovered); c != nil && c.Status == corev1.ConditionTrue {
				v.kueueRecovered = true
			}
			continue
		}
		if v.replacements == nil {
			v.replacements = map[types.UID]bool{}
		}
		v.replacements[p.UID] = true
		if v.running.IsZero() && p.Status.Phase == corev1.PodRunning && p.Spec.NodeName != victim {
			v.running, v.replacementOn = time.Now(), p.Spec.NodeName
		}
	}
}

func since(start, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return fmt.Sprintf("%.1fs", t.Sub(start).Seconds())
}

func report(variants []*variant, start time.Time, o options) {
	w := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(w, "handled by\tfirst pod deleted\treplacement Running\treplacements\trecovered by\tphases of the first pod\tfirst pod then")
	var coroner, fast time.Duration
	for _, v := range variants {
		repl := since(start, v.running)
		if v.running.IsZero() {
			repl = fmt.Sprintf("none within %v", o.timeout)
		}
		var by []string
		if v.firstRecovered != "" {
			by = append(by, "coroner ("+v.firstRecovered+")")
		}
		if v.kueueRecovered {
			by = append(by, "Kueue")
		}
		if len(by) == 0 {
			by = append(by, "-")
		}
		then := "still on the lost node: nobody knows if it runs"
		switch {
		case v.firstRecovered == conditions.ReasonNodeFenced:
			then = "stopped by the node's agent (fenced), then failed (NodeFenced)"
		case !v.running.IsZero():
			then = "may still run on the lost node: two copies"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", v.name, since(start, v.deletedAt), repl, len(v.replacements), strings.Join(by, " + "), phaseList(v.phases), then)
		if v.managed && !v.running.IsZero() && coroner == 0 {
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
	if !o.kueue && !deleted.IsZero() {
		fmt.Fprintf(w, "Kueue failure recovery (computed)\t%s\t%s\t-\t-\t%s\n", since(start, deleted),
			fmt.Sprintf("~%.1fs", deleted.Sub(start).Seconds()+o.kueueThreshold.Seconds()),
			fmt.Sprintf("failed %v after its deletion, not known stopped", o.kueueThreshold))
	}
	w.Flush()
	fmt.Println()
	if coroner > 0 && fast > 0 {
		fmt.Printf("ratio: built-in TerminatingOrFailed / coroner = %.2f (and only coroner's first pod is known stopped)\n", fast.Seconds()/coroner.Seconds())
	}
	for _, v := range variants {
		if !v.managed && v.optIn && !v.running.IsZero() && coroner > 0 {
			fmt.Printf("ratio: %s / coroner = %.2f\n", v.name, v.running.Sub(start).Seconds()/coroner.Seconds())
		}
	}
	if !o.kueue && coroner > 0 && !deleted.IsZero() {
		k := deleted.Sub(start) + o.kueueThreshold
		fmt.Printf("ratio: Kueue (computed) / coroner = %.2f; with the default 300s toleration: %.2f\n",
			k.Seconds()/coroner.Seconds(), (k+300*time.Second-o.toleration).Seconds()/coroner.Seconds())
	}
}

// phaseList is the phases a pod went through, in order.
func phaseList(ps []corev1.PodPhase) string {
	var s []string
	for _, p := range ps {
		s = append(s, string(p))
	}
	if len(s) == 0 {
		return "-"
	}
	return strings.Join(s, ">")
}

// kueueErrors prints the error lines Kueue's manager logged since start: an error loop
// over a pod coroner recovered first would show there.
func kueueErrors(ctx context.Context, cfg lab.Config, start time.Time) {
	cmd := exec.CommandContext(ctx, filepath.Join(cfg.BinDir, "kubectl"), "--kubeconfig="+cfg.Kubeconfig(), "-n", "kueue-system",
		"logs", "deployment/kueue-controller-manager", "--since-time="+start.UTC().Format(time.RFC3339))
	out, err := cmd.Output()
	if err != nil {
		fmt.Printf("Kueue's log: %v\n", err)
		return
	}
	var errs []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, `"level":"error"`) || strings.HasPrefix(l, "E") && strings.Contains(l, namespace) {
			errs = append(errs, l)
		}
	}
	fmt.Printf("Kueue's manager logged %d error lines during the two partitions\n", len(errs))
	for i, l := range errs {
		if i == 5 {
			fmt.Printf("  ... %d more\n", len(errs)-5)
			break
		}
		fmt.Printf("  %.300s\n", l)
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
