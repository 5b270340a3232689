package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/test/bench/measure"
	"github.com/coroner-dev/coroner/test/harness"
)

// settle is how long the call counters keep counting after the last Job finished: the
// Events and writes a controller makes right after the terminal condition (the pod event
// batching of both is 1s).
const settle = 2 * time.Second

// target is one controller under test.
type target struct {
	name      string // column header
	ns        string
	managedBy string // spec.managedBy of its Jobs; empty for the built-in controller
	ctl       controllerUnderTest
	// The counters at both ends of the measured window.
	before, after       calls
	cpuBefore, cpuAfter time.Duration
	cpuOK               bool
	start               time.Time
	res                 result
}

func run(ctx context.Context, c config) error {
	w := workload{jobs: c.jobs, completions: c.completions, failOncePct: c.failOncePct, failIndexPct: c.failIndexPct}
	mode := "at the same time"
	if c.sequential {
		mode = "one after the other (--sequential)"
	}
	fmt.Fprintln(os.Stderr, "bench-shim: starting etcd + kube-apiserver ...")
	api, err := harness.Start(harness.Options{})
	if err != nil {
		return fmt.Errorf("starting the API server (make tools builds it): %w", err)
	}
	defer api.Stop()

	admin, err := newClient(api.Config, "coroner-bench", 500, 1000, nil)
	if err != nil {
		return err
	}
	targets := []*target{
		{name: "built-in", ns: "bench-builtin"},
		{name: "coroner", ns: "bench-coroner", managedBy: conditions.ManagedBy},
	}
	namespaces := map[string]bool{}
	for _, t := range targets {
		namespaces[t.ns] = true
		if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: t.ns}}, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{}); err != nil {
		return err
	}

	// The controllers.
	fmt.Fprintf(os.Stderr, "bench-shim: starting kube-controller-manager (job controller) and coroner's controller (%s) ...\n", c.coroner)
	kcm, err := startControllerManager(api, c.workers, c.qps, c.burst)
	if err != nil {
		return fmt.Errorf("starting kube-controller-manager: %w", err)
	}
	defer kcm.stop()
	targets[0].ctl = kcm
	shim, err := startCoroner(api, c)
	if err != nil {
		return fmt.Errorf("starting coroner's controller: %w", err)
	}
	defer shim.stop()
	targets[1].ctl = shim

	// The simulated kubelet and the watch of the Jobs.
	rec := newRecorder()
	kctx, kcancel := context.WithCancel(ctx)
	defer kcancel()
	kubeletClient, err := newClient(api.Config, "coroner-bench-kubelet", 1000, 2000, nil)
	if err != nil {
		return err
	}
	k := &kubelet{ctx: kctx, client: kubeletClient, rec: rec, w: w, startDelay: c.startDelay, runTime: c.runTime, namespaces: namespaces}
	watchClient, err := newClient(api.Config, "coroner-bench-watch", 500, 1000, nil)
	if err != nil {
		return err
	}
	factory := informers.NewSharedInformerFactoryWithOptions(watchClient, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = batchv1.JobNameLabel }))
	podInf := factory.Core().V1().Pods().Informer()
	if _, err := podInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { k.podEvent(obj) },
		UpdateFunc: func(_, obj any) { k.podEvent(obj) },
	}); err != nil {
		return err
	}
	// Jobs have no labels: watch them all (this API server has only the benchmark's).
	jobFactory := informers.NewSharedInformerFactory(watchClient, 0)
	jobInf := jobFactory.Batch().V1().Jobs().Informer()
	if _, err := jobInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    rec.jobEvent,
		UpdateFunc: func(_, obj any) { rec.jobEvent(obj) },
	}); err != nil {
		return err
	}
	factory.Start(kctx.Done())
	jobFactory.Start(kctx.Done())
	defer func() {
		kcancel()
		factory.Shutdown()
		jobFactory.Shutdown()
	}()

	// Warm-up: both controllers up, caches synced, one single-pod Job each run to the end.
	sctx, scancel := context.WithTimeout(ctx, c.startTimeout)
	defer scancel()
	if !cache.WaitForCacheSync(sctx.Done(), podInf.HasSynced, jobInf.HasSynced) {
		return fmt.Errorf("the benchmark's watches did not sync within %v", c.startTimeout)
	}
	for _, t := range targets {
		for {
			ok, err := t.ctl.synced(sctx)
			if err != nil {
				return err
			}
			if ok {
				break
			}
			select {
			case err := <-t.ctl.exited():
				return err
			case <-sctx.Done():
				return fmt.Errorf("%s: the controller did not sync its caches within %v", t.name, c.startTimeout)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	for _, t := range targets {
		rec.addJob(t.ns, warmupJob, -1)
		if _, err := admin.BatchV1().Jobs(t.ns).Create(sctx, w.job(t.ns, warmupJob, 1, t.managedBy), metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating the warm-up Job of %s: %w", t.name, err)
		}
	}
	if err := waitFinished(sctx, rec, targets); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	time.Sleep(settle)

	// The measurement.
	fmt.Fprintf(os.Stderr, "bench-shim: kube-apiserver %s; %d Indexed Jobs x %d completions per controller, %s ...\n",
		api.ServerVersion, c.jobs, c.completions, mode)
	rounds := [][]*target{targets}
	if c.sequential {
		rounds = [][]*target{{targets[0]}, {targets[1]}}
	}
	for _, round := range rounds {
		if err := runRound(ctx, c, w, admin, rec, round); err != nil {
			return err
		}
	}

	// The outcomes.
	mismatches, err := compare(ctx, admin, rec, w, targets)
	if err != nil {
		return err
	}
	printTable(c, w, targets, mode)
	if len(mismatches) > 0 {
		return fmt.Errorf("the controllers' outcomes differ (%d problems):\n%s", len(mismatches), strings.Join(mismatches, "\n"))
	}
	fmt.Printf("outcomes: the %d Jobs of each controller agree with each other and with the workload\n", c.jobs)
	return nil
}

func newClient(base *rest.Config, userAgent string, qps float32, burst int, wrap func(rt http.RoundTripper) http.RoundTripper) (kubernetes.Interface, error) {
	cfg := rest.CopyConfig(base)
	cfg.UserAgent = userAgent
	cfg.QPS, cfg.Burst = qps, burst
	if wrap != nil {
		cfg.Wrap(wrap)
	}
	return kubernetes.NewForConfig(cfg)
}

// runRound runs the workload for the targets at the same time: the counters are read, the
// Jobs created (by one goroutine per target, started together), and once every Job of
// the round finished and settle passed, the counters are read again.
func runRound(ctx context.Context, c config, w workload, admin kubernetes.Interface, rec *recorder, ts []*target) error {
	for _, t := range ts {
		s, err := t.ctl.snapshot(ctx)
		if err != nil {
			return err
		}
		t.before = s
		t.cpuBefore, t.cpuOK = t.ctl.cpu()
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(ts))
	startGate := make(chan struct{})
	for _, t := range ts {
		wg.Go(func() {
			<-startGate
			t.start = time.Now()
			for j := range w.jobs {
				name := jobName(j)
				rec.addJob(t.ns, name, j)
				if _, err := admin.BatchV1().Jobs(t.ns).Create(ctx, w.job(t.ns, name, w.completions, t.managedBy), metav1.CreateOptions{}); err != nil {
					errs <- fmt.Errorf("creating Job %s/%s: %w", t.ns, name, err)
					return
				}
			}
		})
	}
	close(startGate)
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	if err := waitFinished(wctx, rec, ts); err != nil {
		if errors.Is(err, errNotFinished) {
			return fmt.Errorf("%w:\n%s", err, describeUnfinished(ctx, admin, rec, ts))
		}
		return err
	}
	time.Sleep(settle)
	for _, t := range ts {
		s, err := t.ctl.snapshot(ctx)
		if err != nil {
			return err
		}
		t.after = s
		var ok bool
		t.cpuAfter, ok = t.ctl.cpu()
		t.cpuOK = t.cpuOK && ok
		t.res = rec.result(t.ns, t.start)
		t.res.calls = t.after.sub(t.before)
	}
	return nil
}

// waitFinished waits until every recorded Job of the targets finished.
func waitFinished(ctx context.Context, rec *recorder, ts []*target) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		left := 0
		for _, t := range ts {
			left += len(rec.unfinished(t.ns))
		}
		if left == 0 {
			return nil
		}
		for _, t := range ts {
			select {
			case err := <-t.ctl.exited():
				return err
			default:
			}
		}
		select {
		case <-rec.failed:
			return rec.err
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("%w (%d left)", errNotFinished, left)
			}
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// describeUnfinished says where the unfinished Jobs are.
func describeUnfinished(ctx context.Context, admin kubernetes.Interface, rec *recorder, ts []*target) string {
	var parts []string
	for _, t := range ts {
		names := rec.unfinished(t.ns)
		if len(names) == 0 {
			continue
		}
		var ds []string
		for i, name := range names {
			if i == 3 {
				ds = append(ds, fmt.Sprintf("and %d more", len(names)-i))
				break
			}
			job, err := admin.BatchV1().Jobs(t.ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				ds = append(ds, fmt.Sprintf("%s (%v)", name, err))
				continue
			}
			s := job.Status
			ds = append(ds, fmt.Sprintf("%s (active %d, succeeded %d, failed %d, completedIndexes %q, failedIndexes %q)",
				name, s.Active, s.Succeeded, s.Failed, s.CompletedIndexes, derefStr(s.FailedIndexes)))
		}
		parts = append(parts, fmt.Sprintf("%s: %d not finished: %s", t.name, len(names), strings.Join(ds, ", ")))
	}
	return strings.Join(parts, "\n")
}

func derefStr(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

// compare checks the final Jobs of both controllers against each other and against the
// workload, and the sync latency bookkeeping; it returns the problems found.
func compare(ctx context.Context, admin kubernetes.Interface, rec *recorder, w workload, ts []*target) ([]string, error) {
	outcomes := make([]map[string]outcome, len(ts))
	for n, t := range ts {
		list, err := admin.BatchV1().Jobs(t.ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, err
		}
		counts := rec.podCounts(t.ns)
		outcomes[n] = map[string]outcome{}
		for i := range list.Items {
			job := &list.Items[i]
			pc := counts[job.Name]
			outcomes[n][job.Name] = outcomeOf(job, pc[0], pc[1])
		}
	}
	var problems []string
	for j := range w.jobs {
		name := jobName(j)
		want := w.expected(j)
		var got []outcome
		for n, t := range ts {
			o, ok := outcomes[n][name]
			if !ok {
				problems = append(problems, fmt.Sprintf("%s: Job %s is missing", t.name, name))
				continue
			}
			got = append(got, o)
			if d := diff(o, want, "conditions"); len(d) > 0 {
				problems = append(problems, fmt.Sprintf("%s: Job %s differs from the workload's expectation (got vs want): %s", t.name, name, strings.Join(d, "; ")))
			}
		}
		if len(got) == 2 {
			if d := diff(got[1], got[0]); len(d) > 0 {
				problems = append(problems, fmt.Sprintf("Job %s: %s vs %s: %s", name, ts[1].name, ts[0].name, strings.Join(d, "; ")))
			}
		}
	}
	for _, t := range ts {
		if t.res.notCounted > 0 {
			problems = append(problems, fmt.Sprintf("%s: %d terminal pods never counted by a Job status the watch saw", t.name, t.res.notCounted))
		}
	}
	return problems, nil
}

// printTable prints both controllers side by side, with the ratios coroner / built-in.
func printTable(c config, w workload, ts []*target, mode string) {
	a, b := ts[0], ts[1]
	tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "\t%s\t%s\t%s/%s\t\n", a.name, b.name, b.name, a.name)
	row := func(label string, va, vb string, ratio string) {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t\n", label, va, vb, ratio)
	}
	num := func(label string, f func(r result) float64, format string) {
		x, y := f(a.res), f(b.res)
		row(label, fmt.Sprintf(format, x), fmt.Sprintf(format, y), ratioF(y, x))
	}
	dur := func(label string, f func(r result) time.Duration) {
		x, y := f(a.res), f(b.res)
		row(label, fmtDur(x), fmtDur(y), ratioF(float64(y), float64(x)))
	}
	callRow := func(label string, f func(cs calls) int64) {
		x, y := f(a.res.calls), f(b.res.calls)
		row(label, fmt.Sprint(x), fmt.Sprint(y), ratioF(float64(y), float64(x)))
	}
	num("Jobs", func(r result) float64 { return float64(r.jobs) }, "%.0f")
	num("pods finished", func(r result) float64 { return float64(r.podsFinished) }, "%.0f")
	num("  of which failed", func(r result) float64 { return float64(r.podFailures) }, "%.0f")
	dur("wall time", result.wall)
	num("throughput (pods/s)", func(r result) float64 { return perSec(r.podsFinished, r.wall()) }, "%.2f")
	dur("Job duration p50", func(r result) time.Duration { return measure.Percentile(r.jobTimes, 50) })
	dur("Job duration max", func(r result) time.Duration { return measure.Percentile(r.jobTimes, 100) })
	callRow("API calls", calls.total)
	callRow("  GET (get, list, watch)", func(cs calls) int64 { return cs.method("GET") })
	callRow("  POST", func(cs calls) int64 { return cs.method("POST") })
	callRow("  PUT", func(cs calls) int64 { return cs.method("PUT") })
	callRow("  PATCH", func(cs calls) int64 { return cs.method("PATCH") })
	callRow("  DELETE", func(cs calls) int64 { return cs.method("DELETE") })
	callRow("  answered 409 Conflict", func(cs calls) int64 { return cs.code("409") })
	cpu := func(t *target) string {
		if !t.cpuOK {
			return "n/a"
		}
		return fmtDur(t.cpuAfter - t.cpuBefore)
	}
	cpuRatio := "n/a"
	if a.cpuOK && b.cpuOK {
		cpuRatio = ratioF(float64(b.cpuAfter-b.cpuBefore), float64(a.cpuAfter-a.cpuBefore))
	}
	row("controller CPU time", cpu(a), cpu(b), cpuRatio)
	num("API calls per pod", func(r result) float64 { return per(r.calls.total(), r.podsFinished) }, "%.2f")
	num("API calls per pod failure", func(r result) float64 { return per(r.calls.total(), r.podFailures) }, "%.2f")
	counted := func(r result) []time.Duration { return slices.Concat(r.lat[podSucceeded], r.lat[podFailIndex]) }
	dur("sync latency p50", func(r result) time.Duration { return measure.Percentile(counted(r), 50) })
	dur("sync latency p99", func(r result) time.Duration { return measure.Percentile(counted(r), 99) })
	for _, k := range []struct {
		kind  podKind
		label string
	}{{podSucceeded, "succeeded pods"}, {podFailIndex, "FailIndex pods (exit 42)"}, {podRetried, "retried pods (exit 1), with backoff"}} {
		num("  "+k.label, func(r result) float64 { return float64(len(r.lat[k.kind])) }, "%.0f")
		dur("    p50", func(r result) time.Duration { return measure.Percentile(r.lat[k.kind], 50) })
		dur("    p99", func(r result) time.Duration { return measure.Percentile(r.lat[k.kind], 99) })
	}
	dur("    failure -> replacement p50", func(r result) time.Duration { return measure.Percentile(r.replaceLat, 50) })
	dur("    failure -> replacement p99", func(r result) time.Duration { return measure.Percentile(r.replaceLat, 99) })
	tw.Flush()
	fmt.Println()
	fmt.Printf("run: %s; %d Jobs x %d completions per controller (indexes failing once with exit 1: %d; indexes failed for good with exit 42: %d); pods Running after %v, finished after %v more; both controllers with client QPS %v, burst %d, %d workers\n",
		mode, w.jobs, w.completions, countPlan(w, exitFailOnce), countPlan(w, exitFailIndex), c.startDelay, c.runTime, c.qps, c.burst, c.workers)
	fmt.Println("ratios: coroner / built-in; above 1 means coroner's number is higher (better for throughput, worse for time, calls and latency)")
	fmt.Println("wall time: first Job created -> last Job seen finished by a watch; throughput: pods finished / wall time")
	fmt.Printf("API calls: every request of the controller's client in the window (first Job created -> %v after the last Job of the round finished); built-in: kube-controller-manager's rest_client_requests_total + rest_client_request_retries_total from its /metrics; coroner: a counting RoundTripper on its client; per pod failure: calls / pod failures of the workload\n", settle)
	fmt.Println("sync latency: terminal pod status write acknowledged -> a watch delivers the Job whose status counts the pod (its index in completedIndexes; for a failure, status.failed after the pod's UID left uncountedTerminatedPods.failed); p50/p99 over succeeded and FailIndex pods; a retried pod (exit 1) is counted only once its replacement exists, after the 10s per-index backoff (KEP-3850), so its latency is shown apart")
	for _, t := range ts {
		if t.res.early > 0 {
			fmt.Printf("note: %s: %d pods counted before their write was acknowledged (latency 0)\n", t.name, t.res.early)
		}
		if t.res.late > 0 {
			fmt.Printf("note: %s: %d failed pods were seen counted only when every failure of their Job was (the watch restarted and missed a status); their latency is an upper bound\n", t.name, t.res.late)
		}
	}
}

// countPlan counts the indexes whose first pod exits with code, over the workload.
func countPlan(w workload, code int32) int {
	n := 0
	for j := range w.jobs {
		for i := range w.completions {
			if w.exitCode(j, i, 0) == code {
				n++
			}
		}
	}
	return n
}

func per(n int64, d int) float64 {
	if d == 0 {
		return 0
	}
	return float64(n) / float64(d)
}

func perSec(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

func fmtDur(d time.Duration) string {
	if d >= 10*time.Second {
		return fmt.Sprintf("%.1fs", d.Seconds())
	}
	return fmt.Sprintf("%dms", d.Round(time.Millisecond).Milliseconds())
}

func ratioF(a, b float64) string {
	if b == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", a/b)
}
