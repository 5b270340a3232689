package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/coroner-dev/coroner/conditions"
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
	// peakRSS is the process's peak resident set size (VmHWM) at the end of its round,
	// in bytes; 0 when unknown.
	peakRSS int64
	start   time.Time
	res     result
}

func run(ctx context.Context, c config) error {
	w := c.workload()
	mode := "at the same time"
	if c.sequential {
		mode = "one after the other (--sequential)"
	}
	loadAvgAtStart = loadAvg()
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
	k := &kubelet{ctx: kctx, client: kubeletClient, rec: rec, w: w, startDelay: c.startDelay, runTime: c.runTime, longRunTime: c.longRunTime, namespaces: namespaces}
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
		rec.addJob(t.ns, warmupJob, -1, -1)
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
	if err := report(c, w, targets, mode, api.ServerVersion, mismatches); err != nil {
		return err
	}
	if len(mismatches) > 0 {
		return fmt.Errorf("the controllers' outcomes differ (%d problems):\n%s", len(mismatches), strings.Join(mismatches, "\n"))
	}
	fmt.Printf("outcomes: the %d Jobs of each controller agree with each other and with the workload\n", c.jobs)
	return nil
}

func newClient(base *rest.Config, userAgent string, qps float32, burst int, wrap func(rt http.RoundTripper) http.RoundTripper) (kubernetes.Interface, error) {
	return kubernetes.NewForConfig(clientConfig(base, userAgent, qps, burst, wrap))
}

func clientConfig(base *rest.Config, userAgent string, qps float32, burst int, wrap func(rt http.RoundTripper) http.RoundTripper) *rest.Config {
	cfg := rest.CopyConfig(base)
	cfg.UserAgent = userAgent
	cfg.QPS, cfg.Burst = qps, burst
	if wrap != nil {
		cfg.Wrap(wrap)
	}
	return cfg
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
				rec.addJob(t.ns, name, j, w.doomIndex(j))
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
		t.peakRSS = peakRSS(t.ctl.pid())
		if c.profileDir != "" {
			if err := saveHeapProfile(ctx, c, t); err != nil {
				fmt.Fprintf(os.Stderr, "bench-shim: %s: heap profile: %v\n", t.name, err)
			}
		}
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
		want, skip := w.expected(j)
		var got []outcome
		for n, t := range ts {
			o, ok := outcomes[n][name]
			if !ok {
				problems = append(problems, fmt.Sprintf("%s: Job %s is missing", t.name, name))
				continue
			}
			got = append(got, o)
			if d := diff(o, want, skip...); len(d) > 0 {
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

// saveHeapProfile writes the heap profile of the controller's process to
// --profile-dir/<name>-heap.pprof.
func saveHeapProfile(ctx context.Context, c config, t *target) error {
	if cp, ok := t.ctl.(*childProcess); ok {
		var stopped bool
		if err := cp.get(ctx, "/debug/cpu-stop", &stopped); err != nil {
			return fmt.Errorf("ending the CPU profile: %w", err)
		}
		fmt.Fprintf(os.Stderr, "bench-shim: %s: CPU profile in %s\n", t.name, filepath.Join(c.profileDir, "coroner-cpu.pprof"))
	}
	b, err := t.ctl.heapProfile(ctx)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(c.profileDir, 0o755); err != nil {
		return err
	}
	path := filepath.Join(c.profileDir, t.name+"-heap.pprof")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "bench-shim: %s: heap profile in %s\n", t.name, path)
	return nil
}
