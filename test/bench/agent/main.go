// Command agent is the node agent's latency benchmark (requirement P2), run by
// `make bench-agent`. It is not a test.
//
// It starts a real API server (test/harness) and a real containerd (test/containerd, so
// it needs root), and two agents in-process on the same containerd, each for a node of
// its own: one following containerd's event service (the default) and one relisting CRI
// every second (--containerd-events=false, what a runtime without events gets). There is
// no kubelet to compare against, so the relisting agent stands in for a component that
// learns of exits by polling, as the kubelet's generic PLEG does. Every case runs as a
// pair, one pod per node, started together, so that both modes see the same workload at
// the same time:
//
//   - oom: a container over its 20 MiB memory limit; measured until coroner.dev/OOMKilled
//     is visible through a watch.
//   - exit-on-deletion: the Pod object is deleted, then its container is stopped as the
//     kubelet would (SIGTERM; it exits 0); with no kubelet to finish the pod, measured
//     until the agent's phase Succeeded is visible through a watch (--phase-grace, 0 by
//     default here, is part of it).
//
// The latency of a case is from the container's finishedAt as containerd records it to
// the moment a watch on the pods delivers the stamped pod. An OOM stamp can come before
// the exit is recorded (containerd's OOM event arrives first), which shows as a negative
// latency.
//
// With -storm (`make bench-agent-storm`) it runs the storm mode instead, described in
// storm.go: the real coroner-agent binary under 1,000 container exits per minute and 100
// OOM kills, its memory and goroutines measured before, during and after.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/coroner-dev/coroner/agent"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/test/bench/measure"
	"github.com/coroner-dev/coroner/test/containerd"
	"github.com/coroner-dev/coroner/test/harness"
	"github.com/coroner-dev/coroner/test/integration/agent/kubeletsim"
)

type mode struct {
	name   string // table label
	node   string
	events bool
}

var modes = []mode{
	{name: "containerd-events", node: "bench-events", events: true},
	{name: "relist-1s", node: "bench-relist", events: false},
}

func main() {
	n := flag.Int("n", 30, "cases per scenario (each a pair: one pod per mode)")
	parallel := flag.Int("parallel", 3, "exit-on-deletion pairs in flight at once")
	oomSpacing := flag.Duration("oom-spacing", 1500*time.Millisecond, "time between the starts of two OOM pairs, run one at a time: the kernel logs at most 10 OOM reports per 5s and drops the rest (the agent then has less evidence)")
	timeout := flag.Duration("case-timeout", 20*time.Second, "how long a case waits for its stamp before it counts as not stamped")
	grace := flag.Duration("phase-grace", 0, "the agents' --phase-grace")
	logFile := flag.String("log-file", "", "write the agents' logs (klog) to this file; default: no logs")
	logV := flag.Int("log-v", 0, "klog verbosity of the agents' logs (2: every classification)")
	only := flag.String("scenarios", "oom,exit-on-deletion", "the scenarios to run, comma-separated (e.g. -scenarios=exit-on-deletion -n 1000 -parallel 10 for the no-exit-lost check)")
	stormMode := flag.Bool("storm", false, "instead of the latency scenarios: the real agent binary under a storm of exits and OOM kills, its memory and goroutines before, during and after (storm.go; the flags marked -storm)")
	sc := addStormFlags()
	flag.Parse()
	measure.QuietKlog(*logFile, *logV)
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	var err error
	if *stormMode {
		err = runStorm(ctx, sc)
	} else {
		err = run(ctx, config{n: *n, parallel: *parallel, oomSpacing: *oomSpacing, timeout: *timeout, grace: *grace, scenarios: strings.Split(*only, ",")})
	}
	cancel()
	klog.Flush()
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench-agent: %s\n", strings.ReplaceAll(err.Error(), "\n", "; "))
		os.Exit(1)
	}
}

type config struct {
	scenarios           []string
	n, parallel         int
	oomSpacing, timeout time.Duration
	grace               time.Duration
}

func run(ctx context.Context, c config) error {
	n, grace := c.n, c.grace
	fmt.Fprintln(os.Stderr, "bench-agent: starting etcd + kube-apiserver and containerd ...")
	api, err := harness.Start(harness.Options{})
	if err != nil {
		return fmt.Errorf("starting the API server (make tools builds it): %w", err)
	}
	defer api.Stop()
	sctx, scancel := context.WithTimeout(ctx, 3*time.Minute)
	cri, err := containerd.Start(sctx, containerd.Options{})
	scancel()
	if err != nil {
		return fmt.Errorf("starting containerd (needs root, containerd, runc, busybox-static): %w", err)
	}
	defer cri.Stop()
	fmt.Fprintf(os.Stderr, "bench-agent: kube-apiserver %s, %s; %d cases per scenario; phase grace %v\n",
		api.ServerVersion, cri.Version, n, grace)

	cfg := rest.CopyConfig(api.Config)
	cfg.QPS, cfg.Burst = 200, 400
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	const ns = "bench"
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return err
	}

	// The two agents.
	actx, acancel := context.WithCancel(ctx)
	var agents sync.WaitGroup
	agentErrs := make(chan error, len(modes))
	for _, m := range modes {
		opts := agent.NewOptions()
		opts.NodeName = m.node
		opts.RuntimeEndpoint = cri.Endpoint
		opts.ContainerdEvents = m.events
		opts.PhaseGrace = grace
		opts.QPS, opts.Burst = 100, 200
		addr, err := freeAddr()
		if err != nil {
			acancel()
			return err
		}
		opts.MetricsAddress = addr
		agents.Add(1)
		go func() {
			defer agents.Done()
			if err := agent.Run(actx, cfg, opts); err != nil {
				agentErrs <- fmt.Errorf("agent %s: %w", m.node, err)
			}
		}()
	}
	defer func() {
		acancel()
		agents.Wait()
	}()

	// The watch that sees the stamps.
	w := newWatch()
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(ns))
	inf := factory.Core().V1().Pods().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    w.observe,
		UpdateFunc: func(_, obj any) { w.observe(obj) },
	}); err != nil {
		return err
	}
	factory.Start(actx.Done())
	defer func() {
		acancel() // Shutdown waits for the informer, which stops with actx
		factory.Shutdown()
	}()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return errors.New("the watch did not sync")
	}
	time.Sleep(2 * time.Second) // both agents connected and synced

	results := map[string]map[string][]time.Duration{}
	early, missed := map[string]int{}, map[string]int{}
	var rmu sync.Mutex
	record := func(scenario, mode string, d time.Duration, stamped bool) {
		rmu.Lock()
		defer rmu.Unlock()
		key := scenario + "/" + mode
		if !stamped {
			missed[key]++
			return
		}
		if results[scenario] == nil {
			results[scenario] = map[string][]time.Duration{}
		}
		results[scenario][mode] = append(results[scenario][mode], d)
		if d < 0 {
			early[key]++
		}
	}

	scenarios := []scenario{
		{
			name:     "oom",
			parallel: 1,
			spacing:  c.oomSpacing,
			opts: func(string) kubeletsim.PodOptions {
				return kubeletsim.PodOptions{Containers: []containerd.Container{{Name: "main", Command: []string{"/bin/memhog"}, MemoryLimit: 20 << 20}}}
			},
			act:  func(context.Context, *kubeletsim.Pod, string) error { return nil },
			done: func(p *corev1.Pod, _ int32) bool { return conditions.IsTrue(&p.Status, conditions.OOMKilled) },
		},
		{
			name:     "exit-on-deletion",
			parallel: c.parallel,
			opts: func(string) kubeletsim.PodOptions {
				return kubeletsim.PodOptions{Containers: []containerd.Container{{Name: "main",
					Command: []string{"sh", "-c", `trap "exit 0" TERM; while true; do sleep 0.05; done`}}}}
			},
			act: func(ctx context.Context, p *kubeletsim.Pod, id string) error {
				if err := waitRunning(ctx, p, id); err != nil {
					return err
				}
				// Running is before sh has run its trap; PID 1 of a container ignores a
				// TERM it has no handler for, so a TERM sent then waits for the KILL 10 s
				// later (exit 137, phase Failed: seen in 35 of 1,000 pairs).
				if err := waitTrapped(ctx, p, id); err != nil {
					return err
				}
				if err := client.CoreV1().Pods(ns).Delete(ctx, p.Object.Name, metav1.DeleteOptions{}); err != nil {
					return err
				}
				return p.StopContainer(ctx, id, 10)
			},
			// Succeeded for exit 0, Failed for any other: the phase the runtime's record
			// calls for (a container the stop had to KILL exits 137).
			done: func(p *corev1.Pod, code int32) bool {
				return p.Status.Phase == map[bool]corev1.PodPhase{true: corev1.PodSucceeded, false: corev1.PodFailed}[code == 0]
			},
		},
	}

	scenarios = slices.DeleteFunc(scenarios, func(sc scenario) bool { return !slices.Contains(c.scenarios, sc.name) })
	if len(scenarios) == 0 {
		return fmt.Errorf("no scenario named in %q (oom, exit-on-deletion)", strings.Join(c.scenarios, ","))
	}
	for _, sc := range scenarios {
		fmt.Fprintf(os.Stderr, "bench-agent: %s ...\n", sc.name)
		sem := make(chan struct{}, max(sc.parallel, 1))
		errs := make(chan error, n)
		var wg sync.WaitGroup
		for i := range n {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return ctx.Err()
			case err := <-agentErrs:
				return err
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				errs <- onePair(ctx, client, cri, w, ns, sc, i, c.timeout, record)
			}()
			if sc.spacing > 0 {
				time.Sleep(sc.spacing)
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				return err
			}
		}
	}

	// The table.
	tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tmode\tstamped\tnot stamped\tp50\tp99\tmax\tbefore exit\t")
	for _, sc := range scenarios {
		for _, m := range modes {
			ds := results[sc.name][m.name]
			key := sc.name + "/" + m.name
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%v\t%v\t%v\t%d\t\n", sc.name, m.name, len(ds), missed[key],
				ms(measure.Percentile(ds, 50)), ms(measure.Percentile(ds, 99)), ms(measure.Percentile(ds, 100)), early[key])
		}
	}
	tw.Flush()
	fmt.Println()
	for _, sc := range scenarios {
		ev, rl := results[sc.name][modes[0].name], results[sc.name][modes[1].name]
		fmt.Printf("%s: relist/events ratio p50 %s, p99 %s\n", sc.name, ratio(measure.Percentile(rl, 50), measure.Percentile(ev, 50)), ratio(measure.Percentile(rl, 99), measure.Percentile(ev, 99)))
	}
	fmt.Printf("latency: container finishedAt (containerd) -> stamped pod delivered by a watch; \"before exit\": stamps visible before finishedAt (containerd's OOM event comes first); \"not stamped\": no stamp (or not the one the exit code calls for: Succeeded for 0, Failed otherwise) within %v (an OOM kill nothing could place stamps nothing)\n", c.timeout)
	return nil
}

// scenario is one kind of case.
type scenario struct {
	name     string
	parallel int
	spacing  time.Duration
	opts     func(name string) kubeletsim.PodOptions
	act      func(ctx context.Context, p *kubeletsim.Pod, id string) error
	// done says whether the pod carries the stamp that the container's exit code (as the
	// runtime recorded it) calls for.
	done func(p *corev1.Pod, exitCode int32) bool
}

// onePair runs one case on both nodes at once and records both latencies.
func onePair(ctx context.Context, client kubernetes.Interface, cri *containerd.Env, w *watch, ns string, sc scenario, i int,
	timeout time.Duration, record func(scenario, mode string, d time.Duration, stamped bool)) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	type started struct {
		m   mode
		pod *kubeletsim.Pod
		id  string
	}
	var pods []started
	defer func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer ccancel()
		for _, s := range pods {
			_ = s.pod.Remove(cctx)
			_ = s.pod.ForceDelete(cctx)
		}
	}()
	for _, m := range modes {
		name := fmt.Sprintf("%s-%s-%d", sc.name, m.node, i)
		node := &kubeletsim.Node{Name: m.node, Client: client, CRI: cri}
		p, err := node.CreatePod(ctx, ns, name, sc.opts(name))
		if err != nil {
			return err
		}
		id, err := p.StartContainer(ctx, "main")
		if err != nil {
			return err
		}
		pods = append(pods, started{m: m, pod: p, id: id})
	}
	errs := make(chan error, len(pods))
	for _, s := range pods {
		go func() { errs <- sc.act(ctx, s.pod, s.id) }()
	}
	for range pods {
		if err := <-errs; err != nil {
			return err
		}
	}
	for _, s := range pods {
		finished, code, err := finishedAt(ctx, s.pod, s.id)
		if err != nil {
			return err
		}
		wctx, wcancel := context.WithDeadline(ctx, finished.Add(timeout))
		seen, err := w.wait(wctx, s.pod.Object.Name, func(p *corev1.Pod) bool { return sc.done(p, code) })
		wcancel()
		if err != nil && ctx.Err() != nil {
			return fmt.Errorf("%s: %w", s.pod.Object.Name, err)
		}
		record(sc.name, s.m.name, seen.Sub(finished), err == nil)
	}
	return nil
}

func waitRunning(ctx context.Context, p *kubeletsim.Pod, id string) error {
	for {
		st, err := p.Status(ctx, id)
		if err == nil && st.GetState().String() == "CONTAINER_RUNNING" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("container of %s not running: %w", p.Object.Name, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// waitTrapped waits until the container's init process handles SIGTERM (bit 14 of SigCgt
// in /proc/PID/status), so that stopping it exits 0 at once.
func waitTrapped(ctx context.Context, p *kubeletsim.Pod, id string) error {
	pid, err := p.PID(ctx, id)
	if err != nil {
		return err
	}
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			return fmt.Errorf("container of %s: %w", p.Object.Name, err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "SigCgt:"); ok {
				if mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64); err == nil && mask&(1<<(15-1)) != 0 {
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("container of %s never handled SIGTERM: %w", p.Object.Name, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// finishedAt waits for the container's exit and returns containerd's finish time and the
// exit code.
func finishedAt(ctx context.Context, p *kubeletsim.Pod, id string) (time.Time, int32, error) {
	for {
		st, err := p.Status(ctx, id)
		if err == nil && st.GetState().String() == "CONTAINER_EXITED" {
			return kubeletsim.FinishedAt(st), st.GetExitCode(), nil
		}
		select {
		case <-ctx.Done():
			return time.Time{}, 0, fmt.Errorf("container of %s did not exit: %w", p.Object.Name, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// watch records, per pod name, the pods a watch delivers and when.
type watch struct {
	mu      sync.Mutex
	changed *sync.Cond
	seen    map[string][]seenPod
}

type seenPod struct {
	pod *corev1.Pod
	at  time.Time
}

func newWatch() *watch {
	w := &watch{seen: map[string][]seenPod{}}
	w.changed = sync.NewCond(&w.mu)
	return w
}

func (w *watch) observe(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	now := time.Now()
	w.mu.Lock()
	w.seen[pod.Name] = append(w.seen[pod.Name], seenPod{pod: pod, at: now})
	w.mu.Unlock()
	w.changed.Broadcast()
}

// wait returns when the watch first delivered the pod in the state done looks for.
func (w *watch) wait(ctx context.Context, name string, done func(*corev1.Pod) bool) (time.Time, error) {
	stop := context.AfterFunc(ctx, w.changed.Broadcast)
	defer stop()
	w.mu.Lock()
	defer w.mu.Unlock()
	for {
		for _, s := range w.seen[name] {
			if done(s.pod) {
				return s.at, nil
			}
		}
		if ctx.Err() != nil {
			return time.Time{}, fmt.Errorf("not stamped: %w", ctx.Err())
		}
		w.changed.Wait()
	}
}

func ms(d time.Duration) string {
	return fmt.Sprintf("%dms", d.Round(time.Millisecond).Milliseconds())
}

func ratio(a, b time.Duration) string {
	if b <= 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.1fx", float64(a)/float64(b))
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}
