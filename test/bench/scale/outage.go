package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/agent/fence"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/test/bench/measure"
	"github.com/coroner-dev/coroner/test/harness"
	"github.com/coroner-dev/coroner/test/host"
)

// outageGoal is the bar: every opted-in pod replaced within this long of its
// node's unreachable taint, at coroner's settings.
const outageGoal = 90 * time.Second

// The outage scenario's groups of Jobs: the same kind of Job, handed to each controller.
const (
	groupCoroner = "coroner"
	groupBuiltin = "built-in"
	// groupKueue's Jobs are the built-in controller's (podReplacementPolicy Failed), their
	// pods opted in to Kueue's failure recovery (FailureRecoveryPolicy).
	groupKueue = "kueue"
)

// outageGroups are the groups in the order they are created and reported.
var outageGroups = []string{groupCoroner, groupBuiltin, groupKueue}

// groupNamespaces holds each group's Jobs in a namespace of its own.
var groupNamespaces = map[string]string{groupCoroner: "outage-coroner", groupBuiltin: "outage-builtin", groupKueue: "outage-kueue"}

// outageResult is the outage scenario's figures (scale-outage.json).
type outageResult struct {
	Nodes      int    `json:"nodes"`
	Down       int    `json:"nodesDown"`
	FenceAfter string `json:"fenceAfter"`
	ShimQPS    int    `json:"shimQPS"`
	Wait       string `json:"wait"`
	// Seconds from the outage to the node controller's unreachable taints on the dark
	// nodes (the NoSchedule one, which it adds at once; coroner acts on either).
	TaintFirst float64 `json:"taintFirstSeconds"`
	TaintLast  float64 `json:"taintLastSeconds"`
	// NoExecute is how many dark nodes had the NoExecute unreachable taint by the end:
	// the node controller adds it at --node-eviction-rate per zone.
	NoExecute int `json:"noExecuteTainted"`
	// Requests per second the API server served at rest before the outage, and over the
	// storm (the outage until coroner's last replacement Running, or the wait).
	RestRequests  float64  `json:"restRequestsPerSecond"`
	RestWrites    float64  `json:"restWritesPerSecond"`
	StormRequests float64  `json:"stormRequestsPerSecond"`
	StormWrites   float64  `json:"stormWritesPerSecond"`
	StormSeconds  float64  `json:"stormSeconds"`
	StormTop      []string `json:"stormTopWrites"`
	// The shim's own requests over the storm (through its counting proxy), and its most in
	// any one second: its client allows --shim-qps, bursts of twice that.
	ShimRequests int64 `json:"shimRequests"`
	ShimPeak     int64 `json:"shimPeakRequestsInASecond"`
	// WaitSeconds is how long the scenario watched after the outage: until every lost pod
	// of every group was replaced, or -outage-wait.
	WaitSeconds float64 `json:"waitSeconds"`
	// KueueToleration is the kueue group's pods' toleration of the NoExecute unreachable
	// taint (-kueue-toleration); empty: the API server's default, 300 s.
	KueueToleration string `json:"kueueToleration,omitempty"`
	// Kueue's manager's own requests (through its counting proxy): per second at rest,
	// then from the outage to the end of the wait, and its most in any one second then
	// (its client: kueueQPS, bursts of twice that).
	KueueRestRequests float64        `json:"kueueRestRequestsPerSecond"`
	KueueRequests     int64          `json:"kueueRequests"`
	KueuePeak         int64          `json:"kueuePeakRequestsInASecond"`
	Groups            []outageGroup  `json:"groups"`
	Setup             map[string]any `json:"setup"`
}

// outageGroup is one controller's figures.
type outageGroup struct {
	Name string `json:"name"`
	Pods int    `json:"pods"`
	// Lost is how many of its pods ran on the dark nodes; Replaced how many of those had
	// a replacement Running by the end of the wait.
	Lost     int `json:"lost"`
	Replaced int `json:"replaced"`
	// LostNodes is how many dark nodes its lost pods were on; OnNoExecute how many of its
	// lost pods were on a node with the NoExecute unreachable taint by the end (those the
	// taint eviction could have deleted).
	LostNodes   int `json:"lostNodes"`
	OnNoExecute int `json:"lostOnNoExecuteNodes"`
	// Seconds from the outage, from the pod's node's first unreachable taint, and from its
	// NoExecute one (what the taint eviction, and so the built-in controller and Kueue,
	// wait for), to the replacement Running: p50, p99, max over the replaced (for the
	// last, over those whose node had the NoExecute taint by the end; negative: the
	// replacement ran before it).
	FromOutage    [3]float64 `json:"fromOutageP50P99Max"`
	FromTaint     [3]float64 `json:"fromTaintP50P99Max"`
	FromNoExecute [3]float64 `json:"fromNoExecuteP50P99Max"`
	WithinGoal    int        `json:"withinGoalOfTaint"`
	// Twice counts lost indexes with more than one new pod; Spurious new pods of indexes
	// whose pod was not on a dark node.
	Twice    int `json:"replacedTwice"`
	Spurious int `json:"spurious"`
	// StillTerminating counts lost pods still in the API at the end, being deleted.
	StillTerminating int `json:"stillTerminating"`
}

// slot is one index of one Job: the pod that ran it before the outage, and what came after.
type slot struct {
	group   string
	before  types.UID
	node    string
	newPods map[types.UID]bool
	running time.Time // the first new pod seen Running
}

// outageState is what the informers saw, under mu.
type outageState struct {
	mu      sync.Mutex
	t0      time.Time // the outage; zero before
	slots   map[string]*slot
	taints  map[string]time.Time // dark node -> unreachable taint seen
	noExec  map[string]time.Time // dark node -> NoExecute unreachable taint seen
	dark    map[string]bool
	running map[string]int // group -> pods Running (before the outage)
}

func slotKey(ns, job, index string) string { return ns + "/" + job + "/" + index }

func runOutage(ctx context.Context, c config) error {
	began := time.Now()
	c.nodes = c.outageNodes // its own size: the agents, startFencers and the rest read c.nodes
	res := outageResult{Nodes: c.nodes, Down: c.down, FenceAfter: c.fenceAfter.String(), ShimQPS: c.shimQPS, Wait: c.outageWait.String(), Setup: map[string]any{"shimRecoverPods": c.shimRecoverPods}}
	if c.kueuePods > 0 && c.kueueToleration > 0 {
		res.KueueToleration = c.kueueToleration.String()
	}
	shimBin := filepath.Join(c.binDir, "coroner-shim")
	if _, err := os.Stat(shimBin); err != nil {
		return fmt.Errorf("%w: run `make build` first", err)
	}
	env, err := harness.Start(harness.Options{BinDir: c.binDir, Keep: c.keep})
	if err != nil {
		return fmt.Errorf("starting etcd and kube-apiserver: %w", err)
	}
	defer env.Stop()
	admin := rest.CopyConfig(env.Config)
	admin.QPS, admin.Burst = 1000, 2000
	cs, err := kubernetes.NewForConfig(admin)
	if err != nil {
		return err
	}
	// Two kwoks, as two groups of kubelets: the zone that goes dark, and the rest.
	kwok, err := startKwok(ctx, env, c.binDir, "kwok", true, darkLabel+"=lit")
	if err != nil {
		return err
	}
	defer kwok.Stop(10 * time.Second)
	kwokDark, err := startKwok(ctx, env, c.binDir, "kwok-dark", true, darkLabel+"=dark")
	if err != nil {
		return err
	}
	defer kwokDark.Stop(10 * time.Second)
	fmt.Printf("bench-scale outage: %d kwok nodes on kube-apiserver %s (working directory %s)\n", c.nodes, env.ServerVersion, env.Dir)
	t := time.Now()
	if err := createNodes(ctx, cs, c.nodes, c.down); err != nil {
		return err
	}
	if err := waitNodesAlive(ctx, cs, c.nodes, 10*time.Minute); err != nil {
		return fmt.Errorf("%w\nkwok's log:\n%s", err, kwok.LogTail(20))
	}
	fmt.Printf("  %d nodes Ready with their Leases in %v\n", c.nodes, time.Since(t).Round(time.Second))
	res.Setup["nodesReadySeconds"] = time.Since(t).Seconds()

	// The agents' fencing Leases, one fencer per node, as coroner-agent runs them.
	for _, ns := range []string{agentNamespace, groupNamespaces[groupCoroner], groupNamespaces[groupBuiltin], groupNamespaces[groupKueue]} {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	if c.fenceSignal == conditions.FenceSignalNodeLease {
		// The shim trusts a fence on the kubelet's Lease only from an agent whose pod it
		// sees ready: the DaemonSet's pods, which kwok runs.
		t := time.Now()
		if err := createAgentPods(ctx, cs, c.nodes); err != nil {
			return err
		}
		fmt.Printf("  %d agent pods Ready in %v\n", c.nodes, time.Since(t).Round(time.Second))
	}
	stopAgent, stopAgents, err := startFencers(ctx, env, c)
	if err != nil {
		return err
	}
	defer stopAgents()
	if _, err := waitAgentLeases(ctx, cs, c.nodes, modeAnnotation(c.fenceSignal), 5*time.Minute); err != nil {
		return err
	}
	if c.fenceSignal == conditions.FenceSignalNodeLease {
		fmt.Printf("  %d agents watch their kubelet's Lease (--fence-signal=node-lease --fence-after=%v)\n", c.nodes, c.fenceAfter)
	} else {
		fmt.Printf("  %d agents renew their fencing Leases every %v (--fence-signal=agent-lease --fence-after=%v)\n", c.nodes, fence.RenewPeriod(c.fenceAfter), c.fenceAfter)
	}

	stopSched, err := env.StartScheduler(200)
	if err != nil {
		return fmt.Errorf("kube-scheduler: %w", err)
	}
	defer stopSched()
	// The built-in Job controller, the node lifecycle controller with its taint-based
	// eviction, and pod GC, at their defaults but the client's rate (a cluster of 5,000
	// nodes raises kube-controller-manager's 20 QPS too).
	stopKCM, err := env.StartControllerManagerWith([]string{"--kube-api-qps=100", "--kube-api-burst=200"},
		"job", "nodelifecycle", "taint-eviction-controller", "podgc")
	if err != nil {
		return fmt.Errorf("kube-controller-manager: %w", err)
	}
	defer stopKCM()
	shimCounter := &writeCounter{}
	shimCtx, stopProxy := context.WithCancel(ctx)
	defer stopProxy()
	shim, err := startShim(shimCtx, env, shimBin, c, shimCounter)
	if err != nil {
		return err
	}
	defer shim.Stop(10 * time.Second)
	// Kueue's manager, with its failure recovery (FailureRecoveryPolicy) on.
	kueueCounter := &writeCounter{}
	var kueue *host.Process
	if c.kueuePods > 0 {
		t := time.Now()
		var cleanup func()
		kueue, cleanup, err = startKueue(shimCtx, env, c.binDir, kueueCounter)
		defer cleanup()
		if err != nil {
			return err
		}
		defer kueue.Stop(10 * time.Second) // before cleanup
		fmt.Printf("  Kueue %s's manager running, its failure recovery controller started, in %v\n", kueueVersion, time.Since(t).Round(time.Second))
		res.Setup["kueueReadySeconds"] = time.Since(t).Seconds()
	}

	st := newOutageState()
	for i := range c.down {
		st.dark[nodeName(i)] = true // zone-00's nodes: kwok-node-00000 on
	}
	factory := informers.NewSharedInformerFactory(cs, 0)
	fctx, stopInformers := context.WithCancel(ctx)
	podInf := factory.Core().V1().Pods().Informer()
	nodeInf := factory.Core().V1().Nodes().Informer()
	_, _ = podInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { st.pod(o.(*corev1.Pod)) },
		UpdateFunc: func(_, o any) { st.pod(o.(*corev1.Pod)) },
	})
	_, _ = nodeInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(_, o any) { st.node(o.(*corev1.Node)) },
	})
	factory.Start(fctx.Done())
	defer factory.Shutdown()
	defer stopInformers() // first: Shutdown waits for the informers to stop
	factory.WaitForCacheSync(fctx.Done())

	t = time.Now()
	jobs := map[string]int{groupCoroner: c.pods, groupBuiltin: c.builtinPods, groupKueue: c.kueuePods}
	for _, g := range outageGroups {
		if err := createOutageJobs(ctx, cs, g, jobs[g], c.kueueToleration); err != nil {
			return err
		}
	}
	// At the size (5,000 nodes, 12,000 pods) this machine's saturated API server
	// took the pods to Running at about 11 a second (2026-11-28: 5,328 of coroner's 10,000
	// after 13 min), so the wait grows with the pods: 150 ms each, at least 15 min.
	setupWait := max(15*time.Minute, time.Duration(c.pods+c.builtinPods+c.kueuePods)*150*time.Millisecond)
	if err := waitFor(ctx, setupWait, func() (bool, string) {
		st.mu.Lock()
		defer st.mu.Unlock()
		return st.running[groupCoroner] >= c.pods && st.running[groupBuiltin] >= c.builtinPods && st.running[groupKueue] >= c.kueuePods,
			fmt.Sprintf("%d of %d coroner pods, %d of %d built-in pods and %d of %d kueue pods Running", st.running[groupCoroner], c.pods,
				st.running[groupBuiltin], c.builtinPods, st.running[groupKueue], c.kueuePods)
	}); err != nil {
		return fmt.Errorf("%w\ncoroner-shim's log:\n%s", err, shim.LogTail(20))
	}
	fmt.Printf("  %d pods of coroner's Jobs, %d of the built-in controller's and %d of the kueue group's Running in %v\n", c.pods, c.builtinPods, c.kueuePods, time.Since(t).Round(time.Second))
	res.Setup["podsRunningSeconds"] = time.Since(t).Seconds()

	// At rest, with every pod Running.
	if err := sleep(ctx, 20*time.Second); err != nil {
		return err
	}
	r0, err := scrapeRequests(ctx, cs)
	if err != nil {
		return err
	}
	k0 := kueueCounter.requests()
	restWindow := 60 * time.Second
	if err := sleep(ctx, restWindow); err != nil {
		return err
	}
	r1, err := scrapeRequests(ctx, cs)
	if err != nil {
		return err
	}
	res.RestRequests, res.RestWrites = total(rates(r0, r1, restWindow)), total(writesOnly(rates(r0, r1, restWindow)))
	res.KueueRestRequests = float64(kueueCounter.requests()-k0) / restWindow.Seconds()

	// The outage: the zone's agents and kubelets (their kwok) stop at once.
	lost := map[string]int{}
	st.mu.Lock()
	for _, s := range st.slots {
		if st.dark[s.node] {
			lost[s.group]++
		}
	}
	st.t0 = time.Now()
	t0 := st.t0
	st.mu.Unlock()
	for i := range c.down {
		stopAgent(nodeName(i))
	}
	kwokDark.Stop(0) // its nodes' Leases lapse, and nothing confirms their pods' end
	fmt.Printf("  outage: %d nodes (zone-00) and their agents stopped at once, in %v; %d coroner pods, %d built-in pods and %d kueue pods on them\n",
		c.down, time.Since(t0).Round(time.Millisecond), lost[groupCoroner], lost[groupBuiltin], lost[groupKueue])
	s0, err := scrapeRequests(ctx, cs)
	if err != nil {
		return err
	}
	shim0 := shimCounter.requests()
	peak := peakRate(ctx, shimCounter.requests)
	kueue0 := kueueCounter.requests()
	kueuePeak := peakRate(ctx, kueueCounter.requests)
	stormEnd := time.Time{}
	var s1 writeCounts
	deadline := t0.Add(c.outageWait)
	lastPrint := time.Now()
	for time.Now().Before(deadline) {
		if err := sleep(ctx, 2*time.Second); err != nil {
			return err
		}
		replaced := st.replaced()
		if stormEnd.IsZero() && replaced[groupCoroner] >= lost[groupCoroner] {
			stormEnd = time.Now()
			res.ShimRequests, res.ShimPeak = shimCounter.requests()-shim0, peak()
			if s1, err = scrapeRequests(ctx, cs); err != nil {
				return err
			}
			others := "the built-in controller and Kueue"
			if c.kueuePods == 0 {
				others = "the built-in controller"
			}
			fmt.Printf("  %v: every coroner pod replaced; waiting for %s until %v after the outage\n", time.Since(t0).Round(time.Second), others, c.outageWait)
		}
		if time.Since(lastPrint) >= 30*time.Second {
			lastPrint = time.Now()
			fmt.Printf("  %v: replaced coroner %d of %d, built-in %d of %d, kueue %d of %d; %d nodes tainted unreachable, %d NoExecute\n", time.Since(t0).Round(time.Second),
				replaced[groupCoroner], lost[groupCoroner], replaced[groupBuiltin], lost[groupBuiltin], replaced[groupKueue], lost[groupKueue], st.tainted(), st.noExecuted())
		}
		if allReplaced(replaced, lost) {
			break
		}
	}
	res.WaitSeconds = time.Since(t0).Seconds()
	res.KueueRequests, res.KueuePeak = kueueCounter.requests()-kueue0, kueuePeak()
	if stormEnd.IsZero() {
		stormEnd = time.Now()
		res.ShimRequests, res.ShimPeak = shimCounter.requests()-shim0, peak()
		if s1, err = scrapeRequests(ctx, cs); err != nil {
			return err
		}
	}
	storm := stormEnd.Sub(t0) // from the scrape right after the outage, near enough
	sr := rates(s0, s1, storm)
	res.StormSeconds, res.StormRequests, res.StormWrites = storm.Seconds(), total(sr), total(writesOnly(sr))
	res.StormTop = top(writesOnly(sr))

	// What is left of the lost pods.
	left := map[string]int{}
	for _, g := range outageGroups {
		ns := groupNamespaces[g]
		pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{ResourceVersion: "0"})
		if err != nil {
			return err
		}
		for _, p := range pods.Items {
			if st.dark[p.Spec.NodeName] && p.DeletionTimestamp != nil {
				left[groupOf(ns)]++
			}
		}
	}
	res.TaintFirst, res.TaintLast, res.NoExecute = st.taintTimes()
	for _, g := range outageGroups {
		if jobs[g] == 0 {
			continue
		}
		gr := st.group(g, lost[g])
		gr.Pods = jobs[g]
		gr.StillTerminating = left[g]
		res.Groups = append(res.Groups, gr)
	}
	printOutage(res)
	if kueue != nil {
		if done, err := kueue.Exited(); done {
			res.Setup["kueueExited"] = fmt.Sprint(err)
			fmt.Printf("Kueue's manager exited during the run (%v): its figures do not count. Its log:\n%s\n", err, kueue.LogTail(3000))
		}
	}
	if err := writeJSON(c.jsonDir, "scale-outage.json", res); err != nil {
		return err
	}
	fmt.Printf("\nbench-scale outage took %v; figures in %s\n", time.Since(began).Round(time.Second), filepath.Join(c.jsonDir, "scale-outage.json"))
	return nil
}

// groupOf is the group whose Jobs live in namespace ns; "" for none.
func groupOf(ns string) string {
	for g, n := range groupNamespaces {
		if n == ns {
			return g
		}
	}
	return ""
}

// allReplaced says whether every group has replaced all its lost pods.
func allReplaced(replaced, lost map[string]int) bool {
	for g, n := range lost {
		if replaced[g] < n {
			return false
		}
	}
	return true
}

func newOutageState() *outageState {
	return &outageState{slots: map[string]*slot{}, taints: map[string]time.Time{}, noExec: map[string]time.Time{}, dark: map[string]bool{}, running: map[string]int{}}
}

// pod records a pod of the outage's Jobs.
func (st *outageState) pod(p *corev1.Pod) {
	if groupOf(p.Namespace) == "" {
		return
	}
	job, index := p.Labels[batchv1.JobNameLabel], p.Annotations[batchv1.JobCompletionIndexAnnotation]
	if job == "" || index == "" {
		return
	}
	running := p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil
	st.mu.Lock()
	defer st.mu.Unlock()
	k := slotKey(p.Namespace, job, index)
	s := st.slots[k]
	if st.t0.IsZero() {
		// Before the outage: the pod that runs the index.
		if running && (s == nil || s.before != p.UID) {
			if s == nil {
				s = &slot{group: groupOf(p.Namespace), newPods: map[types.UID]bool{}}
				st.slots[k] = s
				st.running[s.group]++
			}
			s.before, s.node = p.UID, p.Spec.NodeName
		}
		return
	}
	if s == nil || p.UID == s.before {
		return
	}
	s.newPods[p.UID] = true
	if running && s.running.IsZero() {
		s.running = time.Now()
	}
}

// node records when a dark node got its unreachable taints.
func (st *outageState) node(n *corev1.Node) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if !st.dark[n.Name] || st.t0.IsZero() {
		return
	}
	for _, t := range n.Spec.Taints {
		if t.Key != corev1.TaintNodeUnreachable {
			continue
		}
		if _, ok := st.taints[n.Name]; !ok {
			st.taints[n.Name] = time.Now()
		}
		if _, ok := st.noExec[n.Name]; !ok && t.Effect == corev1.TaintEffectNoExecute {
			st.noExec[n.Name] = time.Now()
		}
	}
}

func (st *outageState) replaced() map[string]int {
	st.mu.Lock()
	defer st.mu.Unlock()
	out := map[string]int{}
	for _, s := range st.slots {
		if st.dark[s.node] && !s.running.IsZero() {
			out[s.group]++
		}
	}
	return out
}

func (st *outageState) tainted() int {
	st.mu.Lock()
	defer st.mu.Unlock()
	return len(st.taints)
}

func (st *outageState) noExecuted() int {
	st.mu.Lock()
	defer st.mu.Unlock()
	return len(st.noExec)
}

// taintTimes: seconds from the outage to the first and the last dark node's taint, and how
// many had the NoExecute one.
func (st *outageState) taintTimes() (first, last float64, noExec int) {
	st.mu.Lock()
	defer st.mu.Unlock()
	var ds []time.Duration
	for _, t := range st.taints {
		ds = append(ds, t.Sub(st.t0))
	}
	if len(ds) > 0 {
		first, last = slices.Min(ds).Seconds(), slices.Max(ds).Seconds()
	}
	return first, last, len(st.noExec)
}

// group is one controller's figures; lost is how many of its pods were on dark nodes.
func (st *outageState) group(g string, lost int) outageGroup {
	st.mu.Lock()
	defer st.mu.Unlock()
	out := outageGroup{Name: g, Lost: lost}
	var fromOutage, fromTaint, fromNoExec []time.Duration
	nodes := map[string]bool{}
	for _, s := range st.slots {
		if s.group != g {
			continue
		}
		if !st.dark[s.node] {
			out.Spurious += len(s.newPods)
			continue
		}
		nodes[s.node] = true
		if _, ok := st.noExec[s.node]; ok {
			out.OnNoExecute++
		}
		if len(s.newPods) > 1 {
			out.Twice++
		}
		if s.running.IsZero() {
			continue
		}
		out.Replaced++
		fromOutage = append(fromOutage, s.running.Sub(st.t0))
		if tt, ok := st.taints[s.node]; ok {
			d := s.running.Sub(tt)
			fromTaint = append(fromTaint, d)
			if d <= outageGoal {
				out.WithinGoal++
			}
		}
		if tt, ok := st.noExec[s.node]; ok {
			fromNoExec = append(fromNoExec, s.running.Sub(tt))
		}
	}
	out.FromOutage, out.FromTaint, out.FromNoExecute = p50p99max(fromOutage), p50p99max(fromTaint), p50p99max(fromNoExec)
	out.LostNodes = len(nodes)
	return out
}

func p50p99max(ds []time.Duration) [3]float64 {
	if len(ds) == 0 {
		return [3]float64{}
	}
	return [3]float64{measure.Percentile(ds, 50).Seconds(), measure.Percentile(ds, 99).Seconds(), slices.Max(ds).Seconds()}
}

func printOutage(r outageResult) {
	fmt.Printf("\nzone outage: %d of %d nodes and their agents stop at once; unreachable taints %.0f-%.0f s after it (%d of %d NoExecute by the end)\n",
		r.Down, r.Nodes, r.TaintFirst, r.TaintLast, r.NoExecute, r.Down)
	if r.KueueToleration != "" {
		fmt.Printf("kueue's pods tolerate the NoExecute unreachable taint for %s (-kueue-toleration); the others for the API server's default 300 s\n", r.KueueToleration)
	}
	fmt.Printf("watched %.0f s after the outage (-outage-wait %s, or until every group had replaced every lost pod)\n", r.WaitSeconds, r.Wait)
	fmt.Printf("%-10s %7s %6s %10s %15s %26s %26s %26s %14s %7s %9s %12s\n", "controller", "pods", "lost", "replaced", "on nodes (NoEx)", "from outage p50/p99/max s", "from taint p50/p99/max s",
		"from NoExecute p50/p99/max", fmt.Sprintf("within %v", outageGoal), "twice", "spurious", "terminating")
	for _, g := range r.Groups {
		fmt.Printf("%-10s %7d %6d %10d %15s %26s %26s %26s %14d %7d %9d %12d\n", g.Name, g.Pods, g.Lost, g.Replaced, fmt.Sprintf("%d (%d pods)", g.LostNodes, g.OnNoExecute),
			fmt.Sprintf("%.1f / %.1f / %.1f", g.FromOutage[0], g.FromOutage[1], g.FromOutage[2]),
			fmt.Sprintf("%.1f / %.1f / %.1f", g.FromTaint[0], g.FromTaint[1], g.FromTaint[2]),
			fmt.Sprintf("%.1f / %.1f / %.1f", g.FromNoExecute[0], g.FromNoExecute[1], g.FromNoExecute[2]),
			g.WithinGoal, g.Twice, g.Spurious, g.StillTerminating)
	}
	fmt.Printf("API server: at rest %.0f requests/s (%.0f writes/s); over the storm (%.0f s, to coroner's last replacement Running) %.0f requests/s (%.0f writes/s), x%.2f; its top writes: %s\n",
		r.RestRequests, r.RestWrites, r.StormSeconds, r.StormRequests, r.StormWrites, r.StormRequests/max(r.RestRequests, 1), strings.Join(r.StormTop, ", "))
	fmt.Printf("coroner-shim over the storm: %d requests, %.1f/s, at most %d in one second (--kube-api-qps=%d, burst %d)\n",
		r.ShimRequests, float64(r.ShimRequests)/max(r.StormSeconds, 1), r.ShimPeak, r.ShimQPS, 2*r.ShimQPS)
	for _, g := range r.Groups {
		if g.Name == groupKueue {
			fmt.Printf("Kueue's manager: at rest %.1f requests/s; from the outage to the end (%.0f s) %d requests, %.1f/s, at most %d in one second (clientConnection qps %d, burst %d)\n",
				r.KueueRestRequests, r.WaitSeconds, r.KueueRequests, float64(r.KueueRequests)/max(r.WaitSeconds, 1), r.KueuePeak, kueueQPS, 2*kueueQPS)
		}
	}
}

// startFencers runs one fence.Fencer per node, as coroner-agent does, each with its own
// context: stop(node) stops one (its node goes dark), stopAll the rest.
func startFencers(ctx context.Context, env *harness.Env, c config) (stop func(string), stopAll func(), err error) {
	period := fence.RenewPeriod(c.fenceAfter)
	actx, cancelAll := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var mu sync.Mutex
	cancels := map[string]context.CancelFunc{}
	for i := range c.nodes {
		node := nodeName(i)
		f, err := newFencer(node, env.Config, nil, c.fenceAfter, c.fenceSignal == conditions.FenceSignalNodeLease)
		if err != nil {
			cancelAll()
			return nil, nil, err
		}
		nctx, cancel := context.WithCancel(actx)
		cancels[node] = cancel
		delay := time.Duration(rand.Int64N(int64(period)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-nctx.Done():
				return
			case <-time.After(delay):
			}
			f.Run(nctx)
		}()
	}
	stop = func(node string) {
		mu.Lock()
		defer mu.Unlock()
		if cancel := cancels[node]; cancel != nil {
			cancel()
		}
	}
	stopAll = func() {
		cancelAll()
		wg.Wait()
	}
	return stop, stopAll, nil
}

// startShim runs coroner-shim as in production, one replica (no leader election), against
// env through counter: a proxy on 127.0.0.1 that counts the shim's requests (its own
// figures beside the API server's) and passes them on with the harness's credentials.
func startShim(ctx context.Context, env *harness.Env, bin string, c config, counter *writeCounter) (*host.Process, error) {
	kubeconfig, err := proxyKubeconfig(ctx, env, "coroner-shim", counter)
	if err != nil {
		return nil, err
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin,
		"--kubeconfig="+kubeconfig,
		"--leader-elect=false",
		"--metrics-bind-address="+addr,
		"--health-probe-bind-address=0",
		"--kube-api-qps="+strconv.Itoa(c.shimQPS),
		"--kube-api-burst="+strconv.Itoa(2*c.shimQPS),
		"--agent-namespace="+agentNamespace,
		"--recover-pods="+c.shimRecoverPods,
	)
	return host.StartCommand(env.Dir, "coroner-shim", cmd)
}

// proxyKubeconfig starts a countingProxy to env for the process name and writes a
// kubeconfig for it into env's directory (name.kubeconfig); it returns the file's path.
func proxyKubeconfig(ctx context.Context, env *harness.Env, name string, counter *writeCounter) (string, error) {
	proxy, err := countingProxy(ctx, env, counter)
	if err != nil {
		return "", err
	}
	kubeconfig := filepath.Join(env.Dir, name+".kubeconfig")
	body := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: proxy, cluster: {server: %q}}]
users: [{name: %s, user: {}}]
contexts: [{name: proxy, context: {cluster: proxy, user: %s}}]
current-context: proxy
`, proxy, name, name)
	return kubeconfig, os.WriteFile(kubeconfig, []byte(body), 0o600)
}

// countingProxy serves plain HTTP on 127.0.0.1 and forwards every request to env's API
// server with its admin credentials, counting them in counter. It stops with ctx.
func countingProxy(ctx context.Context, env *harness.Env, counter *writeCounter) (string, error) {
	rt, err := rest.TransportFor(ownConnection(env.Config))
	if err != nil {
		return "", err
	}
	target, err := url.Parse(env.Config.Host)
	if err != nil {
		return "", err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	rp := &httputil.ReverseProxy{
		Rewrite:       func(r *httputil.ProxyRequest) { r.SetURL(target) },
		Transport:     counter.wrap(rt),
		FlushInterval: -1, // watches stream
	}
	srv := &http.Server{Handler: rp, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	return "http://" + l.Addr().String(), nil
}

// createAgentPods makes coroner-agent's DaemonSet pods, one bound to each node (as the
// DaemonSet controller binds them), tolerating every taint, and waits until kwok reports
// them all Ready.
func createAgentPods(ctx context.Context, cs kubernetes.Interface, nodes int) error {
	sem := make(chan struct{}, 20)
	errs := make(chan error, nodes)
	var wg sync.WaitGroup
	for i := range nodes {
		node := nodeName(i)
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: agentPodName(node), Namespace: agentNamespace,
				Labels: map[string]string{"app.kubernetes.io/name": "coroner-agent"}},
				Spec: corev1.PodSpec{NodeName: node, Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
					Containers: []corev1.Container{{Name: "agent", Image: "docker.io/coroner/coroner-agent:dev"}}}}
			if _, err := cs.CoreV1().Pods(agentNamespace).Create(ctx, p, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				errs <- fmt.Errorf("creating the agent pod of %s: %w", node, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	return waitFor(ctx, 5*time.Minute, func() (bool, string) {
		pods, err := cs.CoreV1().Pods(agentNamespace).List(ctx, metav1.ListOptions{ResourceVersion: "0"})
		if err != nil {
			return false, err.Error()
		}
		ready := 0
		for i := range pods.Items {
			if c := conditions.Find(&pods.Items[i].Status, corev1.PodReady); c != nil && c.Status == corev1.ConditionTrue {
				ready++
			}
		}
		return ready >= nodes, fmt.Sprintf("%d of %d agent pods Ready", ready, nodes)
	})
}

// createOutageJobs creates the group's Jobs: Indexed, 100 pods each (the last one the
// rest), pods that run until the end (kwok keeps them Running). coroner's are
// handed to coroner-shim and opted in to the recovery of their pods, their disruptions
// ignored by their podFailurePolicy; the built-in controller's replace a pod as soon as it
// is terminating (podReplacementPolicy TerminatingOrFailed, the fastest it can; the API
// server allows no podFailurePolicy with it, so their lost pods count against
// backoffLimit, which is set to the Job's size). The kueue group's are the built-in
// controller's too, as Kueue's failure recovery wants them (KEP-6757's example): pods
// opted in with kueueSafeToDelete, replaced only once failed (podReplacementPolicy Failed,
// so no two run at once), which Kueue makes them one minute after their deletion's grace
// period on an unreachable node; no queue name (Kueue does not admit them: its recovery
// works on any pod). With kueueToleration, their pods tolerate the NoExecute unreachable
// taint that long instead of the API server's default 300 s.
func createOutageJobs(ctx context.Context, cs kubernetes.Interface, group string, pods int, kueueToleration time.Duration) error {
	ns := groupNamespaces[group]
	if ns == "" {
		return fmt.Errorf("unknown group %q", group)
	}
	for i := 0; pods > 0; i++ {
		n := min(pods, 100)
		pods -= n
		j := &batchv1.Job{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("train-%03d", i), Namespace: ns},
			Spec: batchv1.JobSpec{
				CompletionMode: ptr.To(batchv1.IndexedCompletion),
				Completions:    ptr.To(int32(n)), Parallelism: ptr.To(int32(n)),
				BackoffLimit: ptr.To(int32(n)),
				Template: corev1.PodTemplateSpec{
					Spec: corev1.PodSpec{
						RestartPolicy: corev1.RestartPolicyNever,
						// Requests, as real pods have: the scheduler's least-allocated
						// scoring then spreads them over the nodes (a Job's pods get no
						// default topology spread).
						Containers: []corev1.Container{{Name: "main", Image: "registry.example/train:1",
							Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
								corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("1Gi")}}}},
						// kwok's nodes carry no taint but the outage's.
						NodeSelector: map[string]string{"type": "kwok"},
					},
				},
			},
		}
		switch group {
		case groupCoroner:
			j.Spec.ManagedBy = ptr.To(conditions.ManagedBy)
			j.Spec.Template.Annotations = map[string]string{conditions.AnnotationSafeToForcefullyDelete: "true"}
			j.Spec.PodFailurePolicy = &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{{
				Action:          batchv1.PodFailurePolicyActionIgnore,
				OnPodConditions: []batchv1.PodFailurePolicyOnPodConditionsPattern{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue}},
			}}}
		case groupBuiltin:
			// A podFailurePolicy requires podReplacementPolicy Failed; the lost pods count
			// against backoffLimit instead (one per index at most here).
			j.Spec.PodReplacementPolicy = ptr.To(batchv1.TerminatingOrFailed)
		case groupKueue:
			j.Spec.PodReplacementPolicy = ptr.To(batchv1.Failed)
			j.Spec.Template.Annotations = map[string]string{kueueSafeToDelete: "true"}
			if kueueToleration > 0 {
				j.Spec.Template.Spec.Tolerations = []corev1.Toleration{{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists,
					Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To(int64(kueueToleration.Seconds()))}}
			}
		}
		if _, err := cs.BatchV1().Jobs(ns).Create(ctx, j, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating Job %s/%s: %w", ns, j.Name, err)
		}
	}
	return nil
}

// waitFor polls done every 2 s until it says true, printing its progress every 30 s.
func waitFor(ctx context.Context, timeout time.Duration, done func() (bool, string)) error {
	deadline := time.Now().Add(timeout)
	last := time.Now()
	for {
		ok, what := done()
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %v: %s", timeout, what)
		}
		if time.Since(last) >= 30*time.Second {
			last = time.Now()
			fmt.Printf("    %s\n", what)
		}
		if err := sleep(ctx, 2*time.Second); err != nil {
			return err
		}
	}
}

// peakRate samples count every second from now on (until ctx ends) and returns a function
// that gives the largest increase in one second so far.
func peakRate(ctx context.Context, count func() int64) func() int64 {
	var mu sync.Mutex
	var peak int64
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		last := count()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			n := count()
			mu.Lock()
			peak = max(peak, n-last)
			mu.Unlock()
			last = n
		}
	}()
	return func() int64 {
		mu.Lock()
		defer mu.Unlock()
		return peak
	}
}

// ownConnection copies cfg with a dialer of its own, so that client-go gives its clients a
// connection of their own instead of the one every config with the same credentials
// shares: the proxied shim's watches, the agents' renewals and the bench's own reads on one
// HTTP/2 connection left the bench's requests waiting minutes for a stream.
func ownConnection(cfg *rest.Config) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.Dial = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	return c
}
