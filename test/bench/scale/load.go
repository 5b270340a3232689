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

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"

	"github.com/coroner-dev/coroner/agent/fence"
	"github.com/coroner-dev/coroner/conditions"
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
		if m.LeasesWritten < c.nodes {
			note += fmt.Sprintf("; only %d of %d agents had written their Lease when the window began", m.LeasesWritten, c.nodes)
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

// Agent modes of the load scenario: coroner-agent's fence.Fencer, as the agent runs it,
// with each --fence-signal.
const (
	// modeAgentLease renews the agent's own Lease every fence.RenewPeriod
	// (--fence-signal=agent-lease, the first design).
	modeAgentLease = "agent-lease"
	// modeNodeLease watches the kubelet's node Lease in kube-node-lease and writes the
	// agent's own Lease once, at the start (--fence-signal=node-lease, the default).
	modeNodeLease = "node-lease"
)

var allModes = []string{modeAgentLease, modeNodeLease}

func modeAbout(mode string, fenceAfter time.Duration) string {
	if mode == modeAgentLease {
		return fmt.Sprintf("renew their fencing Lease every %v (coroner-agent's fence package, --fence-signal=agent-lease --fence-after=%v)", fence.RenewPeriod(fenceAfter), fenceAfter)
	}
	return fmt.Sprintf("watch their kubelet's Lease in kube-node-lease (coroner-agent's fence package, --fence-signal=node-lease --fence-after=%v; their own Lease written once, at the start)", fenceAfter)
}

// modeAnnotation is the annotation the mode's agents write on their Lease.
func modeAnnotation(mode string) string {
	if mode == modeNodeLease {
		return conditions.AnnotationFenceOnNodeLease
	}
	return conditions.AnnotationFenceAfter
}

// modeResult is one agent mode's window.
type modeResult struct {
	Mode           string  `json:"mode"`
	Period         string  `json:"period,omitempty"`
	Writes         float64 `json:"writesPerSecond"`
	WriteErrors    int64   `json:"writeErrors"`
	Reads          float64 `json:"readsPerSecond"`
	ServerExtra    float64 `json:"writesPerSecondMoreByTheServer"`
	Ratio          float64 `json:"agentsOverKubelets"`
	Met            bool    `json:"met"`
	APIServerCores float64 `json:"apiserverCores"`
	EtcdCores      float64 `json:"etcdCores"`
	AgentsCores    float64 `json:"agentsCores"`
	Fenced         int64   `json:"fencedAtTheEnd"`
	// LeasesWritten is how many agents had written their Lease (with the mode's
	// annotation) when the window began: all of them, unless the API server could not
	// take their writes within 3 minutes.
	LeasesWritten int `json:"agentLeasesWritten"`
}

// measureAgents runs one agent per node in mode, lets them settle, measures one window
// and stops them.
func measureAgents(ctx context.Context, c config, env *harness.Env, cs kubernetes.Interface, mode string, alone map[writeKey]float64, kubelets float64, pids [2]int) (modeResult, error) {
	m := modeResult{Mode: mode}
	counter := &writeCounter{}
	period := fence.RenewPeriod(c.fenceAfter)
	actx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		stop()
		wg.Wait()
	}()
	var fencers []*fence.Fencer
	synced := make(chan struct{}, c.nodes)
	var acs kubernetes.Interface
	for i := range c.nodes {
		node := nodeName(i)
		// Agents start at different times: each at a random point of one period.
		delay := time.Duration(rand.Int64N(int64(period)))
		if mode != modeAgentLease && mode != modeNodeLease {
			return m, fmt.Errorf("unknown agent mode %q", mode)
		}
		if mode == modeAgentLease {
			m.Period = period.String()
		}
		if i%agentsPerConnection == 0 {
			var err error
			if acs, err = agentClient(env.Config, counter); err != nil {
				return m, err
			}
		}
		f, err := newFencerWith(node, acs, c.fenceAfter, mode == modeNodeLease)
		if err != nil {
			return m, err
		}
		fencers = append(fencers, f)
		run := func() { synced <- struct{}{}; f.Run(actx) }
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
	// An API server that cannot take the agents' first writes is a result, not a failure
	// of the benchmark: the window is measured all the same, and says so.
	var err error
	if m.LeasesWritten, err = waitAgentLeases(ctx, cs, c.nodes, modeAnnotation(mode), 3*time.Minute); err != nil {
		if ctx.Err() != nil {
			return m, err
		}
		fmt.Printf("    %v; measuring anyway\n", err)
	}
	if err := sleep(ctx, period+10*time.Second); err != nil {
		return m, err
	}
	s0, err := scrapeWrites(ctx, cs)
	if err != nil {
		return m, err
	}
	w0, e0, r0 := counter.writes.Load(), counter.errors.Load(), counter.reads.Load()
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
	m.Met = m.Ratio <= loadGoal && m.WriteErrors == 0 && m.Fenced == 0 && m.LeasesWritten == c.nodes
	return m, nil
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

// waitAgentLeases waits until n agent Leases in agentNamespace carry annotation, and
// returns how many do (with an error when fewer than n after timeout).
func waitAgentLeases(ctx context.Context, cs kubernetes.Interface, n int, annotation string, timeout time.Duration) (int, error) {
	deadline := time.Now().Add(timeout)
	for {
		// From the API server's cache, and errors retried: a list of 5,000 Leases on a
		// saturated API server may be cut off (the stream reset).
		ls, err := cs.CoordinationV1().Leases(agentNamespace).List(ctx, metav1.ListOptions{ResourceVersion: "0"})
		have := 0
		if err == nil {
			for i := range ls.Items {
				if _, ok := ls.Items[i].Annotations[annotation]; ok {
					have++
				}
			}
			if have >= n {
				return have, nil
			}
		}
		if time.Now().After(deadline) {
			return have, fmt.Errorf("after %v: %d of %d agent Leases with %s (last error: %v)", timeout, have, n, annotation, err)
		}
		if err := sleep(ctx, 2*time.Second); err != nil {
			return have, err
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
// containers (it would fence nothing): with nodeLease on the kubelet's node Lease, its pod
// agentPodName(node), else renewing its own Lease. It has a client of its own
// (agentClient), its requests counted in counter when that is not nil.
func newFencer(node string, base *rest.Config, counter *writeCounter, fenceAfter time.Duration, nodeLease bool) (*fence.Fencer, error) {
	acs, err := agentClient(base, counter)
	if err != nil {
		return nil, err
	}
	return newFencerWith(node, acs, fenceAfter, nodeLease)
}

// agentsPerConnection is how many of the load scenario's agents share a client and its
// connection: 50 use at most 50 of a connection's 100 HTTP/2 streams for their watches
// (node-lease: one each), which leaves 50 for their writes; 100 connections for 5,000
// nodes. A connection each, as in a cluster, costs this process 5,000 TLS sessions on the
// 2 cores the API server needs; one client for all put the writes behind the watches'
// streams (agentClient). What the scenario measures is the writes, which do not depend on
// the connection they take. (At 5,000 nodes neither a connection each nor this pool set
// up on 2026-11-29: the kubelets alone already saturated the API server, docs/performance.md.)
const agentsPerConnection = 50

// newFencerWith is newFencer on a client the caller gives.
func newFencerWith(node string, acs kubernetes.Interface, fenceAfter time.Duration, nodeLease bool) (*fence.Fencer, error) {
	return fence.New(fence.Config{NodeName: node, Namespace: agentNamespace, FenceAfter: fenceAfter,
		Client: acs, Runtime: noRuntime{}, Pods: func() []*corev1.Pod { return nil }, Recorder: &record.FakeRecorder{},
		NodeLease: nodeLease, Pod: types.NamespacedName{Namespace: agentNamespace, Name: agentPodName(node)}})
}

// agentClient is a client for one agent, as each coroner-agent has its own (the load
// scenario gives one to agentsPerConnection agents): a connection of its own
// (ownConnection) and no client-side rate limit (the agent's limits are never reached at
// rest), its requests counted in counter when that is not nil. The agents must not all
// share one connection: kube-apiserver allows 100 HTTP/2 streams on one (its default), each
// agent on the node Lease keeps one open with its watch, and client-go's transport can
// put a request on a connection whose streams are all taken, where it waits for one to
// close. 5,000 agents on one client got 4,493 of their start-up writes through in 5 min
// (2026-11-28).
func agentClient(base *rest.Config, counter *writeCounter) (kubernetes.Interface, error) {
	cfg := ownConnection(base)
	cfg.QPS, cfg.Burst = -1, 0
	if counter != nil {
		cfg.WrapTransport = counter.wrap
	}
	return kubernetes.NewForConfig(cfg)
}

// agentPodName is the name of the agent's pod on node.
func agentPodName(node string) string { return "coroner-agent-" + node }

// noRuntime is a node without containers: the fencers only renew.
type noRuntime struct{}

func (noRuntime) RunningContainers(context.Context) ([]cri.Container, error) { return nil, nil }
func (noRuntime) StopContainer(context.Context, string, time.Duration) error { return nil }

// cpuSeconds is a process's user+system CPU time in seconds (0 when unreadable).
func cpuSeconds(pid int) float64 {
	d, _ := measure.CPUTime(pid)
	return d.Seconds()
}

// requests is every request counted so far, reads and writes.
func (w *writeCounter) requests() int64 { return w.writes.Load() + w.reads.Load() }
