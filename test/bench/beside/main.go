// Command beside measures the agent beside the built-in Job controller (issue 19, item
// 3): on the lab that is up, Jobs without spec.managedBy (so kube-controller-manager's Job
// controller runs them, not coroner-shim) whose podFailurePolicy decides on the agent's
// stamps alone:
//
//	rule 0: FailJob on coroner.dev/OOMKilled   (a pod over its own memory limit)
//	rule 1: FailJob on DisruptionTarget        (the agent's NodeOOMKill)
//
// with backoffLimit 0, so a Job's end says which way its one pod was judged: reason
// PodFailurePolicy naming rule 0 or 1 (decided by the rule), or BackoffLimitExceeded (the
// built-in controller saw the pod Failed before the stamp and counted an ordinary
// failure: a miscount). FailJob on a node OOM is not what a user would choose (Ignore
// is); it is chosen here because it ends the Job at once either way.
//
// Per node: -limit-ooms Jobs whose pod goes over its own 24Mi limit (memhog), -parallel
// at a time, and -node-ooms Jobs one after the other whose pod grows until the node's
// kubepods cgroup is squeezed (lab.Config.OOM, scope node) and the kernel kills it. The
// nodes run at the same time. A watch on the pods gives the order of the two writes that
// race: the first version of the pod with phase Failed and the first with the stamp, in
// the API server's order (resourceVersion), and the time between them as seen by the
// watch. The table and _output/bench/beside.json say, per node configuration, how many
// Jobs their rule decided, how many were miscounted, and how often the stamp came first,
// in the same write as Failed, or after it (the built-in controller then still judges by
// the rule when the stamp lands within its batching delay of about a second).
//
// Root; never brings a lab up or down (make lab first).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/test/bench/measure"
	"github.com/coroner-dev/coroner/test/images"
	kindlab "github.com/coroner-dev/coroner/test/kind"
	"github.com/coroner-dev/coroner/test/lab"
)

const (
	vmTaintKey = "lab.coroner.dev/vm"
	runLabel   = "bench.coroner.dev/beside"
)

type options struct {
	nodes      []string
	vm         bool
	kind       bool
	limitOOMs  int
	nodeOOMs   int
	vmLimit    int
	vmNode     int
	parallel   int
	vmParallel int
	namespace  string
	out        string
	jobTimeout time.Duration
}

func main() {
	o := options{nodes: []string{"lab-node-1", "lab-node-2", "lab-node-3"}, vm: true,
		limitOOMs: 200, nodeOOMs: 50, vmLimit: 200, vmNode: 50, parallel: 6, vmParallel: 2,
		namespace: "bench-beside", out: "_output/bench/beside.json", jobTimeout: 3 * time.Minute}
	fs := flag.NewFlagSet("beside", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "Usage: go run ./test/bench/beside [flags]\n\nThe agent beside the built-in Job controller, on the lab that is up: OOM Jobs without\nmanagedBy whose podFailurePolicy rules match only the agent's stamps; how many each rule\ndecided vs how many the built-in controller counted as ordinary failures. Root.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	measure.NodesFlag(fs, &o.nodes, "comma-separated process nodes")
	fs.BoolVar(&o.vm, "vm", o.vm, "also the VM node, when the lab has it Ready")
	fs.BoolVar(&o.kind, "kind", o.kind, "on the kind cluster that is up (make kind-lab) instead of the lab: its workers, -nodes and -vm ignored; node OOMs squeeze a worker's kubepods cgroup below its node container")
	fs.IntVar(&o.limitOOMs, "limit-ooms", o.limitOOMs, "limit-OOM Jobs per process node")
	fs.IntVar(&o.nodeOOMs, "node-ooms", o.nodeOOMs, "node-OOM Jobs per process node (one at a time)")
	fs.IntVar(&o.vmLimit, "vm-limit-ooms", o.vmLimit, "limit-OOM Jobs on the VM node")
	fs.IntVar(&o.vmNode, "vm-node-ooms", o.vmNode, "node-OOM Jobs on the VM node")
	fs.IntVar(&o.parallel, "parallel", o.parallel, "limit-OOM Jobs running at once per process node")
	fs.IntVar(&o.vmParallel, "vm-parallel", o.vmParallel, "limit-OOM Jobs running at once on the VM node (TCG: at 6 its kubelet took over 3 min to report a pod Failed)")
	fs.StringVar(&o.namespace, "namespace", o.namespace, "namespace prefix (one namespace per node, made fresh, deleted after)")
	fs.StringVar(&o.out, "out", o.out, "where to write the results (JSON)")
	fs.DurationVar(&o.jobTimeout, "job-timeout", o.jobTimeout, "longest wait for one Job to finish (4 times this on the VM node)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	var errs []error
	if o.limitOOMs < 0 || o.nodeOOMs < 0 || o.vmLimit < 0 || o.vmNode < 0 {
		errs = append(errs, errors.New("counts must be >= 0"))
	}
	if o.parallel < 1 || o.vmParallel < 1 {
		errs = append(errs, fmt.Errorf("-parallel=%d -vm-parallel=%d: need at least 1", o.parallel, o.vmParallel))
	}
	if len(o.nodes) == 0 && !o.vm && !o.kind {
		errs = append(errs, errors.New("no nodes: -nodes is empty and -vm=false"))
	}
	if err := errors.Join(errs...); err != nil {
		fmt.Fprintln(os.Stderr, "bench-beside:", err)
		os.Exit(2)
	}
	measure.Main("bench-beside", "node OOMs lower the nodes' kubepods cgroup limits", func(ctx context.Context) error {
		if o.kind {
			return runKind(ctx, o)
		}
		return run(ctx, o)
	})
}

func say(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// kind is the kind of OOM a Job's pod meets.
type kind string

const (
	limitOOM kind = "limit"
	nodeOOM  kind = "node"
)

// jobResult is one Job's end and its pod's race.
type jobResult struct {
	Job  string `json:"job"`
	Kind kind   `json:"kind"`
	// Verdict: "rule0" (OOMKilled), "rule1" (DisruptionTarget), "counted" (an ordinary
	// failure: BackoffLimitExceeded), "no-oom" (the pod was not OOM-killed: the run's
	// fault), "timeout", or "interrupted" (the run was stopped: left out of the table).
	Verdict string `json:"verdict"`
	// Order: "stamp-first", "same-write", "failed-first" (the stamp came later),
	// "no-stamp".
	Order string `json:"order"`
	// LeadMs is the time from the stamp to phase Failed, as the watch saw them (negative:
	// the stamp came after).
	LeadMs  float64 `json:"leadMs"`
	Message string  `json:"message,omitempty"`
}

type nodeReport struct {
	Node    string      `json:"node"`
	Runtime string      `json:"runtime"`
	Config  string      `json:"config"`
	Jobs    []jobResult `json:"jobs"`
}

func run(ctx context.Context, o options) error {
	began := time.Now()
	cfg, cs, err := measure.UpLab(ctx)
	if err != nil {
		return err
	}
	names, note := measure.WithVMNode(ctx, cs, o.nodes, o.vm)
	if note != "" {
		say("%s", note)
	}
	var benches []*bench
	for _, name := range names {
		n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		ln, err := cfg.NodeNamed(name)
		if err != nil {
			return err
		}
		b := &bench{cs: cs, node: name, vm: ln.IsVM(), ns: o.namespace + "-" + name,
			parallel: o.parallel, jobTimeout: o.jobTimeout, limits: o.limitOOMs, nodes: o.nodeOOMs,
			config: describe(ln, n), runtime: n.Status.NodeInfo.ContainerRuntimeVersion,
			squeeze: func(ctx context.Context, pod *corev1.Pod) (lab.OOMResult, error) {
				return cfg.OOM(ctx, pod, lab.OOMNode, 30*time.Second)
			}}
		if ln.IsVM() {
			b.parallel, b.jobTimeout, b.limits, b.nodes = o.vmParallel, 4*o.jobTimeout, o.vmLimit, o.vmNode
		}
		benches = append(benches, b)
	}
	return runAll(ctx, o, benches, began)
}

// runKind is run on the kind cluster that is up: its workers, each a node container of
// our dockerd (containerd 2.x with CRI events, the systemd cgroup driver, cgroupRoot
// /kubelet), node OOMs squeezing the worker's kubepods cgroup from this machine.
func runKind(ctx context.Context, o options) error {
	began := time.Now()
	kc, err := kindlab.New()
	if err != nil {
		return err
	}
	kc.Log = os.Stderr
	rc, err := clientcmd.BuildConfigFromFlags("", kc.Kubeconfig())
	if err != nil {
		return fmt.Errorf("the kind cluster's kubeconfig (make kind-lab first): %w", err)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	var benches []*bench
	for i := range kc.Workers {
		name := kc.Cluster + "-worker"
		if i > 0 {
			name += fmt.Sprint(i + 1)
		}
		n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("kind worker %s (make kind-lab first): %w", name, err)
		}
		benches = append(benches, &bench{cs: cs, node: name, ns: o.namespace + "-" + name,
			parallel: o.parallel, jobTimeout: o.jobTimeout, limits: o.limitOOMs, nodes: o.nodeOOMs,
			runtime: n.Status.NodeInfo.ContainerRuntimeVersion,
			config:  n.Status.NodeInfo.ContainerRuntimeVersion + ", CRI events, kind (a node in a privileged container, systemd cgroup driver, cgroupRoot /kubelet)",
			squeeze: func(ctx context.Context, _ *corev1.Pod) (lab.OOMResult, error) {
				return kc.NodeOOM(ctx, name, 30*time.Second)
			}})
	}
	return runAll(ctx, o, benches, began)
}

// runAll runs the nodes' benches at once, prints the table and writes the results, also
// of a run cut short.
func runAll(ctx context.Context, o options, benches []*bench, began time.Time) error {
	reports := make([]*nodeReport, len(benches))
	errs := make([]error, len(benches))
	var wg sync.WaitGroup
	for i, b := range benches {
		reports[i] = &nodeReport{Node: b.node, Runtime: b.runtime, Config: b.config}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = b.run(ctx, reports[i])
		}()
	}
	wg.Wait()
	// What was measured is kept when the run was cut short (an interrupt, a node's error).
	printTable(reports)
	if err := os.MkdirAll(filepath.Dir(o.out), 0o755); err != nil {
		return err
	}
	b, _ := json.MarshalIndent(map[string]any{"started": began.UTC(), "took": time.Since(began).Round(time.Second).String(), "nodes": reports}, "", "  ")
	if err := os.WriteFile(o.out, b, 0o644); err != nil {
		return err
	}
	say("results in %s (%s)", o.out, time.Since(began).Round(time.Second))
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for _, r := range reports {
		for _, j := range r.Jobs {
			if j.Verdict == "counted" || j.Verdict == "timeout" {
				return fmt.Errorf("%s: Jobs the rule did not decide (see the table)", r.Node)
			}
		}
	}
	return nil
}

func describe(ln lab.Node, n *corev1.Node) string {
	rt := n.Status.NodeInfo.ContainerRuntimeVersion
	switch {
	case ln.IsVM():
		return rt + ", systemd, cgroup v2 (QEMU VM)"
	case strings.Contains(rt, "://2."):
		return rt + ", CRI events"
	default:
		return rt + ", relist"
	}
}

// bench runs one node's Jobs in its own namespace.
type bench struct {
	cs   kubernetes.Interface
	node string
	vm   bool
	ns   string
	// runtime and config describe the node in the table.
	runtime, config string
	// parallel, jobTimeout and the counts are the node's: the VM node's are its own.
	parallel      int
	jobTimeout    time.Duration
	limits, nodes int
	// squeeze makes the kernel OOM-kill a task among the node's pods (the pod's, it grows).
	squeeze func(context.Context, *corev1.Pod) (lab.OOMResult, error)

	mu   sync.Mutex
	pods map[string]*race // by Job name
}

// race is what the watch saw of a Job's pod: the first version Failed, the first stamped.
type race struct {
	pod               string
	failedRV, stampRV int64
	failedAt, stampAt time.Time
	seen              chan struct{} // closed at the first Failed version
}

func (b *bench) run(ctx context.Context, r *nodeReport) error {
	limits, nodes := b.limits, b.nodes
	if err := lab.FreshNamespace(ctx, b.cs, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: b.ns}}, 3*time.Minute); err != nil {
		return err
	}
	defer func() { _ = b.cs.CoreV1().Namespaces().Delete(context.Background(), b.ns, metav1.DeleteOptions{}) }()
	b.pods = map[string]*race{}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := b.watchPods(wctx); err != nil {
		return err
	}
	say("%s: %d limit-OOM Jobs (%d at a time), then %d node-OOM Jobs", b.node, limits, b.parallel, nodes)
	var mu sync.Mutex
	sem := make(chan struct{}, b.parallel)
	var wg sync.WaitGroup
	for i := range limits {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return ctx.Err()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			res := b.one(ctx, fmt.Sprintf("limit-%03d", i), limitOOM)
			mu.Lock()
			r.Jobs = append(r.Jobs, res)
			mu.Unlock()
		}()
	}
	wg.Wait()
	say("%s: limit OOMs done", b.node)
	for i := range nodes {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// A node the kubelet says is under memory pressure refuses new pods (for its
		// pressure transition period, 5 minutes): wait it out rather than lose a Job.
		if err := lab.Poll(ctx, 10*time.Minute, b.node+" without MemoryPressure", func() (bool, error) {
			n, err := b.cs.CoreV1().Nodes().Get(ctx, b.node, metav1.GetOptions{})
			return err == nil && !measure.NodeCondition(n, corev1.NodeMemoryPressure), nil
		}); err != nil {
			return err
		}
		r.Jobs = append(r.Jobs, b.one(ctx, fmt.Sprintf("node-%03d", i), nodeOOM))
	}
	say("%s: node OOMs done", b.node)
	return ctx.Err()
}

// watchPods follows the namespace's pods (a watch that resumes where it broke) and
// records, per Job, the first version of its pod with phase Failed and the first with a
// stamp (coroner.dev/OOMKilled or DisruptionTarget True).
func (b *bench) watchPods(ctx context.Context) error {
	l, err := b.cs.CoreV1().Pods(b.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	return measure.WatchPods(ctx, b.cs, b.ns, "", l.ResourceVersion, b.observe)
}

func (b *bench) raceOf(job string) *race {
	b.mu.Lock()
	defer b.mu.Unlock()
	r := b.pods[job]
	if r == nil {
		r = &race{seen: make(chan struct{})}
		b.pods[job] = r
	}
	return r
}

func (b *bench) observe(p *corev1.Pod, at time.Time) {
	job := p.Labels[batchv1.JobNameLabel]
	if job == "" {
		return
	}
	var rv int64
	_, _ = fmt.Sscan(p.ResourceVersion, &rv)
	r := b.raceOf(job)
	b.mu.Lock()
	defer b.mu.Unlock()
	if r.pod == "" {
		r.pod = p.Name
	}
	if p.Name != r.pod {
		return // a second pod would be the built-in controller's; backoffLimit 0 makes none
	}
	if r.stampRV == 0 && stamped(p) {
		r.stampRV, r.stampAt = rv, at
	}
	if r.failedRV == 0 && p.Status.Phase == corev1.PodFailed {
		r.failedRV, r.failedAt = rv, at
		close(r.seen)
	}
}

func stamped(p *corev1.Pod) bool {
	return conditions.IsTrue(&p.Status, conditions.OOMKilled) || conditions.IsTrue(&p.Status, conditions.DisruptionTarget)
}

var ruleIndex = regexp.MustCompile(`rule at index (\d+)`)

// one runs one Job to its end and says how it was judged.
func (b *bench) one(ctx context.Context, name string, k kind) jobResult {
	res := jobResult{Job: name, Kind: k}
	j := b.job(name, k)
	if _, err := b.cs.BatchV1().Jobs(b.ns).Create(ctx, j, metav1.CreateOptions{}); err != nil {
		res.Verdict, res.Message = "timeout", "create: "+err.Error()
		return res
	}
	if k == nodeOOM {
		if err := b.squeezeNode(ctx, name); err != nil {
			res.Message = err.Error()
		}
	}
	var done *batchv1.Job
	err := lab.Poll(ctx, b.jobTimeout, "Job "+name+" to finish", func() (bool, error) {
		got, err := b.cs.BatchV1().Jobs(b.ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range got.Status.Conditions {
			if (c.Type == batchv1.JobFailed || c.Type == batchv1.JobComplete) && c.Status == corev1.ConditionTrue {
				done = got
				return true, nil
			}
		}
		return false, nil
	})
	r := b.raceOf(name)
	if err != nil && ctx.Err() != nil {
		res.Verdict = "interrupted"
		return res
	}
	if err != nil {
		res.Verdict, res.Message = "timeout", strings.TrimSpace(res.Message+" "+err.Error())
		return res
	}
	// The watch may trail the Job's end by a little.
	select {
	case <-r.seen:
	case <-time.After(10 * time.Second):
	}
	b.mu.Lock()
	switch {
	case r.stampRV == 0:
		res.Order = "no-stamp"
	case r.failedRV == 0 || r.stampRV < r.failedRV:
		res.Order = "stamp-first"
	case r.stampRV == r.failedRV:
		res.Order = "same-write"
	default:
		res.Order = "failed-first"
	}
	if r.stampRV != 0 && r.failedRV != 0 {
		res.LeadMs = float64(r.failedAt.Sub(r.stampAt).Microseconds()) / 1000
	}
	b.mu.Unlock()

	for _, c := range done.Status.Conditions {
		if c.Type != batchv1.JobFailed || c.Status != corev1.ConditionTrue {
			continue
		}
		res.Message = strings.TrimSpace(res.Message + " " + c.Reason + ": " + c.Message)
		switch c.Reason {
		case batchv1.JobReasonPodFailurePolicy:
			if m := ruleIndex.FindStringSubmatch(c.Message); m != nil {
				res.Verdict = "rule" + m[1]
			}
		case batchv1.JobReasonBackoffLimitExceeded:
			res.Verdict = "counted"
		}
	}
	if res.Verdict == "" {
		res.Verdict = "other"
	}
	if oom, how := b.podOOMKilled(ctx, name); !oom {
		// Rejected or evicted by the kubelet (MemoryPressure), never squeezed, or a
		// container that never started: no OOM kill, so no race to judge.
		res.Verdict = "no-oom"
		res.Message = strings.TrimSpace(res.Message + "; the pod: " + how)
	}
	_ = b.cs.BatchV1().Jobs(b.ns).Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)})
	return res
}

// podOOMKilled tells whether the Job's pod ended OOM-killed (exit 137 or the runtime's
// OOMKilled): a Job counted without one was not a race the agent could win. how says
// what the pod's status said otherwise.
func (b *bench) podOOMKilled(ctx context.Context, job string) (bool, string) {
	pods, err := b.cs.CoreV1().Pods(b.ns).List(ctx, metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + job})
	if err != nil {
		return true, ""
	}
	var how []string
	for _, p := range pods.Items {
		how = append(how, fmt.Sprintf("%s %s %s %s", p.Name, p.Status.Phase, p.Status.Reason, p.Status.Message))
		for _, s := range p.Status.ContainerStatuses {
			if t := s.State.Terminated; t != nil {
				if t.ExitCode == 137 || t.Reason == "OOMKilled" {
					return true, ""
				}
				how = append(how, fmt.Sprintf("container %s exit %d %s %s", s.Name, t.ExitCode, t.Reason, t.Message))
			} else if w := s.State.Waiting; w != nil {
				how = append(how, fmt.Sprintf("container %s waiting %s %s", s.Name, w.Reason, w.Message))
			}
		}
	}
	return false, strings.Join(how, "; ")
}

// squeezeNode waits for the node-OOM Job's pod to run and grow, then squeezes the node's
// kubepods cgroup until the kernel kills it.
func (b *bench) squeezeNode(ctx context.Context, job string) error {
	var pod *corev1.Pod
	err := lab.Poll(ctx, b.jobTimeout, "the pod of "+job+" to run", func() (bool, error) {
		pods, err := b.cs.CoreV1().Pods(b.ns).List(ctx, metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + job})
		if err != nil || len(pods.Items) == 0 {
			return false, nil
		}
		pod = &pods.Items[0]
		if pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded {
			return false, fmt.Errorf("pod %s ended %s before it ran (%s)", pod.Name, pod.Status.Phase, pod.Status.Message)
		}
		return pod.Status.Phase == corev1.PodRunning, nil
	})
	if err != nil {
		return err
	}
	grow := 2 * time.Second
	if b.vm {
		grow = 5 * time.Second
	}
	if err := lab.Sleep(ctx, grow); err != nil {
		return err
	}
	res, err := b.squeeze(ctx, pod)
	if err != nil {
		return fmt.Errorf("squeeze for %s: %w", pod.Name, err)
	}
	if res.Kills == 0 {
		return fmt.Errorf("squeeze for %s: no kill in %v", pod.Name, res.Took)
	}
	return nil
}

func (b *bench) job(name string, k kind) *batchv1.Job {
	c := corev1.Container{Name: "main", Image: images.BusyboxName, ImagePullPolicy: corev1.PullNever}
	switch k {
	case limitOOM:
		c.Command = []string{"memhog"}
		c.Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("24Mi")}
	case nodeOOM:
		// As the e2e suite's node OOM: memhog grows to a cap that protects the host; on the
		// VM slowly, clear of the kubelet's memory-pressure eviction.
		c.Command = []string{"memhog", "-step-mib", "2", "-interval", "50ms", "-max-mib", "1024"}
		if b.vm {
			c.Command = []string{"memhog", "-step-mib", "1", "-interval", "200ms", "-max-mib", "500"}
		}
	}
	spec := corev1.PodSpec{
		NodeName: b.node, RestartPolicy: corev1.RestartPolicyNever,
		TerminationGracePeriodSeconds: ptr.To[int64](1),
		Containers:                    []corev1.Container{c},
	}
	if b.vm {
		spec.Tolerations = []corev1.Toleration{{Key: vmTaintKey, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
	}
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: b.ns, Labels: map[string]string{runLabel: string(k)}},
		Spec: batchv1.JobSpec{
			BackoffLimit: ptr.To[int32](0),
			PodFailurePolicy: &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{
				{Action: batchv1.PodFailurePolicyActionFailJob, OnPodConditions: []batchv1.PodFailurePolicyOnPodConditionsPattern{{Type: conditions.OOMKilled, Status: corev1.ConditionTrue}}},
				{Action: batchv1.PodFailurePolicyActionFailJob, OnPodConditions: []batchv1.PodFailurePolicyOnPodConditionsPattern{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue}}},
			}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{runLabel: string(k)}}, Spec: spec},
		},
	}
}

func printTable(reports []*nodeReport) {
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "node\tconfiguration\tOOM\tJobs\tby its rule\tmiscounted\twrong rule\tnot OOM/timeout\tstamp first\tsame write\tstamp after Failed\tno stamp\tlead p1 / p50 / min")
	for _, r := range reports {
		for _, k := range []kind{limitOOM, nodeOOM} {
			var n, byRule, counted, wrong, other, first, same, after, none int
			var leads []time.Duration
			want := map[kind]string{limitOOM: "rule0", nodeOOM: "rule1"}[k]
			for _, j := range r.Jobs {
				if j.Kind != k || j.Verdict == "interrupted" {
					continue
				}
				n++
				switch {
				case j.Verdict == want:
					byRule++
				case j.Verdict == "counted":
					counted++
				case strings.HasPrefix(j.Verdict, "rule"):
					wrong++
				default:
					other++
				}
				switch j.Order {
				case "stamp-first":
					first++
				case "same-write":
					same++
				case "failed-first":
					after++
				default:
					none++
				}
				if j.Order == "stamp-first" || j.Order == "same-write" || j.Order == "failed-first" {
					leads = append(leads, time.Duration(j.LeadMs*float64(time.Millisecond)))
				}
			}
			if n == 0 {
				continue
			}
			lead := "-"
			if len(leads) > 0 {
				lead = fmt.Sprintf("%v / %v / %v", measure.Percentile(leads, 1).Round(time.Millisecond),
					measure.Percentile(leads, 50).Round(time.Millisecond), slices.Min(leads).Round(time.Millisecond))
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\n", r.Node, r.Config, k, n, byRule, counted, wrong, other, first, same, after, none, lead)
		}
	}
	w.Flush()
}
