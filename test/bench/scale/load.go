package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/coroner-dev/coroner/agent/fence"
	"github.com/coroner-dev/coroner/cri"
	"github.com/coroner-dev/coroner/test/bench/measure"
	"github.com/coroner-dev/coroner/test/harness"
)

// agentNamespace is where the fencers keep their Leases (coroner-agent's default).
const agentNamespace = "coroner-system"

// loadGoal is the bar: coroner's agents add at most this share of the kubelets'
// write rate at rest.
const loadGoal = 0.10

// loadResult is the load scenario's figures (scale-load.json).
type loadResult struct {
	Nodes               int                `json:"nodes"`
	Window              string             `json:"window"`
	FenceAfter          string             `json:"fenceAfter"`
	Goal                float64            `json:"goal"`
	KubeletWrites       float64            `json:"kubeletWritesPerSecond"`
	KubeletByKind       map[string]float64 `json:"kubeletWritesByKind"`
	OtherWrites         float64            `json:"otherWritesPerSecond"`
	APIServerCoresAlone float64            `json:"apiserverCoresKubeletsAlone"`
	EtcdCoresAlone      float64            `json:"etcdCoresKubeletsAlone"`
	KwokCores           float64            `json:"kwokCores"`
	Modes               []modeResult       `json:"agents"`
}

func runLoad(ctx context.Context, c config) error {
	began := time.Now()
	env, err := harness.Start(harness.Options{BinDir: c.binDir, Keep: c.keep})
	if err != nil {
		return fmt.Errorf("starting etcd and kube-apiserver: %w", err)
	}
	defer env.Stop()
	pids := env.PIDs() // etcd, kube-apiserver
	etcdPID, apiPID := pids[0], pids[1]
	admin := rest.CopyConfig(env.Config)
	admin.QPS, admin.Burst = 1000, 2000
	cs, err := kubernetes.NewForConfig(admin)
	if err != nil {
		return err
	}
	kwok, err := startKwok(ctx, env, c.binDir, "kwok", false, "")
	if err != nil {
		return err
	}
	defer kwok.Stop(10 * time.Second)
	fmt.Printf("bench-scale load: %d kwok nodes on kube-apiserver %s (working directory %s)\n", c.nodes, env.ServerVersion, env.Dir)
	t := time.Now()
	if err := createNodes(ctx, cs, c.nodes, 0); err != nil {
		return err
	}
	if err := waitNodesAlive(ctx, cs, c.nodes, 10*time.Minute); err != nil {
		return fmt.Errorf("%w\nkwok's log:\n%s", err, kwok.LogTail(20))
	}
	fmt.Printf("  %d nodes Ready with their Leases in %v\n", c.nodes, time.Since(t).Round(time.Second))

	// Window A: the kubelets (kwok) alone, after they settle.
	if err := sleep(ctx, 30*time.Second); err != nil {
		return err
	}
	a0, err := scrapeWrites(ctx, cs)
	if err != nil {
		return err
	}
	cpuA := [3]float64{cpuSeconds(apiPID), cpuSeconds(etcdPID), cpuSeconds(kwok.PID())}
	fmt.Printf("  window 1 (%v): the kubelets alone\n", c.window)
	if err := sleep(ctx, c.window); err != nil {
		return err
	}
	a1, err := scrapeWrites(ctx, cs)
	if err != nil {
		return err
	}
	cpuA1 := [3]float64{cpuSeconds(apiPID), cpuSeconds(etcdPID), cpuSeconds(kwok.PID())}
	alone := rates(a0, a1, c.window)
	kubelets := kubeletKinds(alone)

	res := loadResult{Nodes: c.nodes, Window: c.window.String(), FenceAfter: c.fenceAfter.String(), Goal: loadGoal,
		KubeletWrites: total(kubelets), KubeletByKind: map[string]float64{}, OtherWrites: total(alone) - total(kubelets),
		APIServerCoresAlone: (cpuA1[0] - cpuA[0]) / c.window.Seconds(), EtcdCoresAlone: (cpuA1[1] - cpuA[1]) / c.window.Seconds(),
		KwokCores: (cpuA1[2] - cpuA[2]) / c.window.Seconds()}
	for k, v := range kubelets {
		res.KubeletByKind[string(k)] = v
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: agentNamespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	for i, mode := range c.modes {
		fmt.Printf("  window %d (%v): the kubelets and %d agents that %s\n", i+2, c.window, c.nodes, modeAbout(mode, c.fenceAfter))
		m, err := measureAgents(ctx, c, env, cs, mode, alone, total(kubelets), [2]int{apiPID, etcdPID})
		if err != nil {
			return fmt.Errorf("agents %s: %w", mode, err)
		}
		res.Modes = append(res.Modes, m)
	}

	fmt.Printf("\n%d nodes at rest, each window %v            writes/s  agents/kubelets  API server cores  etcd cores  notes\n", c.nodes, c.window)
	fmt.Printf("%-46s %9.1f  %15s  %16.2f  %10.2f  %s; the API server's own writes besides: %.1f/s\n", "kubelets alone (kwok)", res.KubeletWrites, "",
		res.APIServerCoresAlone, res.EtcdCoresAlone, strings.Join(top(kubelets), ", "), res.OtherWrites)
	for _, m := range res.Modes {
		verdict := "missed"
		if m.Met {
			verdict = "met"
		}
		note := fmt.Sprintf("goal <= %.2f %s; the API server counted %.1f writes/s more than alone", loadGoal, verdict, m.ServerExtra)
		if m.Reads > 0 {
			note += fmt.Sprintf("; %.1f reads/s", m.Reads)
		}
		if m.Events > 0 {
			note += fmt.Sprintf("; %.1f watch events/s received", m.Events)
		}
		if m.WriteErrors > 0 || m.Fenced > 0 {
			note += fmt.Sprintf("; %d write errors, %d fenced", m.WriteErrors, m.Fenced)
		}
		fmt.Printf("%-46s %9.1f  %15.3f  %16.2f  %10.2f  %s\n", "+ agents: "+m.Mode, m.Writes, m.Ratio, m.APIServerCores, m.EtcdCores, note)
	}
	if err := writeJSON(c.jsonDir, "scale-load.json", res); err != nil {
		return err
	}
	fmt.Printf("\nbench-scale load took %v; figures in %s\n", time.Since(began).Round(time.Second), filepath.Join(c.jsonDir, "scale-load.json"))
	return nil
}

// Agent modes of the load scenario.
const (
	// modeRenew is coroner-agent's fencing as built: fence.Fencer renewing its Lease.
	modeRenew = "renew"
	// modeWatch models a fence that learns the API server's reach from the kubelet's own
	// Lease: a watch of the node's Lease in kube-node-lease (no write at rest).
	modeWatch = "watch"
	// modeGet models the same from a read of that Lease (resourceVersion 0, from the API
	// server's cache) every fence.RenewPeriod.
	modeGet = "get"
)

var allModes = []string{modeRenew, modeWatch, modeGet}

func modeAbout(mode string, fenceAfter time.Duration) string {
	switch mode {
	case modeRenew:
		return fmt.Sprintf("renew their fencing Lease every %v (coroner-agent's fence package, --fence-after=%v)", fence.RenewPeriod(fenceAfter), fenceAfter)
	case modeWatch:
		return "watch their node's Lease in kube-node-lease (a fence on the kubelet's heartbeat; no write)"
	default:
		return fmt.Sprintf("read their node's Lease from the API server's cache every %v (no write)", fence.RenewPeriod(fenceAfter))
	}
}

// modeResult is one agent mode's window.
type modeResult struct {
	Mode           string  `json:"mode"`
	Period         string  `json:"period,omitempty"`
	Writes         float64 `json:"writesPerSecond"`
	WriteErrors    int64   `json:"writeErrors"`
	Reads          float64 `json:"readsPerSecond"`
	Events         float64 `json:"watchEventsPerSecond"`
	ServerExtra    float64 `json:"writesPerSecondMoreByTheServer"`
	Ratio          float64 `json:"agentsOverKubelets"`
	Met            bool    `json:"met"`
	APIServerCores float64 `json:"apiserverCores"`
	EtcdCores      float64 `json:"etcdCores"`
	AgentsCores    float64 `json:"agentsCores"`
	Fenced         int64   `json:"fencedAtTheEnd"`
}

// measureAgents runs one agent per node in mode, lets them settle, measures one window
// and stops them.
func measureAgents(ctx context.Context, c config, env *harness.Env, cs kubernetes.Interface, mode string, alone map[writeKey]float64, kubelets float64, pids [2]int) (modeResult, error) {
	m := modeResult{Mode: mode}
	counter := &writeCounter{}
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Burst = -1, 0 // no client-side limit: each agent has its own
	cfg.WrapTransport = counter.wrap
	acs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return m, err
	}
	period := fence.RenewPeriod(c.fenceAfter)
	actx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		stop()
		wg.Wait()
	}()
	var fencers []*fence.Fencer
	var events atomic.Int64
	synced := make(chan struct{}, c.nodes)
	for i := range c.nodes {
		node := nodeName(i)
		// Agents start at different times: each at a random point of one period.
		delay := time.Duration(rand.Int64N(int64(period)))
		var run func()
		switch mode {
		case modeRenew:
			m.Period = period.String()
			f, err := newFencer(node, acs, c.fenceAfter)
			if err != nil {
				return m, err
			}
			fencers = append(fencers, f)
			run = func() { synced <- struct{}{}; f.Run(actx) }
		case modeWatch:
			run = func() { watchLease(actx, acs, node, &events, synced) }
		case modeGet:
			m.Period = period.String()
			run = func() { getLease(actx, acs, node, period, synced) }
		default:
			return m, fmt.Errorf("unknown agent mode %q", mode)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-actx.Done():
				return
			case <-time.After(delay):
			}
			run()
		}()
	}
	for range c.nodes {
		select {
		case <-ctx.Done():
			return m, ctx.Err()
		case <-synced:
		}
	}
	if mode == modeRenew {
		if err := waitAgentLeases(ctx, cs, c.nodes, 5*time.Minute); err != nil {
			return m, err
		}
	}
	if err := sleep(ctx, period+10*time.Second); err != nil {
		return m, err
	}
	s0, err := scrapeWrites(ctx, cs)
	if err != nil {
		return m, err
	}
	w0, e0, r0, ev0 := counter.writes.Load(), counter.errors.Load(), counter.reads.Load(), events.Load()
	cpu0 := [3]float64{cpuSeconds(pids[0]), cpuSeconds(pids[1]), cpuSeconds(os.Getpid())}
	if err := sleep(ctx, c.window); err != nil {
		return m, err
	}
	s1, err := scrapeWrites(ctx, cs)
	if err != nil {
		return m, err
	}
	w := c.window.Seconds()
	cpu1 := [3]float64{cpuSeconds(pids[0]), cpuSeconds(pids[1]), cpuSeconds(os.Getpid())}
	m.Writes = float64(counter.writes.Load()-w0) / w
	m.WriteErrors = counter.errors.Load() - e0
	m.Reads = float64(counter.reads.Load()-r0) / w
	m.Events = float64(events.Load()-ev0) / w
	m.ServerExtra = total(rates(s0, s1, c.window)) - total(alone)
	m.APIServerCores, m.EtcdCores, m.AgentsCores = (cpu1[0]-cpu0[0])/w, (cpu1[1]-cpu0[1])/w, (cpu1[2]-cpu0[2])/w
	for _, f := range fencers {
		if f.Fenced() {
			m.Fenced++
		}
	}
	if kubelets > 0 {
		m.Ratio = m.Writes / kubelets
	}
	m.Met = m.Ratio <= loadGoal && m.WriteErrors == 0 && m.Fenced == 0
	return m, nil
}

// watchLease watches node's Lease in kube-node-lease, counting its events, until ctx ends.
func watchLease(ctx context.Context, cs kubernetes.Interface, node string, events *atomic.Int64, synced chan<- struct{}) {
	lw := cache.NewListWatchFromClient(cs.CoordinationV1().RESTClient(), "leases", corev1.NamespaceNodeLease, fields.OneTermEqualSelector("metadata.name", node))
	inf := cache.NewSharedIndexInformer(lw, &coordinationv1.Lease{}, 0, cache.Indexers{})
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { events.Add(1) },
		UpdateFunc: func(any, any) { events.Add(1) },
	})
	go inf.Run(ctx.Done())
	cache.WaitForCacheSync(ctx.Done(), inf.HasSynced)
	synced <- struct{}{}
	<-ctx.Done()
}

// getLease reads node's Lease from the API server's cache every period until ctx ends.
func getLease(ctx context.Context, cs kubernetes.Interface, node string, period time.Duration, synced chan<- struct{}) {
	synced <- struct{}{}
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		_, _ = cs.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, node, metav1.GetOptions{ResourceVersion: "0"})
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// kubeletKinds keeps the writes of r a kubelet makes at rest: its node Lease and its
// Node's status (the API server's own writes, its identity Lease among them, are few).
func kubeletKinds(r map[writeKey]float64) map[writeKey]float64 {
	out := map[writeKey]float64{}
	for k, v := range r {
		if what := strings.Fields(string(k)); len(what) == 2 && (what[1] == "leases" || strings.HasPrefix(what[1], "nodes")) {
			out[k] = v
		}
	}
	return out
}

// waitAgentLeases waits until n agent Leases exist in agentNamespace.
func waitAgentLeases(ctx context.Context, cs kubernetes.Interface, n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		ls, err := cs.CoordinationV1().Leases(agentNamespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		if len(ls.Items) >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %v: %d of %d agent Leases", timeout, len(ls.Items), n)
		}
		if err := sleep(ctx, 2*time.Second); err != nil {
			return err
		}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

func writeJSON(dir, name string, v any) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, name), append(b, '\n'), 0o644)
}

// writeCounter counts the requests that pass through a client's transport: writes (and
// the failed ones) and reads (GETs; a watch counts once, when it starts).
type writeCounter struct{ writes, errors, reads atomic.Int64 }

func (w *writeCounter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(req)
		if req.Method == http.MethodGet {
			w.reads.Add(1)
		}
		if writeVerbs[req.Method] {
			w.writes.Add(1)
			if err != nil || resp.StatusCode >= 300 {
				w.errors.Add(1)
			}
		}
		return resp, err
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// newFencer is coroner-agent's fencing for node, as the agent runs it, on a node without
// containers: it only renews its Lease (and would fence nothing).
func newFencer(node string, acs kubernetes.Interface, fenceAfter time.Duration) (*fence.Fencer, error) {
	return fence.New(fence.Config{NodeName: node, Namespace: agentNamespace, FenceAfter: fenceAfter,
		Client: acs, Runtime: noRuntime{}, Pods: func() []*corev1.Pod { return nil }, Recorder: &record.FakeRecorder{}})
}

// noRuntime is a node without containers: the fencers only renew.
type noRuntime struct{}

func (noRuntime) RunningContainers(context.Context) ([]cri.Container, error) { return nil, nil }
func (noRuntime) StopContainer(context.Context, string, time.Duration) error { return nil }

// cpuSeconds is a process's user+system CPU time in seconds (0 when unreadable).
func cpuSeconds(pid int) float64 {
	d, _ := measure.CPUTime(pid)
	return d.Seconds()
}
