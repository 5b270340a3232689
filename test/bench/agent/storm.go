package main

// The storm mode (-storm, `make bench-agent-storm`; issue 12, item 6 "bounded under
// storms"): the real coroner-agent binary, as a process of its own with the production
// defaults unless -agent-args says otherwise (API client 5 QPS / burst 10, the kernel log
// and the cgroups read, a Stamped Event per condition stamp), for a node of its own on
// the harness's API server and the test containerd, through three phases:
//
//   - before: idle for -idle-before after the agent answers /readyz;
//   - storm: for -storm-duration, crash-looping pods (restartPolicy OnFailure, played by
//     kubeletsim: each attempt a new container that exits 1 at once, the previous dead
//     one removed as the kubelet's garbage collection does, the pod's status written as
//     the kubelet does) exit at -exit-rate per minute, paced by a ticker and spread over
//     -pods pods at once; and -ooms containers over a 20 MiB limit (memhog) are
//     OOM-killed at even intervals, in crash-looping pods of their own. A pod lives for
//     -exits-per-pod exits (at most the agent's exit history of 10, so its last
//     annotation holds them all); then the bench waits for its stamps, removes its
//     sandbox and deletes it, and a new pod takes its place;
//   - after: idle for -idle-after, no pods left.
//
// Every exit must show as an entry of coroner.dev/exit-history with its restart count
// (the stamp the agent writes for a container restarted in place), without an "oom"
// verdict; every OOM kill (the runtime's reason OOMKilled) as such an entry with oom
// "limit". A watch on the pods records when each entry first shows.
//
// Every 5 s the bench reads the agent's /metrics: resident memory, goroutines, heap in
// use, open file descriptors, CPU time, and its exit, stamp and drop counters. It prints
// a table per phase, writes everything to _output/bench/agent-storm.json, and fails when
// an exit or OOM kill was not stamped (or stamped with the wrong verdict), when the
// agent's goroutines after the storm exceed those before by more than -goroutine-slack,
// or its resident memory after exceeds -rss-factor times that before.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/test/containerd"
	"github.com/coroner-dev/coroner/test/harness"
	"github.com/coroner-dev/coroner/test/host"
	"github.com/coroner-dev/coroner/test/integration/agent/kubeletsim"
)

const (
	stormNode      = "bench-storm"
	stormNamespace = "storm"
	// oomLimit is the memory limit of the OOM containers, as in the oom scenario.
	oomLimit = 20 << 20
	// maxExitsPerPod is the agent's default --exit-history-size: a pod's last exit
	// history then holds every exit of the pod.
	maxExitsPerPod = 10
	// oomWorkers play the OOM pods at once.
	oomWorkers = 3
)

type stormConfig struct {
	duration              time.Duration
	exitRate              int // per minute
	ooms                  int
	pods                  int
	exitsPerPod           int
	idleBefore, idleAfter time.Duration
	sampleEvery, timeout  time.Duration
	kubeletStatus         bool
	containerd2           bool
	agentBinary           string
	agentArgs             string
	agentV                int
	goroutineSlack        int
	rssFactor             float64
	jsonPath              string
}

// addStormFlags registers the storm mode's flags on the program's flag set.
func addStormFlags() *stormConfig {
	c := &stormConfig{}
	flag.DurationVar(&c.duration, "storm-duration", 3*time.Minute, "-storm: how long exits and OOM kills are generated")
	flag.IntVar(&c.exitRate, "exit-rate", 1000, "-storm: container exits per minute (the rate achieved is printed)")
	flag.IntVar(&c.ooms, "ooms", 100, "-storm: OOM kills, spread evenly over the storm")
	flag.IntVar(&c.pods, "pods", 24, "-storm: crash-looping pods at once: the storm's parallelism (each restarts its container as soon as it exited and a token allows)")
	flag.IntVar(&c.exitsPerPod, "exits-per-pod", maxExitsPerPod, fmt.Sprintf("-storm: exits of a pod before it is deleted and replaced, 1 to %d (the agent's exit history)", maxExitsPerPod))
	flag.DurationVar(&c.idleBefore, "idle-before", 30*time.Second, "-storm: idle time after the agent is ready, before the storm")
	flag.DurationVar(&c.idleAfter, "idle-after", 2*time.Minute, "-storm: idle time after the storm, every pod gone (the Go runtime forces a GC every 2 minutes)")
	flag.DurationVar(&c.sampleEvery, "sample-every", 5*time.Second, "-storm: how often the agent's /metrics is read")
	flag.DurationVar(&c.timeout, "stamp-timeout", 60*time.Second, "-storm: how long after a pod's last exit its stamps may take before the missing ones count as lost")
	flag.BoolVar(&c.kubeletStatus, "kubelet-status", true, "-storm: write each pod's status after every exit, as the kubelet does (pod updates the agent's informer sees)")
	flag.BoolVar(&c.containerd2, "containerd2", false, "-storm: run containerd 2.x built by make tools (CRI events) instead of Debian's 1.6 (containerd's event service)")
	flag.StringVar(&c.agentBinary, "agent-binary", "", "-storm: the coroner-agent binary; default <repository>/_output/bin/coroner-agent (make build)")
	flag.StringVar(&c.agentArgs, "agent-args", "", "-storm: more flags for the agent, separated by spaces or commas (e.g. --kube-api-qps=50,--kube-api-burst=100); by default it runs with its production defaults")
	flag.IntVar(&c.agentV, "agent-v", 0, "-storm: the agent's klog verbosity (its log: _output/bench/agent-storm-agent.log)")
	flag.IntVar(&c.goroutineSlack, "goroutine-slack", 20, "-storm: goroutines the agent may have after the storm beyond those before")
	flag.Float64Var(&c.rssFactor, "rss-factor", 2, "-storm: resident memory after the storm may be at most this times that before")
	flag.StringVar(&c.jsonPath, "json", "", "-storm: where to write the report; default <repository>/_output/bench/agent-storm.json")
	return c
}

func (c *stormConfig) validate() error {
	var errs []error
	if c.exitsPerPod < 1 || c.exitsPerPod > maxExitsPerPod {
		errs = append(errs, fmt.Errorf("-exits-per-pod=%d: want 1 to %d", c.exitsPerPod, maxExitsPerPod))
	}
	if c.exitRate < 1 || c.pods < 1 || c.ooms < 0 {
		errs = append(errs, fmt.Errorf("-exit-rate=%d, -pods=%d, -ooms=%d: want positive rates and pods", c.exitRate, c.pods, c.ooms))
	}
	if c.duration <= 0 || c.sampleEvery <= 0 {
		errs = append(errs, errors.New("-storm-duration and -sample-every must be positive"))
	}
	return errors.Join(errs...)
}

// storm is one run of the storm mode.
type storm struct {
	c     *stormConfig
	node  *kubeletsim.Node
	watch *historyWatch
	agent *host.Process
	addr  string
	ready time.Time

	phase             atomic.Value // string
	podSeq            atomic.Int64
	genExits, genOOMs atomic.Int64

	mu          sync.Mutex
	samples     []sample
	exits, ooms outcome
	// oomReasonMissing: memhog containers OOM-killed (exit 137) whose runtime reason is
	// not OOMKilled; oomNotKilled: memhog containers that exited otherwise (counted as
	// exits).
	oomReasonMissing, oomNotKilled int
	steps                          map[string][]time.Duration
	stampedEvents                  int
	cleanupErrors                  []string
}

func runStorm(ctx context.Context, c *stormConfig) error {
	began := time.Now()
	if err := c.validate(); err != nil {
		return err
	}
	root, err := host.RepoRoot()
	if err != nil {
		return err
	}
	outDir := filepath.Join(root, "_output", "bench")
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return err
	}
	if c.agentBinary == "" {
		c.agentBinary = filepath.Join(root, "_output", "bin", "coroner-agent")
	}
	if c.jsonPath == "" {
		c.jsonPath = filepath.Join(outDir, "agent-storm.json")
	}
	if _, err := os.Stat(c.agentBinary); err != nil {
		return fmt.Errorf("the agent binary (make build): %w", err)
	}

	fmt.Fprintln(os.Stderr, "bench-agent -storm: starting etcd + kube-apiserver and containerd ...")
	api, err := harness.Start(harness.Options{})
	if err != nil {
		return fmt.Errorf("starting the API server (make tools builds it): %w", err)
	}
	defer api.Stop()
	copts := containerd.Options{}
	if c.containerd2 {
		rt, err := containerd.Built("")
		if err != nil {
			return err
		}
		copts.Runtime = &rt
	}
	sctx, scancel := context.WithTimeout(ctx, 3*time.Minute)
	cri, err := containerd.Start(sctx, copts)
	scancel()
	if err != nil {
		return fmt.Errorf("starting containerd (needs root, containerd, runc, busybox-static): %w", err)
	}
	defer cri.Stop()

	cfg := rest.CopyConfig(api.Config)
	cfg.QPS, cfg.Burst = 200, 400
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: stormNamespace}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	s := &storm{c: c, node: &kubeletsim.Node{Name: stormNode, Client: client, CRI: cri}, watch: newHistoryWatch(), steps: map[string][]time.Duration{}}
	s.phase.Store("start")

	wctx, wcancel := context.WithCancel(ctx)
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(stormNamespace))
	inf := factory.Core().V1().Pods().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    s.watch.observe,
		UpdateFunc: func(_, obj any) { s.watch.observe(obj) },
	}); err != nil {
		wcancel()
		return err
	}
	factory.Start(wctx.Done())
	defer func() {
		wcancel()
		factory.Shutdown()
	}()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return errors.New("the watch did not sync")
	}

	if s.addr, err = freeAddr(); err != nil {
		return err
	}
	logName := "agent-storm-agent"
	_ = os.Remove(filepath.Join(outDir, logName+".log"))
	args := append([]string{
		"--kubeconfig=" + api.Kubeconfig,
		"--node-name=" + stormNode,
		"--runtime-endpoint=" + cri.Endpoint,
		"--metrics-bind-address=" + s.addr,
		fmt.Sprintf("--v=%d", c.agentV),
	}, strings.FieldsFunc(c.agentArgs, func(r rune) bool { return r == ' ' || r == ',' })...)
	s.agent, err = host.StartProcess(outDir, logName, c.agentBinary, args...)
	if err != nil {
		return err
	}
	defer s.agent.Stop(10 * time.Second)
	if err := s.waitReady(ctx); err != nil {
		return fmt.Errorf("%w; the agent's log ends: %s", err, s.agent.LogTail(2000))
	}
	s.ready = time.Now()
	fmt.Fprintf(os.Stderr, "bench-agent -storm: kube-apiserver %s, %s; agent %s (pid %d) ready; %d exits/min and %d OOM kills for %v, %d pods at once\n",
		api.ServerVersion, cri.Version, c.agentBinary, s.agent.PID(), c.exitRate, c.ooms, c.duration, c.pods)

	phases := []struct {
		name string
		work func(context.Context) error
	}{
		{"before", func(ctx context.Context) error { return sleep(ctx, c.idleBefore) }},
		{"storm", s.storm},
		{"after", func(ctx context.Context) error { return sleep(ctx, c.idleAfter) }},
	}
	var reports []phaseReport
	for _, p := range phases {
		fmt.Fprintf(os.Stderr, "bench-agent -storm: %s ...\n", p.name)
		r, err := s.runPhase(ctx, p.name, p.work)
		if err != nil {
			return fmt.Errorf("phase %s: %w", p.name, err)
		}
		reports = append(reports, r)
	}

	// The Stamped Events the agent posted (the API server's count, aggregated ones
	// included): condition stamps post one (an exit history entry does not), on the
	// same client, and QPS, as the pod writes.
	if evs, err := client.CoreV1().Events(stormNamespace).List(ctx, metav1.ListOptions{FieldSelector: "reason=" + conditions.EventReasonStamped}); err == nil {
		for _, ev := range evs.Items {
			s.stampedEvents += int(max(ev.Count, 1))
		}
	}

	// The agent's graceful stop is part of being bounded: it must return.
	s.agent.Stop(30 * time.Second)
	agentErr := s.agent.Err()
	return s.report(reports, api.ServerVersion, cri.Version, agentErr, time.Since(began))
}

// waitReady waits until the agent answers /readyz (the runtime connected, the pod cache
// synced).
func (s *storm) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if done, err := s.agent.Exited(); done {
			return false, fmt.Errorf("the agent exited: %v", err)
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.addr+"/readyz", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false, nil
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close() // read to its end: only the status code counts
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		return fmt.Errorf("the agent not ready: %w", err)
	}
	return nil
}

// runPhase runs work while sampling the agent every sampleEvery, and once more at the end.
func (s *storm) runPhase(ctx context.Context, name string, work func(context.Context) error) (phaseReport, error) {
	s.phase.Store(name)
	start := time.Now()
	s.mu.Lock()
	first := len(s.samples)
	s.mu.Unlock()
	busy0, total0 := cpuTimes()
	if err := s.sample(ctx); err != nil {
		return phaseReport{}, err
	}
	done := make(chan error, 1)
	go func() { done <- work(ctx) }()
	tick := time.NewTicker(s.c.sampleEvery)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			if err != nil {
				return phaseReport{}, err
			}
			if err := s.sample(ctx); err != nil {
				return phaseReport{}, err
			}
			r := s.summarize(name, time.Since(start), first)
			if busy1, total1 := cpuTimes(); total1 > total0 {
				r.MachineBusy = float64(busy1-busy0) / float64(total1-total0)
			}
			return r, nil
		case <-tick.C:
			if err := s.sample(ctx); err != nil {
				return phaseReport{}, err // the work goroutine ends with ctx
			}
		}
	}
}

// storm generates the exits and OOM kills for c.duration, then waits for the last pods'
// stamps and removes them.
func (s *storm) storm(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	gen, genCancel := context.WithTimeout(ctx, s.c.duration)
	defer genCancel()

	// One token per exit, at the rate asked; a token nobody is ready to take is lost,
	// so that a machine that cannot keep up shows a lower rate, not a burst later.
	tokens := make(chan struct{}, 1)
	go func() {
		t := time.NewTicker(time.Minute / time.Duration(s.c.exitRate))
		defer t.Stop()
		for {
			select {
			case <-gen.Done():
				return
			case <-t.C:
				select {
				case tokens <- struct{}{}:
				default:
				}
			}
		}
	}()
	takeToken := func() bool {
		select {
		case <-tokens:
			return true
		case <-gen.Done():
			return false
		}
	}

	var wg sync.WaitGroup
	var errMu sync.Mutex
	var firstErr error
	fail := func(err error) {
		errMu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		errMu.Unlock()
		cancel()
	}
	goFunc := func(f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(); err != nil {
				fail(err)
			}
		}()
	}
	// A pod whose exits are done is handed over (its stamps waited for, then removed)
	// and the worker starts the next at once, so that the stamps' latency does not slow
	// the storm down.
	loop := func(prefix string, opts kubeletsim.PodOptions, oomPod bool, next func() bool, more func() bool) func() error {
		return func() error {
			for more() {
				name := fmt.Sprintf("%s-%d", prefix, s.podSeq.Add(1))
				p, exits, err := s.crashLoop(ctx, name, opts, oomPod, next)
				if err != nil {
					return err
				}
				goFunc(func() error { return s.finish(ctx, name, p, exits) })
			}
			return nil
		}
	}
	exitPod := kubeletsim.PodOptions{RestartPolicy: corev1.RestartPolicyOnFailure,
		Containers: []containerd.Container{{Name: "main", Command: []string{"sh", "-c", "exit 1"}}}}
	for range s.c.pods {
		goFunc(loop("exit", exitPod, false, takeToken, func() bool { return gen.Err() == nil }))
	}
	if s.c.ooms > 0 {
		oomPod := kubeletsim.PodOptions{RestartPolicy: corev1.RestartPolicyOnFailure,
			Containers: []containerd.Container{{Name: "main", Command: []string{"/bin/memhog"}, MemoryLimit: oomLimit}}}
		// OOM kill i is due at i*interval; a few workers share the schedule so that one
		// slow start does not push the rest past the storm's end.
		interval := s.c.duration / time.Duration(s.c.ooms)
		start := time.Now()
		var oomMu sync.Mutex
		i := 0
		nextOOM := func() bool {
			oomMu.Lock()
			if i >= s.c.ooms {
				oomMu.Unlock()
				return false
			}
			due := start.Add(time.Duration(i) * interval)
			i++
			oomMu.Unlock()
			return sleep(gen, time.Until(due)) == nil
		}
		more := func() bool {
			oomMu.Lock()
			defer oomMu.Unlock()
			return i < s.c.ooms && gen.Err() == nil
		}
		for range oomWorkers {
			goFunc(loop("oom", oomPod, true, nextOOM, more))
		}
	}
	wg.Wait()
	return firstErr
}

// exitRecord is one exit the bench caused.
type exitRecord struct {
	attempt  int32
	finished time.Time
	oom      bool
}

// crashLoop plays one crash-looping pod: it creates it and restarts its container in
// place while next allows, at most exitsPerPod times. A memhog container's exit 137 is
// an OOM kill, whatever reason the runtime gives.
func (s *storm) crashLoop(ctx context.Context, name string, opts kubeletsim.PodOptions, oomPod bool, next func() bool) (_ *kubeletsim.Pod, _ []exitRecord, err error) {
	s.watch.track(name)
	began := time.Now()
	p, err := s.node.CreatePod(ctx, stormNamespace, name, opts)
	s.timed("create pod", began)
	defer func() {
		if err != nil {
			s.remove(ctx, name, p)
			s.watch.forget(name)
		}
	}()
	if err != nil {
		return nil, nil, err
	}
	var exits []exitRecord
	prev := ""
	for k := range s.c.exitsPerPod {
		if !next() {
			break
		}
		began := time.Now()
		id, err := p.StartAttempt(ctx, "main", uint32(k))
		s.timed("start container", began)
		if err != nil {
			return p, nil, err
		}
		began = time.Now()
		st, err := waitExited(ctx, p, id)
		s.timed("wait for exit", began)
		if err != nil {
			return p, nil, err
		}
		rec := exitRecord{attempt: int32(k), finished: kubeletsim.FinishedAt(st), oom: oomPod && st.GetExitCode() == 137}
		exits = append(exits, rec)
		s.mu.Lock()
		switch {
		case rec.oom && st.GetReason() != "OOMKilled":
			s.oomReasonMissing++
		case oomPod && !rec.oom:
			s.oomNotKilled++
		}
		s.mu.Unlock()
		if rec.oom {
			s.genOOMs.Add(1)
		} else {
			s.genExits.Add(1)
		}
		if s.c.kubeletStatus {
			began = time.Now()
			err := writeStatus(ctx, p, st)
			s.timed("write status", began)
			if err != nil {
				return p, nil, fmt.Errorf("writing the status of %s: %w", name, err)
			}
		}
		// The kubelet keeps the last dead instance of a container.
		if prev != "" {
			began = time.Now()
			err := p.RemoveContainer(ctx, prev)
			s.timed("remove container", began)
			if err != nil {
				return p, nil, fmt.Errorf("removing a dead container of %s: %w", name, err)
			}
		}
		prev = id
	}
	return p, exits, nil
}

// finish waits for the stamps of a pod's exits (up to timeout), counts them, and removes
// the pod as its kubelet would: its sandbox, then the Pod object.
func (s *storm) finish(ctx context.Context, name string, p *kubeletsim.Pod, exits []exitRecord) error {
	defer s.watch.forget(name)
	defer s.remove(ctx, name, p)
	if len(exits) == 0 {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, s.c.timeout)
	defer cancel()
	attempts := make([]int32, len(exits))
	for i, e := range exits {
		attempts[i] = e.attempt
	}
	seen := s.watch.wait(wctx, name, attempts)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range exits {
		o, want := &s.exits, ""
		if e.oom {
			o, want = &s.ooms, v1alpha1.ExitOOMLimit
		}
		o.Generated++
		got, ok := seen[e.attempt]
		switch {
		case !ok:
			o.Lost++
			if len(o.examples) < 5 {
				o.examples = append(o.examples, fmt.Sprintf("%s restart %d (finished %s): no entry", name, e.attempt, e.finished.Format(time.RFC3339Nano)))
			}
		case got.oom != want:
			o.Wrong++
			if len(o.examples) < 5 {
				o.examples = append(o.examples, fmt.Sprintf("%s restart %d: oom %q, want %q", name, e.attempt, got.oom, want))
			}
		default:
			o.Stamped++
			o.latencies = append(o.latencies, got.at.Sub(e.finished))
		}
	}
	return nil
}

// remove removes a pod's sandbox and deletes it (at once, as the kubelet's final delete).
func (s *storm) remove(ctx context.Context, name string, p *kubeletsim.Pod) {
	if p == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	var errs []error
	if p.SandboxID != "" {
		errs = append(errs, p.Remove(ctx))
	}
	if err := p.ForceDelete(ctx); !apierrors.IsNotFound(err) {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		s.mu.Lock()
		s.cleanupErrors = append(s.cleanupErrors, fmt.Sprintf("%s: %v", name, err))
		s.mu.Unlock()
	}
}

// timed records how long a step of the kubelet's part took.
func (s *storm) timed(step string, began time.Time) {
	d := time.Since(began)
	s.mu.Lock()
	s.steps[step] = append(s.steps[step], d)
	s.mu.Unlock()
}

// waitExited polls the container's CRI status until it has exited.
func waitExited(ctx context.Context, p *kubeletsim.Pod, id string) (*runtimeapi.ContainerStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute) // generous: a machine busy with other work
	defer cancel()
	for {
		st, err := p.Status(ctx, id)
		if err == nil && st.GetState() == runtimeapi.ContainerState_CONTAINER_EXITED {
			return st, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("container %s of %s did not exit: %w", id, p.Object.Name, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// writeStatus plays the kubelet's status write after a restart, retried on conflicts
// with the agent's writes.
func writeStatus(ctx context.Context, p *kubeletsim.Pod, st *runtimeapi.ContainerStatus) error {
	backoff := wait.Backoff{Steps: 10, Duration: 10 * time.Millisecond, Factor: 2, Jitter: 0.1}
	return retry.RetryOnConflict(backoff, func() error {
		_, err := p.WriteRunning(ctx, "main", st)
		return err
	})
}

// historyWatch records, for the pods being tracked, when each restart count first shows
// in their exit history, and with which OOM verdict.
type historyWatch struct {
	mu      sync.Mutex
	changed *sync.Cond
	pods    map[string]map[int32]historySeen
}

type historySeen struct {
	at  time.Time
	oom string
}

func newHistoryWatch() *historyWatch {
	w := &historyWatch{pods: map[string]map[int32]historySeen{}}
	w.changed = sync.NewCond(&w.mu)
	return w
}

func (w *historyWatch) track(name string) {
	w.mu.Lock()
	w.pods[name] = map[int32]historySeen{}
	w.mu.Unlock()
}

func (w *historyWatch) forget(name string) {
	w.mu.Lock()
	delete(w.pods, name)
	w.mu.Unlock()
}

func (w *historyWatch) observe(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	now := time.Now()
	entries, _ := v1alpha1.ParseExitHistory(pod.Annotations[conditions.AnnotationExitHistory])
	if len(entries) == 0 {
		return
	}
	w.mu.Lock()
	seen, tracked := w.pods[pod.Name]
	if tracked {
		for _, e := range entries {
			if _, dup := seen[e.RestartCount]; !dup && e.Container == "main" {
				seen[e.RestartCount] = historySeen{at: now, oom: e.OOM}
			}
		}
	}
	w.mu.Unlock()
	if tracked {
		w.changed.Broadcast()
	}
}

// wait returns what was seen of the attempts once all of them were, or when ctx ends.
func (w *historyWatch) wait(ctx context.Context, name string, attempts []int32) map[int32]historySeen {
	stop := context.AfterFunc(ctx, func() {
		// Under the lock, so not between the waiter's check of ctx and its Wait: the
		// waiter either sees ctx done or is waiting, and then wakes.
		w.mu.Lock()
		defer w.mu.Unlock()
		w.changed.Broadcast()
	})
	defer stop()
	w.mu.Lock()
	defer w.mu.Unlock()
	for {
		seen := w.pods[name]
		all := true
		for _, a := range attempts {
			if _, ok := seen[a]; !ok {
				all = false
				break
			}
		}
		if all || ctx.Err() != nil {
			out := make(map[int32]historySeen, len(seen))
			for k, v := range seen {
				out[k] = v
			}
			return out
		}
		w.changed.Wait()
	}
}

// sleep waits d, or returns ctx's error when it ends first.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
