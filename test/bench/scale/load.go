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
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"

	"github.com/coroner-dev/coroner/agent/fence"
	"github.com/coroner-dev/coroner/cri"
	"github.com/coroner-dev/coroner/test/harness"
)

// agentNamespace is where the fencers keep their Leases (coroner-agent's default).
const agentNamespace = "coroner-system"

// loadGoal is the bar: coroner's agents add at most this share of the kubelets'
// write rate at rest.
const loadGoal = 0.10

// loadResult is the load scenario's figures (scale-load.json).
type loadResult struct {
	Nodes              int                `json:"nodes"`
	Window             string             `json:"window"`
	FenceAfter         string             `json:"fenceAfter"`
	RenewPeriod        string             `json:"renewPeriod"`
	KubeletWrites      float64            `json:"kubeletWritesPerSecond"`
	KubeletByKind      map[string]float64 `json:"kubeletWritesByKind"`
	AgentWrites        float64            `json:"agentWritesPerSecond"`
	AgentWriteErrors   int64              `json:"agentWriteErrors"`
	AgentServerExtra   float64            `json:"agentWritesPerSecondByTheServer"`
	Ratio              float64            `json:"agentsOverKubelets"`
	Goal               float64            `json:"goal"`
	Met                bool               `json:"met"`
	APIServerCoresA    float64            `json:"apiserverCoresKubeletsAlone"`
	APIServerCoresB    float64            `json:"apiserverCoresWithAgents"`
	EtcdCoresA         float64            `json:"etcdCoresKubeletsAlone"`
	EtcdCoresB         float64            `json:"etcdCoresWithAgents"`
	KwokCores          float64            `json:"kwokCores"`
	FencersCores       float64            `json:"fencersCores"`
	FencedDuringTheRun int64              `json:"fencedDuringTheRun"`
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
	kwok, err := startKwok(ctx, env, c.binDir)
	if err != nil {
		return err
	}
	defer kwok.Stop(10 * time.Second)
	fmt.Printf("bench-scale load: %d kwok nodes on kube-apiserver %s (working directory %s)\n", c.nodes, env.ServerVersion, env.Dir)
	t := time.Now()
	if err := createNodes(ctx, cs, c.nodes); err != nil {
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
	kubelets := rates(a0, a1, c.window)

	// Window B: one fencer per node besides.
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: agentNamespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	counter := &writeCounter{}
	agents := rest.CopyConfig(env.Config)
	agents.QPS, agents.Burst = -1, 0 // no client-side limit: each agent has its own
	agents.WrapTransport = counter.wrap
	acs, err := kubernetes.NewForConfig(agents)
	if err != nil {
		return err
	}
	period := fence.RenewPeriod(c.fenceAfter)
	fctx, stopFencers := context.WithCancel(ctx)
	var fencers []*fence.Fencer
	var wg sync.WaitGroup
	defer func() {
		stopFencers()
		wg.Wait()
	}()
	for i := range c.nodes {
		f, err := fence.New(fence.Config{NodeName: nodeName(i), Namespace: agentNamespace, FenceAfter: c.fenceAfter,
			Client: acs, Runtime: noRuntime{}, Pods: func() []*corev1.Pod { return nil }, Recorder: &record.FakeRecorder{}})
		if err != nil {
			return err
		}
		fencers = append(fencers, f)
		// Agents start at different times: each fencer starts at a random point of one
		// renew period.
		delay := time.Duration(rand.Int64N(int64(period)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-fctx.Done():
				return
			case <-time.After(delay):
			}
			f.Run(fctx)
		}()
	}
	fmt.Printf("  %d fencers (coroner-agent's fence package, --fence-after=%v: a renewal every %v) starting over one renew period\n", c.nodes, c.fenceAfter, period)
	if err := waitAgentLeases(ctx, cs, c.nodes, period+5*time.Minute); err != nil {
		return err
	}
	if err := sleep(ctx, period+10*time.Second); err != nil {
		return err
	}
	b0, err := scrapeWrites(ctx, cs)
	if err != nil {
		return err
	}
	n0, e0 := counter.writes.Load(), counter.errors.Load()
	cpuB := [4]float64{cpuSeconds(apiPID), cpuSeconds(etcdPID), cpuSeconds(kwok.PID()), cpuSeconds(os.Getpid())}
	fmt.Printf("  window 2 (%v): the kubelets and the agents\n", c.window)
	if err := sleep(ctx, c.window); err != nil {
		return err
	}
	b1, err := scrapeWrites(ctx, cs)
	if err != nil {
		return err
	}
	n1, e1 := counter.writes.Load(), counter.errors.Load()
	cpuB1 := [4]float64{cpuSeconds(apiPID), cpuSeconds(etcdPID), cpuSeconds(kwok.PID()), cpuSeconds(os.Getpid())}
	fenced := int64(0)
	for _, f := range fencers {
		if f.Fenced() {
			fenced++
		}
	}
	both := rates(b0, b1, c.window)

	w := c.window.Seconds()
	res := loadResult{
		Nodes: c.nodes, Window: c.window.String(), FenceAfter: c.fenceAfter.String(), RenewPeriod: period.String(),
		KubeletWrites: total(kubelets), KubeletByKind: map[string]float64{},
		AgentWrites: float64(n1-n0) / w, AgentWriteErrors: e1 - e0,
		AgentServerExtra: total(both) - total(kubelets),
		Goal:             loadGoal,
		APIServerCoresA:  (cpuA1[0] - cpuA[0]) / w, EtcdCoresA: (cpuA1[1] - cpuA[1]) / w,
		APIServerCoresB: (cpuB1[0] - cpuB[0]) / w, EtcdCoresB: (cpuB1[1] - cpuB[1]) / w,
		KwokCores: (cpuA1[2] - cpuA[2]) / w, FencersCores: (cpuB1[3] - cpuB[3]) / w,
		FencedDuringTheRun: fenced,
	}
	for k, v := range kubelets {
		res.KubeletByKind[string(k)] = v
	}
	if res.KubeletWrites > 0 {
		res.Ratio = res.AgentWrites / res.KubeletWrites
	}
	res.Met = res.Ratio <= loadGoal && res.AgentWriteErrors == 0 && fenced == 0

	fmt.Printf("\n%-44s %12s  %s\n", "writers at rest", "writes/s", "what")
	fmt.Printf("%-44s %12.1f  %s\n", fmt.Sprintf("kubelets (kwok, %d nodes)", c.nodes), res.KubeletWrites, strings.Join(top(kubelets), ", "))
	fmt.Printf("%-44s %12.1f  %s\n", fmt.Sprintf("coroner agents (%d, fencing, every %v)", c.nodes, period), res.AgentWrites,
		fmt.Sprintf("counted by their client; the API server counted %.1f/s more than in window 1", res.AgentServerExtra))
	fmt.Printf("%-44s %12.3f  goal <= %.2f: %s\n", "agents / kubelets", res.Ratio, loadGoal, map[bool]string{true: "met", false: "missed"}[res.Met])
	fmt.Printf("%-44s %12s  apiserver %.2f -> %.2f cores, etcd %.2f -> %.2f, kwok %.2f, the fencers %.2f\n", "CPU, window 1 -> window 2", "",
		res.APIServerCoresA, res.APIServerCoresB, res.EtcdCoresA, res.EtcdCoresB, res.KwokCores, res.FencersCores)
	if res.AgentWriteErrors > 0 || fenced > 0 {
		fmt.Printf("agents: %d write errors in window 2, %d fenced at its end\n", res.AgentWriteErrors, fenced)
	}
	if err := writeJSON(c.jsonDir, "scale-load.json", res); err != nil {
		return err
	}
	fmt.Printf("\nbench-scale load took %v; figures in %s\n", time.Since(began).Round(time.Second), filepath.Join(c.jsonDir, "scale-load.json"))
	return nil
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

// writeCounter counts the write requests that pass through a client's transport.
type writeCounter struct{ writes, errors atomic.Int64 }

func (w *writeCounter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(req)
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

// noRuntime is a node without containers: the fencers only renew.
type noRuntime struct{}

func (noRuntime) RunningContainers(context.Context) ([]cri.Container, error) { return nil, nil }
func (noRuntime) StopContainer(context.Context, string, time.Duration) error { return nil }
