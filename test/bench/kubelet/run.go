package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/coroner-dev/coroner/test/bench/measure"
	"github.com/coroner-dev/coroner/test/lab"
)

// node is one node of the run: its plan, its runtime and cost readers, and its samples.
type node struct {
	run     *nodeRun
	what    string // the node's configuration, for the tables
	runtime string // the kubelet's containerRuntimeVersion
	cost    *costReader
	guest   *guestSampler // the VM node's
	samples []sample      // [0] start of the idle period, [1] its end (the storm's start), ..., last: the storm's end
	stop    func()
}

func run(ctx context.Context, o options) error {
	began := time.Now()
	cfg, cs, err := measure.UpLab(ctx)
	if err != nil {
		return err
	}
	limit, err := resource.ParseQuantity(o.memoryLimit)
	if err != nil {
		return fmt.Errorf("-memory-limit: %w", err)
	}

	names, note := measure.WithVMNode(ctx, cs, o.nodes, o.vm)
	if note != "" {
		say("%s", note)
	}

	if err := lab.FreshNamespace(ctx, cs, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: o.namespace}}, 3*time.Minute); err != nil {
		return err
	}
	defer func() {
		_ = cs.CoreV1().Namespaces().Delete(context.Background(), o.namespace, metav1.DeleteOptions{})
	}()

	tr := newTracker()
	var nodes []*node
	defer func() {
		for _, n := range nodes {
			n.stop()
		}
	}()
	for _, name := range names {
		n, err := prepareNode(ctx, cfg, cs, o, name, limit, tr)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		nodes = append(nodes, n)
		say("%s (%s): %d exits + %d limit OOMs at %.2g pods/s, at most %d alive", name, n.what, n.run.plan.exits, n.run.plan.ooms, n.run.plan.rate, n.run.plan.maxLive)
	}

	list, err := cs.CoreV1().Pods(o.namespace).List(ctx, metav1.ListOptions{LabelSelector: benchLabel})
	if err != nil {
		return err
	}
	if err := watchPods(ctx, cs, o.namespace, list.ResourceVersion, tr); err != nil {
		return err
	}

	// Idle, then the storm on every node at once.
	host0 := takeHost()
	sampleAll(ctx, nodes)
	say("idle for %v", o.idle)
	if err := lab.Sleep(ctx, o.idle); err != nil {
		return err
	}
	host1 := takeHost()
	sampleAll(ctx, nodes)
	say("storm: every node at once")
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Go(func() {
			sctx, stop := context.WithCancel(ctx)
			var sw sync.WaitGroup
			sw.Go(func() { n.sampleEvery(sctx, o.sampleInterval) })
			n.run.run(ctx)
			stop()
			sw.Wait()
			n.samples = append(n.samples, n.cost.take(ctx))
			say("%s: done in %v", n.run.plan.node, time.Since(n.run.started).Round(time.Second))
		})
	}
	wg.Wait()
	host2 := takeHost()
	if ctx.Err() != nil {
		return ctx.Err()
	}

	rep := buildReport(o, nodes, hostWindow(host0, host1), hostWindow(host1, host2), began)
	rep.print(os.Stdout)
	path := o.jsonPath
	if path == "" {
		path = filepath.Join(cfg.Root, "_output", "bench", "p2.json")
	}
	if err := rep.write(path); err != nil {
		return err
	}
	say("wrote %s; %v in all", path, time.Since(began).Round(time.Second))
	if bad := rep.unstamped(); bad > 0 {
		return fmt.Errorf("%d exits or OOM kills never stamped or stamped wrong", bad)
	}
	return nil
}

// prepareNode connects to the node's runtime and finds its processes.
func prepareNode(ctx context.Context, cfg lab.Config, cs kubernetes.Interface, o options, name string, limit resource.Quantity, tr *tracker) (*node, error) {
	ln, err := cfg.NodeNamed(name)
	if err != nil {
		return nil, err
	}
	kn, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	if !measure.NodeReady(kn) {
		return nil, errors.New("not Ready")
	}
	plan := nodePlan{node: name, vm: ln.IsVM(), exits: o.exits, ooms: o.ooms, rate: o.rate, maxLive: o.maxLive, runFor: o.runFor, podTimeout: o.podTimeout}
	if plan.vm {
		plan.exits, plan.ooms, plan.rate, plan.maxLive, plan.runFor, plan.podTimeout = o.vmExits, o.vmOOMs, o.vmRate, o.vmMaxLive, o.vmRunFor, 3*o.podTimeout
	}
	n := &node{runtime: kn.Status.NodeInfo.ContainerRuntimeVersion}
	var stops []func()
	n.stop = func() {
		for _, s := range slices.Backward(stops) {
			s()
		}
	}
	fail := func(err error) (*node, error) { n.stop(); return nil, err }

	socket := ln.Socket()
	var containerd func(context.Context) usage
	var shims func() (int, float64)
	if plan.vm {
		n.what = "VM: systemd, cgroup v2, " + n.runtime
		local, stopForward, err := cfg.VMSocket(ctx, socket)
		if err != nil {
			return fail(err)
		}
		stops = append(stops, stopForward)
		socket = local
		g, err := startGuestSampler(filepath.Join(cfg.Dir, "nodes", name, "ssh-key"), ln.IP.String())
		if err != nil {
			return fail(err)
		}
		stops = append(stops, g.close)
		n.guest, containerd = g, g.read
	} else {
		n.what = "process node, cgroup v1, " + n.runtime
		pid, err := containerdPID(cfg.Dir, name)
		if err != nil {
			return fail(err)
		}
		containerd = func(context.Context) usage {
			u := procUsage(pid)
			if !u.ok() { // restarted since: find it again
				if p, err := containerdPID(cfg.Dir, name); err == nil && p != pid {
					pid = p
					u = procUsage(pid)
					u.Err = fmt.Sprintf("containerd restarted (pid %d): CPU time restarted", pid)
				}
			}
			return u
		}
		shimSocket := ln.Socket()
		shims = func() (int, float64) { return shimsOf(shimSocket) }
	}
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fail(err)
	}
	stops = append(stops, func() { conn.Close() })
	cri := runtimeapi.NewRuntimeServiceClient(conn)
	vctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := cri.Version(vctx, &runtimeapi.VersionRequest{}); err != nil {
		return fail(fmt.Errorf("its containerd's CRI at %s: %w", socket, err))
	}
	n.cost, err = newCostReader(ctx, cs, name, containerd, shims)
	if err != nil {
		return fail(err)
	}
	n.run = &nodeRun{plan: plan, namespace: o.namespace, cs: cs, cri: cri, tracker: tr,
		spec: podSpec{namespace: o.namespace, node: name, runFor: plan.runFor, memoryLimit: limit, vm: plan.vm}}
	return n, nil
}

// sampleAll reads every node's processes at once.
func sampleAll(ctx context.Context, nodes []*node) {
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Go(func() { n.samples = append(n.samples, n.cost.take(ctx)) })
	}
	wg.Wait()
}

// sampleEvery reads the node's processes every d until ctx ends.
func (n *node) sampleEvery(ctx context.Context, d time.Duration) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s := n.cost.take(ctx)
			if ctx.Err() == nil {
				n.samples = append(n.samples, s)
			}
		}
	}
}

// hostSample is this machine's CPU time at a moment, and its processes'.
type hostSample struct {
	at          time.Time
	busy, total float64
	err         error
	procs       map[int]procTime
}

func takeHost() hostSample {
	b, t, err := hostCPU()
	return hostSample{at: time.Now(), busy: b, total: t, err: err, procs: procTicks()}
}

// hostUse is this machine's CPU use between two samples: in percent of all its CPUs
// (-1 when unknown), and its busiest processes.
type hostUse struct {
	BusyPct  float64  `json:"busyPct"`
	Busiest  []string `json:"busiest"`
	Duration float64  `json:"seconds"`
}

func hostWindow(a, b hostSample) hostUse {
	u := hostUse{BusyPct: -1, Duration: b.at.Sub(a.at).Seconds(), Busiest: busiest(a.procs, b.procs, b.at.Sub(a.at), 6)}
	if a.err == nil && b.err == nil && b.total > a.total {
		u.BusyPct = 100 * (b.busy - a.busy) / (b.total - a.total)
	}
	return u
}

func say(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench-p2: "+format+"\n", args...)
}
