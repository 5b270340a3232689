// Command device measures the agent's device verdict beside the built-in Job controller
// (issue 37, items 3, 6 and 7): on the lab that is up (or the kind cluster), Jobs without
// spec.managedBy, so kube-controller-manager's Job controller runs them, whose one pod
// holds a test GPU (coroner.dev/test-gpu, the lab's real device plugin) and whose
// podFailurePolicy decides on the agent's stamp alone:
//
//	rule 0: FailJob on coroner.dev/DeviceFailed   (the agent's device verdict)
//
// with backoffLimit 0, so a Job's end says how its pod was judged: reason PodFailurePolicy
// (decided by the rule: the stamp was on the pod when the built-in controller judged it)
// or BackoffLimitExceeded (the controller counted the pod as an ordinary failure before
// the stamp: a miscount). FailJob is not what a user would write for a device failure
// (Ignore is); it ends the Job at once either way.
//
// Each Job's program watches its device's health file and exits 1 the moment the device
// fails, as a CUDA program dies when its GPU falls off the bus: the hardest race for the
// agent, whose verdict needs the kubelet's word (the device Unhealthy in the pod's
// allocatedResourcesStatus) and comes after the death. The bench turns the device
// Unhealthy through the plugin's control API at t0 and follows the pod through a watch:
// when the kubelet's status first shows the device Unhealthy, when the agent's stamp
// lands, when the pod is Failed, in the API server's order (resourceVersion) and by the
// watch's clock. The verdict's latency is t0 to the stamp: t0 comes before both the
// device's failure in the pod's status and the program's death (it dies within 0.1 s of
// the health file's change, which the plugin writes before its ListAndWatch update).
//
// Per node, -parallel Jobs at a time (each node has two test GPUs), -failures in all;
// the nodes run at the same time. The table and _output/bench/device.json say, per node
// configuration, how many Jobs the rule decided, how many were miscounted, the order of
// the stamp and Failed, and the latencies p50/p99.
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
	"github.com/coroner-dev/coroner/test/deviceplugin"
	"github.com/coroner-dev/coroner/test/images"
	kindlab "github.com/coroner-dev/coroner/test/kind"
	"github.com/coroner-dev/coroner/test/lab"
	"github.com/coroner-dev/coroner/test/wrappers"
)

const testGPU = corev1.ResourceName(lab.TestGPUResource)

const vmTaintKey = "lab.coroner.dev/vm"

// program dies the moment its device is not Healthy (the plugin mounts the device's
// health file at /run/coroner-test-gpu/ID), and gives up after 5 minutes.
const program = `f=/run/coroner-test-gpu/$CORONER_TEST_GPU
i=0
while [ $i -lt 3000 ]; do
  [ "$(cat $f)" = Healthy ] || exit 1
  sleep 0.1
  i=$((i+1))
done
exit 0`

type options struct {
	nodes      []string
	vm, kind   bool
	failures   int
	vmFailures int
	parallel   int
	namespace  string
	out        string
	jobTimeout time.Duration
}

func main() {
	o := options{nodes: []string{"lab-node-1", "lab-node-2", "lab-node-3"}, vm: true,
		failures: 100, vmFailures: 100, parallel: 2,
		namespace: "bench-device", out: "_output/bench/device.json", jobTimeout: 2 * time.Minute}
	fs := flag.NewFlagSet("device", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "Usage: go run ./test/bench/device [flags]\n\nThe agent's device verdict beside the built-in Job controller, on the lab that is up:\nJobs without managedBy whose pod dies the moment its test GPU fails; how many the\nFailJob-on-coroner.dev/DeviceFailed rule decided vs how many the built-in controller\ncounted first, and the verdict's latency beside the kubelet's own status update. Root.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	measure.NodesFlag(fs, &o.nodes, "comma-separated process nodes")
	fs.BoolVar(&o.vm, "vm", o.vm, "also the VM node, when the lab has it Ready")
	fs.BoolVar(&o.kind, "kind", o.kind, "on the kind cluster that is up (make kind-lab) instead of the lab: its workers; -nodes and -vm ignored")
	fs.IntVar(&o.failures, "failures", o.failures, "device failures (one Job each) per node")
	fs.IntVar(&o.vmFailures, "vm-failures", o.vmFailures, "device failures on the VM node")
	fs.IntVar(&o.parallel, "parallel", o.parallel, "Jobs at once per node (each node has 2 test GPUs)")
	fs.StringVar(&o.namespace, "namespace", o.namespace, "namespace prefix (one namespace per node, made fresh, deleted after)")
	fs.StringVar(&o.out, "out", o.out, "where to write the results (JSON)")
	fs.DurationVar(&o.jobTimeout, "job-timeout", o.jobTimeout, "longest wait for one Job to finish (4 times this on the VM node)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	var errs []error
	if o.failures < 1 || o.vmFailures < 0 {
		errs = append(errs, fmt.Errorf("-failures=%d -vm-failures=%d: need at least 1 (and 0 or more on the VM)", o.failures, o.vmFailures))
	}
	if o.parallel < 1 || o.parallel > 2 {
		errs = append(errs, fmt.Errorf("-parallel=%d: 1 or 2 (a node has 2 test GPUs)", o.parallel))
	}
	if len(o.nodes) == 0 && !o.vm && !o.kind {
		errs = append(errs, errors.New("no nodes: -nodes is empty and -vm=false"))
	}
	if err := errors.Join(errs...); err != nil {
		fmt.Fprintln(os.Stderr, "bench-device:", err)
		os.Exit(2)
	}
	measure.Main("bench-device", "the test GPUs' control sockets are root's", func(ctx context.Context) error {
		if o.kind {
			return runKind(ctx, o)
		}
		return run(ctx, o)
	})
}

func say(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// control opens a client of a node's test GPU control API; the function releases it.
type control func(ctx context.Context) (*deviceplugin.ControlClient, func(), error)

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
			parallel: o.parallel, jobTimeout: o.jobTimeout, failures: o.failures,
			runtime: n.Status.NodeInfo.ContainerRuntimeVersion, config: describe(ln, n),
			control: func(ctx context.Context) (*deviceplugin.ControlClient, func(), error) {
				cl, _, release, err := cfg.TestGPUClient(ctx, name)
				return cl, release, err
			}}
		if ln.IsVM() {
			b.jobTimeout, b.failures = 4*o.jobTimeout, o.vmFailures
		}
		if b.failures > 0 {
			benches = append(benches, b)
		}
	}
	return runAll(ctx, o, benches, began)
}

// runKind is run on the kind cluster's workers.
func runKind(ctx context.Context, o options) error {
	began := time.Now()
	kc, err := kindlab.New()
	if err != nil {
		return err
	}
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
			parallel: o.parallel, jobTimeout: o.jobTimeout, failures: o.failures,
			runtime: n.Status.NodeInfo.ContainerRuntimeVersion,
			config:  n.Status.NodeInfo.ContainerRuntimeVersion + ", kind (a node in a privileged container, systemd cgroup driver)",
			control: func(ctx context.Context) (*deviceplugin.ControlClient, func(), error) {
				gc, release, err := kc.TestGPUDevices(ctx, name)
				return gc.Client, release, err
			}})
	}
	return runAll(ctx, o, benches, began)
}

func describe(ln lab.Node, n *corev1.Node) string {
	rt := n.Status.NodeInfo.ContainerRuntimeVersion
	switch {
	case ln.IsVM():
		return rt + ", systemd, cgroup v2 (QEMU VM)"
	case strings.Contains(rt, "://2."):
		return rt + ", CRI events, a process node"
	default:
		return rt + ", relist, a process node"
	}
}

// jobResult is one Job's end and its pod's race.
type jobResult struct {
	Job    string `json:"job"`
	Device string `json:"device"`
	// Verdict: "rule0" (the FailJob rule on coroner.dev/DeviceFailed decided), "counted"
	// (BackoffLimitExceeded: the built-in controller counted the pod before the stamp),
	// "no-failure" (the pod did not die of the device: the run's fault), "timeout", or
	// "interrupted" (left out of the table).
	Verdict string `json:"verdict"`
	// Order of the stamp and phase Failed in the API server: "stamp-first", "same-write",
	// "failed-first", "no-stamp".
	Order string `json:"order"`
	// From t0 (the device failed in the plugin), by the watch's clock: the kubelet's
	// Unhealthy in the pod's status, the agent's stamp, phase Failed. -1 when not seen.
	UnhealthyMs float64 `json:"unhealthyMs"`
	StampMs     float64 `json:"stampMs"`
	FailedMs    float64 `json:"failedMs"`
	Message     string  `json:"message,omitempty"`
}

type nodeReport struct {
	Node    string      `json:"node"`
	Runtime string      `json:"runtime"`
	Config  string      `json:"config"`
	Jobs    []jobResult `json:"jobs"`
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
	printTable(reports)
	if err := os.MkdirAll(filepath.Dir(o.out), 0o755); err != nil {
		return err
	}
	out, _ := json.MarshalIndent(map[string]any{"started": began.UTC(), "took": time.Since(began).Round(time.Second).String(), "nodes": reports}, "", "  ")
	if err := os.WriteFile(o.out, out, 0o644); err != nil {
		return err
	}
	say("results in %s (%s)", o.out, time.Since(began).Round(time.Second))
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for _, r := range reports {
		for _, j := range r.Jobs {
			if j.Verdict == "timeout" || j.Verdict == "no-failure" {
				return fmt.Errorf("%s: Jobs that did not run their race (see the table and %s)", r.Node, o.out)
			}
		}
	}
	return nil
}

// bench runs one node's Jobs in its own namespace.
type bench struct {
	cs              kubernetes.Interface
	node            string
	vm              bool
	ns              string
	runtime, config string
	parallel        int
	jobTimeout      time.Duration
	failures        int
	control         control

	mu    sync.Mutex
	races map[string]*race // by Job name
}

// race is what the watch saw of a Job's pod.
type race struct {
	pod                            string
	device                         string
	unhealthyAt, stampAt, failedAt time.Time
	stampRV, failedRV              int64
	failed                         chan struct{} // closed at the first Failed version
}

func (b *bench) run(ctx context.Context, r *nodeReport) error {
	if err := lab.FreshNamespace(ctx, b.cs, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: b.ns}}, 3*time.Minute); err != nil {
		return err
	}
	defer func() { _ = b.cs.CoreV1().Namespaces().Delete(context.Background(), b.ns, metav1.DeleteOptions{}) }()
	cl, release, err := b.control(ctx)
	if err != nil {
		return fmt.Errorf("%s: the test GPU plugin: %w", b.node, err)
	}
	defer release()
	devs, err := cl.List(ctx)
	if err != nil {
		return fmt.Errorf("%s: the test GPU plugin: %w", b.node, err)
	}
	for _, d := range devs {
		if _, err := cl.Heal(ctx, d.ID); err != nil {
			return fmt.Errorf("%s: heal %s: %w", b.node, d.ID, err)
		}
	}
	b.races = map[string]*race{}
	l, err := b.cs.CoreV1().Pods(b.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := measure.WatchPods(wctx, b.cs, b.ns, "", l.ResourceVersion, b.observe); err != nil {
		return err
	}
	say("%s: %d device failures, %d at a time", b.node, b.failures, b.parallel)
	var mu sync.Mutex
	sem := make(chan struct{}, b.parallel)
	var wg sync.WaitGroup
	for i := range b.failures {
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
			res := b.one(ctx, cl, fmt.Sprintf("gpu-%03d", i))
			mu.Lock()
			r.Jobs = append(r.Jobs, res)
			done := len(r.Jobs)
			mu.Unlock()
			if done%20 == 0 {
				say("%s: %d of %d", b.node, done, b.failures)
			}
		}()
	}
	wg.Wait()
	return ctx.Err()
}

func (b *bench) raceOf(job string) *race {
	b.mu.Lock()
	defer b.mu.Unlock()
	r := b.races[job]
	if r == nil {
		r = &race{failed: make(chan struct{})}
		b.races[job] = r
	}
	return r
}

// observe records, per Job, the first version of its pod whose status shows its device
// Unhealthy, the first with the agent's stamp (coroner.dev/DeviceFailed True), the first
// Failed.
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
		return // backoffLimit 0 makes no second pod
	}
	if r.device == "" {
		r.device = podGPU(p)
	}
	if r.unhealthyAt.IsZero() && r.device != "" && lab.TestGPUHealth(p, r.device) == corev1.ResourceHealthStatusUnhealthy {
		r.unhealthyAt = at
	}
	if r.stampRV == 0 && conditions.IsTrue(&p.Status, conditions.DeviceFailed) {
		r.stampRV, r.stampAt = rv, at
	}
	if r.failedRV == 0 && p.Status.Phase == corev1.PodFailed {
		r.failedRV, r.failedAt = rv, at
		close(r.failed)
	}
}

// one runs one Job: its pod running with its device, the device failed, the Job's end.
func (b *bench) one(ctx context.Context, cl *deviceplugin.ControlClient, name string) jobResult {
	res := jobResult{Job: name, UnhealthyMs: -1, StampMs: -1, FailedMs: -1}
	if _, err := b.cs.BatchV1().Jobs(b.ns).Create(ctx, b.job(name), metav1.CreateOptions{}); err != nil {
		res.Verdict, res.Message = "timeout", "create: "+err.Error()
		return res
	}
	defer func() {
		_ = b.cs.BatchV1().Jobs(b.ns).Delete(context.Background(), name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)})
	}()
	r := b.raceOf(name)
	// Running, with the device the kubelet allocated named in its status.
	var dev string
	err := lab.Poll(ctx, b.jobTimeout, "Job "+name+"'s pod running with its device", func() (bool, error) {
		pods, err := b.cs.CoreV1().Pods(b.ns).List(ctx, metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + name})
		if err != nil || len(pods.Items) == 0 {
			return false, nil
		}
		p := &pods.Items[0]
		dev = podGPU(p)
		return p.Status.Phase == corev1.PodRunning && dev != "" && lab.TestGPUHealth(p, dev) == corev1.ResourceHealthStatusHealthy, nil
	})
	if err != nil {
		return interrupted(ctx, res, err)
	}
	res.Device = dev
	t0 := time.Now()
	if _, err := cl.Fail(ctx, dev); err != nil {
		res.Verdict, res.Message = "timeout", "fail "+dev+": "+err.Error()
		return res
	}
	// The device is healed once the pod is Failed (the next Job may get it).
	defer func() {
		hctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := cl.Heal(hctx, dev); err != nil {
			say("%s: heal %s: %v", b.node, dev, err)
		}
	}()
	var done *batchv1.Job
	err = lab.Poll(ctx, b.jobTimeout, "Job "+name+" to finish", func() (bool, error) {
		got, err := b.cs.BatchV1().Jobs(b.ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		if c := finished(got); c != nil {
			done = got
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		return interrupted(ctx, res, err)
	}
	select { // the watch may trail the Job's end a little
	case <-r.failed:
	case <-time.After(10 * time.Second):
	}
	b.mu.Lock()
	ms := func(at time.Time) float64 {
		if at.IsZero() {
			return -1
		}
		return float64(at.Sub(t0).Microseconds()) / 1000
	}
	res.UnhealthyMs, res.StampMs, res.FailedMs = ms(r.unhealthyAt), ms(r.stampAt), ms(r.failedAt)
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
	b.mu.Unlock()
	c := finished(done)
	res.Message = c.Reason + ": " + c.Message
	switch {
	case c.Type == batchv1.JobFailed && c.Reason == batchv1.JobReasonPodFailurePolicy && strings.Contains(c.Message, "rule at index 0"):
		res.Verdict = "rule0"
	case c.Type == batchv1.JobFailed && c.Reason == batchv1.JobReasonBackoffLimitExceeded:
		res.Verdict = "counted"
	default:
		res.Verdict = "no-failure"
	}
	return res
}

func interrupted(ctx context.Context, res jobResult, err error) jobResult {
	if ctx.Err() != nil {
		res.Verdict = "interrupted"
		return res
	}
	res.Verdict, res.Message = "timeout", err.Error()
	return res
}

// finished is the Job's terminal condition, or nil.
func finished(j *batchv1.Job) *batchv1.JobCondition {
	for i, c := range j.Status.Conditions {
		if (c.Type == batchv1.JobFailed || c.Type == batchv1.JobComplete) && c.Status == corev1.ConditionTrue {
			return &j.Status.Conditions[i]
		}
	}
	return nil
}

// job is a Job for the built-in controller (no managedBy): one pod holding one test GPU
// on the node, backoffLimit 0, FailJob on the agent's device verdict.
func (b *bench) job(name string) *batchv1.Job {
	j := wrappers.MakeJob(name, b.ns).
		BackoffLimit(0).
		TerminationGracePeriodSeconds(1).
		PodFailurePolicy(wrappers.OnPodCondition(batchv1.PodFailurePolicyActionFailJob, conditions.DeviceFailed)).
		Command("sh", "-c", program).Obj()
	spec := &j.Spec.Template.Spec
	spec.NodeSelector = map[string]string{corev1.LabelHostname: b.node}
	spec.Containers[0].Image, spec.Containers[0].ImagePullPolicy = images.BusyboxName, corev1.PullNever
	spec.Containers[0].Resources.Limits = corev1.ResourceList{testGPU: resource.MustParse("1")}
	if b.vm {
		spec.Tolerations = append(spec.Tolerations, corev1.Toleration{Key: vmTaintKey, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule})
	}
	return j
}

// printTable prints, per node, the Jobs decided and miscounted, the order of the two
// writes, and the latencies from t0.
func printTable(reports []*nodeReport) {
	tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "node\tconfiguration\tJobs\tdecided by the rule\tmiscounted\tstamp first / same write / Failed first\tkubelet Unhealthy p50 / p99\tstamp p50 / p99\tFailed p50 / p99\tother")
	for _, r := range reports {
		var n, rule, counted, first, same, after, other int
		var unhealthy, stamp, failed []time.Duration
		for _, j := range r.Jobs {
			if j.Verdict == "interrupted" {
				continue
			}
			n++
			switch j.Verdict {
			case "rule0":
				rule++
			case "counted":
				counted++
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
			}
			add := func(ds *[]time.Duration, v float64) {
				if v >= 0 {
					*ds = append(*ds, time.Duration(v*float64(time.Millisecond)))
				}
			}
			add(&unhealthy, j.UnhealthyMs)
			add(&stamp, j.StampMs)
			add(&failed, j.FailedMs)
		}
		pp := func(ds []time.Duration) string {
			if len(ds) == 0 {
				return "-"
			}
			return fmt.Sprintf("%v / %v", measure.Percentile(ds, 50).Round(time.Millisecond), measure.Percentile(ds, 99).Round(time.Millisecond))
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d / %d / %d\t%s\t%s\t%s\t%d\n", r.Node, r.Config, n, rule, counted, first, same, after, pp(unhealthy), pp(stamp), pp(failed), other)
	}
	_ = tw.Flush()
}

// podGPU is the test GPU the kubelet says the pod holds (lab.PodTestGPU), "" when none yet.
func podGPU(p *corev1.Pod) string {
	if p == nil {
		return ""
	}
	id, _ := lab.PodTestGPU(p)
	return id
}
