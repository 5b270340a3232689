// Package fence is the node agent's fencing (requirement A6, --fencing): the agent
// renews a Lease of its node, and when it has gone --fence-after without a successful
// renewal it stops, over CRI, the containers of its node's pods that are opted in to
// forceful deletion, and keeps them stopped until a renewal succeeds again; then it
// records that it fenced, on the Lease and in an Event on the Node. The shim reads the
// Lease (conditions.NodeFenced) and recovers the pods of a fenced node without waiting
// for the toleration (Z2): that is what makes forced recovery safe.
//
// Two heartbeats can tell the agent that its node reaches the API server
// (--fence-signal): its kubelet's node Lease, which it watches (Config.NodeLease, the
// agent's default; heartbeat.go describes it: no write at rest), or a Lease of its own
// that it renews (the first design, below). Everything else (what it stops, how, the
// record and the Event) is the same.
//
// # Timeline with its own Lease (conditions/fencing.go holds the contract with the shim)
//
//   - Every RenewPeriod (--fence-after/4, between 1s and 10s) the agent writes the Lease
//     coroner-agent-<node> in its namespace (DesiredLease): holderIdentity the node,
//     renewTime the time of the attempt, leaseDurationSeconds --fence-after rounded up
//     to seconds, the annotation coroner.dev/fence-after. Each attempt is bounded by
//     RequestTimeout (at most 5s), so that a partition, where requests hang, is noticed.
//     A successful write records its renewTime as the last renewal; the agent's start
//     (Config.Start) counts as one.
//   - Every FencedPeriod (1s) the agent checks ShouldFence: more than --fence-after since
//     the last renewal, whatever the reason the renewals failed (an unreachable API
//     server, or errors: the shim sees a stale Lease either way). From then on it is
//     fenced (coroner_agent_fenced 1): every second it lists the running containers and
//     stops those of opted-in pods of its node (ToStop, below); a container the kubelet
//     restarts is stopped again at the next pass. Each container gets StopTimeout (the
//     pod's grace period, at most 10s) between SIGTERM and SIGKILL. Pods that are not
//     opted in are never touched.
//   - While fenced, the agent tries to renew every FencedPeriod. The first renewal that
//     succeeds also writes coroner.dev/fenced-at (when the agent started fencing) and
//     ends the fence; then the agent emits one Warning Event Fenced on the Node (Message:
//     how long, and which pods it stopped).
//   - The shim takes the node for fenced once renewTime + --fence-after + its margin has
//     passed: by then the agent has fenced (at renewTime + --fence-after, plus at most
//     FencedPeriod), and its stops have ended (at most DefaultMaxStopTimeout later).
//
// # Which containers
//
// The fence must work without the API server, so the opted-in pods come from two sources
// the agent has without it (ToStop):
//
//   - the agent's pod cache (Config.Pods), which outlives the connection to the API
//     server: pods bound to the node, opted in (conditions.OptedInToForcefulDeletion) and
//     not terminal. A pod the cache knows is decided by the cache alone.
//   - the runtime's pod sandboxes, when Config.Runtime also lists them (SandboxLister;
//     cri.RuntimeClient does): the kubelet copies a pod's annotations onto its sandbox
//     (PodSandboxConfig.Annotations), so a running container whose sandbox's annotations
//     opt in is stopped even when the cache does not know its pod: an agent that started
//     while cut off has an empty cache. Such a pod has no phase (all its running
//     containers are stopped) and no known grace period (DefaultMaxStopTimeout).
//
// The containers are listed before the sandboxes, so that the sandbox of each running
// container is in the second list. If the sandboxes cannot be listed, that pass goes by
// the cache alone, and the next pass tries again.
//
// # An agent that (re)starts cut off from the API server
//
// With --fencing the agent starts even when it cannot reach the API server (agent.Run),
// since an agent that exited would never fence while the shim, which sees only a stale
// Lease, takes its node for fenced. It cannot read its Lease, so it does not know when
// it (its previous run) last renewed: it counts its start as the last renewal and fences
// --fence-after after it, unless a renewal succeeds first. That is the earliest moment it
// can fence without risking a fence that nothing called for: the previous run may have
// renewed just before this start (a plain restart while the API server is slow to
// answer), and then the shim does not take the node for fenced before start +
// --fence-after + its margin. But the Lease's renewTime is older than the start, so the
// shim's deadline (renewTime + --fence-after + margin) comes earlier than in that best
// case: the agent fences late by the time from renewTime to its start, less what the
// margin leaves over (the margin minus FencedPeriod and the stop grace). That is the
// residual window, in which the shim may already recover the opted-in pods while they
// still run here: about the restart time (the crash, the DaemonSet's back-off), plus any
// time the previous run spent cut off before it went down. If that run had fenced
// already, the kubelet may have restarted the stopped containers meanwhile, and they run
// until start + --fence-after. An agent that restarts more often than --fence-after
// never fences.
//
// Without --fencing there is no Fencer: no Lease, and nothing is ever stopped.
package fence

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/coroner-dev/coroner/agent/metrics"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/cri"
)

// Runtime is the container runtime as the fencer uses it: cri.RuntimeClient, or a fake in
// tests.
type Runtime interface {
	// RunningContainers lists the running containers with the kubelet's labels.
	RunningContainers(ctx context.Context) ([]cri.Container, error)
	// StopContainer stops a container (SIGTERM, SIGKILL after timeout) and returns once
	// it has exited.
	StopContainer(ctx context.Context, id string, timeout time.Duration) error
}

// SandboxLister is a Runtime that also lists the pod sandboxes with their annotations,
// which the fence reads the opt-in of pods its cache does not know from (ToStop).
// cri.RuntimeClient is one; a Runtime that is not goes by the pod cache alone.
type SandboxLister interface {
	// Sandboxes lists the pod sandboxes with the kubelet's pod labels, ready or not.
	Sandboxes(ctx context.Context) ([]cri.Sandbox, error)
}

var (
	_ Runtime       = (*cri.RuntimeClient)(nil)
	_ SandboxLister = (*cri.RuntimeClient)(nil)
)

// Config configures a Fencer. Every field but Start, MaxStopTimeout, Metrics and Clock
// is required.
type Config struct {
	// NodeName is the agent's node: its Lease is conditions.AgentLeaseName(NodeName), and
	// only pods bound to it are fenced.
	NodeName string
	// Namespace is the Lease's namespace (--lease-namespace).
	Namespace string
	// FenceAfter is --fence-after.
	FenceAfter time.Duration
	// Client writes the Lease and reads the Node (for the Event's UID).
	Client kubernetes.Interface
	// Runtime lists and stops containers; when it is also a SandboxLister, the sandboxes'
	// annotations count for pods the cache does not know.
	Runtime Runtime
	// Pods returns the agent's cached pods of its node (read only).
	Pods func() []*corev1.Pod
	// Recorder emits the Fenced Event on the Node.
	Recorder record.EventRecorder
	// MaxStopTimeout caps the grace of a stopped container; default
	// DefaultMaxStopTimeout.
	MaxStopTimeout time.Duration
	// Metrics receives coroner_agent_fenced and
	// coroner_agent_fence_stopped_containers_total; nil records nothing.
	Metrics *metrics.Metrics
	// Clock is the fencer's clock; default the real one.
	Clock clock.WithTicker
	// Start is when the agent started, by Clock: the fence clock starts there, as if the
	// Lease had been renewed then (see the package comment). Zero, or later than when
	// Run starts: when Run starts.
	Start time.Time
	// NodeLease: fence on the kubelet's node Lease (--fence-signal=node-lease; see
	// heartbeat.go) instead of renewing the agent's own Lease. Pod is then required.
	NodeLease bool
	// Pod is the agent's own pod, named on its Lease (conditions.AnnotationAgentPod) with
	// NodeLease.
	Pod types.NamespacedName
}

// Fencer renews the agent's Lease and fences the node when it cannot. Create it with New
// and run it with Run.
type Fencer struct {
	cfg            Config
	clock          clock.WithTicker
	renewPeriod    time.Duration
	requestTimeout time.Duration
	leaseName      string

	// lease is the Lease as last written (nil: read it first); renew's alone.
	lease *coordinationv1.Lease
	// failing: the last renewal failed (its error was logged); renew's alone.
	failing bool

	mu sync.Mutex
	// lastRenewal is the renewTime of the last successful renewal, or the start.
	lastRenewal time.Time
	// renewed: a renewal has succeeded since the start.
	renewed bool
	// fence is the current fence, nil when not fenced.
	fence *fenceRecord

	// With NodeLease (heartbeat.go):
	// heard: a renewTime of the kubelet's node Lease has been seen since the start (then
	// lastRenewal is the latest one seen).
	heard bool
	// announced: the agent's own Lease has been written since the start.
	announced bool
	// ended is a fence that ended (the node Lease is renewed again) and is still to be
	// recorded on the agent's Lease and in the Event; endedAt the node Lease's renewTime
	// that ended it.
	ended   *fenceRecord
	endedAt time.Time
}

// fenceRecord is one fence, from ShouldFence to the renewal that ends it.
type fenceRecord struct {
	// since is when the agent started fencing; lastRenewal its last renewal before (the
	// start when fromStart).
	since, lastRenewal time.Time
	// fromStart: no renewal had succeeded since the agent started.
	fromStart bool
	// stopped are the containers stopped, by id, with their pod.
	stopped map[string]types.NamespacedName
}

// New checks cfg and returns a Fencer; nothing runs until Run.
func New(cfg Config) (*Fencer, error) {
	if cfg.NodeName == "" || cfg.Namespace == "" || cfg.Client == nil || cfg.Runtime == nil || cfg.Pods == nil || cfg.Recorder == nil {
		return nil, errors.New("fence: NodeName, Namespace, Client, Runtime, Pods and Recorder are required")
	}
	if cfg.FenceAfter <= 0 {
		return nil, fmt.Errorf("fence: FenceAfter %v must be positive", cfg.FenceAfter)
	}
	if cfg.NodeLease && (cfg.Pod.Namespace == "" || cfg.Pod.Name == "") {
		return nil, errors.New("fence: fencing on the node Lease needs the agent's Pod (--pod-name): the shim trusts a fence only from an agent whose pod it sees ready")
	}
	if cfg.MaxStopTimeout <= 0 {
		cfg.MaxStopTimeout = DefaultMaxStopTimeout
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	period := RenewPeriod(cfg.FenceAfter)
	f := &Fencer{
		cfg:            cfg,
		clock:          cfg.Clock,
		renewPeriod:    period,
		requestTimeout: RequestTimeout(period),
		leaseName:      conditions.AgentLeaseName(cfg.NodeName),
	}
	f.lastRenewal = cfg.Clock.Now()
	if s := cfg.Start; !s.IsZero() && s.Before(f.lastRenewal) {
		f.lastRenewal = s
	}
	return f, nil
}

// RenewPeriod is how often the Lease is renewed while not fenced.
func (f *Fencer) RenewPeriod() time.Duration { return f.renewPeriod }

// Fenced reports whether the agent is fenced now.
func (f *Fencer) Fenced() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fence != nil
}

// Run renews the Lease and enforces the fence until ctx is done. The fence clock starts
// at Config.Start (default now): the first renewal is due at once, and the agent fences
// --fence-after from the start if none succeeds, whether or not the API server answered
// at the start.
func (f *Fencer) Run(ctx context.Context) {
	logger := klog.FromContext(ctx).WithName("fence")
	ctx = klog.NewContext(ctx, logger)
	start := f.clock.Now()
	if s := f.cfg.Start; !s.IsZero() && s.Before(start) {
		start = s
	}
	f.mu.Lock()
	f.lastRenewal, f.renewed, f.heard, f.announced = start, false, false, false
	f.mu.Unlock()
	f.cfg.Metrics.SetFenced(false)
	_, sandboxes := f.cfg.Runtime.(SandboxLister)
	if f.cfg.NodeLease {
		logger.Info("Fencing on: watching the kubelet's node Lease", "nodeLease", klog.KRef(conditions.NodeLeaseNamespace, f.cfg.NodeName),
			"lease", klog.KRef(f.cfg.Namespace, f.leaseName), "pod", f.cfg.Pod, "fenceAfter", f.cfg.FenceAfter,
			"start", start.UTC().Format(time.RFC3339Nano), "fencesAtTheLatest", start.Add(f.cfg.FenceAfter).UTC().Format(time.RFC3339Nano),
			"sandboxAnnotations", sandboxes)
	} else {
		logger.Info("Fencing on: renewing the node's Lease", "lease", klog.KRef(f.cfg.Namespace, f.leaseName),
			"fenceAfter", f.cfg.FenceAfter, "renewPeriod", f.renewPeriod, "requestTimeout", f.requestTimeout,
			"start", start.UTC().Format(time.RFC3339Nano), "fencesAtTheLatest", start.Add(f.cfg.FenceAfter).UTC().Format(time.RFC3339Nano),
			"sandboxAnnotations", sandboxes)
	}

	var wg sync.WaitGroup
	if f.cfg.NodeLease {
		wg.Add(2)
		go func() {
			defer wg.Done()
			f.watchNodeLease(ctx)
		}()
		go func() {
			defer wg.Done()
			f.recordLoop(ctx)
		}()
	} else {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.renewLoop(ctx)
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		f.enforceLoop(ctx)
	}()
	wg.Wait()
}

// renewLoop renews every renew period, or every FencedPeriod while fenced.
func (f *Fencer) renewLoop(ctx context.Context) {
	for ctx.Err() == nil {
		start := f.clock.Now()
		_ = f.renew(ctx)
		period := f.renewPeriod
		if f.Fenced() {
			period = min(period, FencedPeriod)
		}
		if wait := period - f.clock.Since(start); wait > 0 {
			select {
			case <-ctx.Done():
			case <-f.clock.After(wait):
			}
		}
	}
}

// enforceLoop checks the fence every FencedPeriod, and stops containers while fenced.
func (f *Fencer) enforceLoop(ctx context.Context) {
	tick := f.clock.NewTicker(FencedPeriod)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C():
		}
		f.enforce(ctx)
	}
}

// renew makes one renewal attempt. When it succeeds while fenced, with the fence's
// fenced-at written, the fence ends and the Fenced Event is emitted.
func (f *Fencer) renew(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	now := f.clock.Now()
	f.mu.Lock()
	fence := f.fence
	f.mu.Unlock()
	err := f.writeFor(ctx, now, fence)
	if err != nil {
		if ctx.Err() != nil {
			return err
		}
		f.mu.Lock()
		last, renewed := f.lastRenewal, f.renewed
		f.mu.Unlock()
		since := now.Sub(last)
		if !f.failing {
			msg := "Cannot renew the fencing Lease; the node is fenced if this lasts"
			if !renewed {
				msg = "Cannot renew the fencing Lease, and it has not been renewed since the start; the node is fenced if this lasts"
			}
			logger.Error(err, msg, "lease", klog.KRef(f.cfg.Namespace, f.leaseName),
				"sinceLastRenewal", since.Round(time.Millisecond), "fenceAfter", f.cfg.FenceAfter,
				"fencesAt", last.Add(f.cfg.FenceAfter).UTC().Format(time.RFC3339Nano))
		} else {
			logger.V(2).Info("Cannot renew the fencing Lease", "err", err, "sinceLastRenewal", since.Round(time.Millisecond))
		}
		f.failing = true
		return err
	}
	if f.failing {
		logger.Info("The fencing Lease is renewed again", "lease", klog.KRef(f.cfg.Namespace, f.leaseName))
		f.failing = false
	}

	f.mu.Lock()
	if now.After(f.lastRenewal) {
		f.lastRenewal = now
	}
	f.renewed = true
	// Only a write that carried this fence's fenced-at ends it: one that started before
	// the fence did not record it.
	var ended *fenceRecord
	var stopped map[string]types.NamespacedName
	if fence != nil && f.fence == fence {
		ended, f.fence = fence, nil
		stopped = make(map[string]types.NamespacedName, len(fence.stopped))
		for id, p := range fence.stopped {
			stopped[id] = p
		}
		f.cfg.Metrics.SetFenced(false)
	}
	f.mu.Unlock()
	if ended != nil {
		f.report(ctx, ended, stopped, now)
	}
	return nil
}

// writeLease writes the Lease for a renewal at now: an Update of the Lease as last
// written, reading (or creating) it first when unknown, and once more after a conflict.
func (f *Fencer) writeLease(ctx context.Context, now, fencedAt time.Time) error {
	leases := f.cfg.Client.CoordinationV1().Leases(f.cfg.Namespace)
	var err error
	for range 2 {
		cur := f.lease
		if cur == nil {
			cur, err = leases.Get(ctx, f.leaseName, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				var created *coordinationv1.Lease
				created, err = leases.Create(ctx, f.desired(nil, now, fencedAt), metav1.CreateOptions{})
				if err == nil {
					klog.FromContext(ctx).V(1).Info("Created the fencing Lease", "lease", klog.KObj(created))
					f.lease = created
					return nil
				}
				if apierrors.IsAlreadyExists(err) {
					continue
				}
				return fmt.Errorf("creating Lease %s/%s: %w", f.cfg.Namespace, f.leaseName, err)
			}
			if err != nil {
				return fmt.Errorf("reading Lease %s/%s: %w", f.cfg.Namespace, f.leaseName, err)
			}
		}
		var updated *coordinationv1.Lease
		updated, err = leases.Update(ctx, f.desired(cur, now, fencedAt), metav1.UpdateOptions{})
		if err == nil {
			f.lease = updated
			return nil
		}
		f.lease = nil
		if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			break
		}
	}
	return fmt.Errorf("updating Lease %s/%s: %w", f.cfg.Namespace, f.leaseName, err)
}

// writeFor writes the agent's Lease at now, with fence's start as its fenced-at (none when
// fence is nil), bounded by the request timeout.
func (f *Fencer) writeFor(ctx context.Context, now time.Time, fence *fenceRecord) error {
	var fencedAt time.Time
	if fence != nil {
		fencedAt = fence.since
	}
	rctx, cancel := context.WithTimeout(ctx, f.requestTimeout)
	defer cancel()
	return f.writeLease(rctx, now, fencedAt)
}

// desired is the agent's Lease as written at now (DesiredLease, and OnNodeLease with
// Config.NodeLease).
func (f *Fencer) desired(cur *coordinationv1.Lease, now, fencedAt time.Time) *coordinationv1.Lease {
	l := DesiredLease(cur, f.cfg.Namespace, f.cfg.NodeName, f.cfg.FenceAfter, now, fencedAt)
	if f.cfg.NodeLease {
		OnNodeLease(l, f.cfg.FenceAfter, f.cfg.Pod)
	}
	return l
}

// enforce is one pass of the fence: it starts the fence when ShouldFence says so, and
// while fenced stops the running containers of the node's opted-in pods. It returns once
// the stops it made have ended.
func (f *Fencer) enforce(ctx context.Context) {
	logger := klog.FromContext(ctx)
	now := f.clock.Now()
	f.mu.Lock()
	if f.cfg.NodeLease && f.fence != nil && !ShouldFence(f.lastRenewal, now, f.cfg.FenceAfter) {
		f.endFence(ctx, now)
		f.mu.Unlock()
		return
	}
	if f.fence == nil {
		if !ShouldFence(f.lastRenewal, now, f.cfg.FenceAfter) {
			f.mu.Unlock()
			return
		}
		f.fence = &fenceRecord{since: now, lastRenewal: f.lastRenewal, fromStart: !f.renewed, stopped: map[string]types.NamespacedName{}}
		f.cfg.Metrics.SetFenced(true)
		msg := "FENCED: the Lease has not been renewed for longer than --fence-after; stopping the containers of opted-in pods until it is"
		switch {
		case f.cfg.NodeLease && !f.renewed:
			msg = "FENCED: no renewal of the kubelet's node Lease seen since the agent started, longer than --fence-after ago; stopping the containers of opted-in pods until one is"
		case f.cfg.NodeLease:
			msg = "FENCED: the kubelet's node Lease has not been renewed for longer than --fence-after (the node lost the API server, or its kubelet is down); stopping the containers of opted-in pods until it is"
		case !f.renewed:
			msg = "FENCED: the Lease has not been renewed since the agent started, longer than --fence-after ago; stopping the containers of opted-in pods until it is"
		}
		lease := klog.KRef(f.cfg.Namespace, f.leaseName)
		if f.cfg.NodeLease {
			lease = klog.KRef(conditions.NodeLeaseNamespace, f.cfg.NodeName)
		}
		logger.Info(msg, "lease", lease, "lastRenewal", f.lastRenewal.UTC().Format(time.RFC3339Nano),
			"sinceLastRenewal", now.Sub(f.lastRenewal).Round(time.Millisecond), "fenceAfter", f.cfg.FenceAfter)
	}
	fence := f.fence
	f.mu.Unlock()

	// The containers first: the sandbox of each running one is then in the second list.
	containers, err := f.cfg.Runtime.RunningContainers(ctx)
	if err != nil {
		logger.Error(err, "Fenced, but cannot list the containers; retrying", "retryIn", FencedPeriod)
		return
	}
	var sandboxes []cri.Sandbox
	if sl, ok := f.cfg.Runtime.(SandboxLister); ok {
		sandboxes, err = sl.Sandboxes(ctx)
		if err != nil {
			logger.Error(err, "Fenced, but cannot list the pod sandboxes; stopping the opted-in pods the pod cache knows, retrying the rest", "retryIn", FencedPeriod)
		}
	}
	targets := ToStop(f.cfg.NodeName, f.cfg.Pods(), sandboxes, containers, f.cfg.MaxStopTimeout)
	var wg sync.WaitGroup
	for _, t := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.stop(ctx, fence, t)
		}()
	}
	wg.Wait()
}

// stop stops one container and records it.
func (f *Fencer) stop(ctx context.Context, fence *fenceRecord, t Target) {
	logger := klog.FromContext(ctx)
	pod := klog.KRef(t.Pod.Namespace, t.Pod.Name)
	started := f.clock.Now()
	if err := f.cfg.Runtime.StopContainer(ctx, t.Container.ID, t.Timeout); err != nil {
		if ctx.Err() == nil {
			logger.Error(err, "Fenced, but cannot stop a container of an opted-in pod; retrying", "pod", pod,
				"container", t.Container.Name, "containerID", t.Container.ID, "retryIn", FencedPeriod)
		}
		return
	}
	f.cfg.Metrics.FenceStopped()
	f.mu.Lock()
	fence.stopped[t.Container.ID] = t.Pod
	f.mu.Unlock()
	logger.Info("Fenced: stopped a container of an opted-in pod", "pod", pod, "container", t.Container.Name,
		"containerID", t.Container.ID, "attempt", t.Container.Attempt, "optedInBy", t.OptedInBy, "timeout", t.Timeout,
		"took", f.clock.Since(started).Round(time.Millisecond))
}

// report logs the end of a fence and emits the Fenced Event on the Node.
func (f *Fencer) report(ctx context.Context, fence *fenceRecord, stopped map[string]types.NamespacedName, renewed time.Time) {
	logger := klog.FromContext(ctx)
	msg := Message(renewed.Sub(fence.lastRenewal), f.cfg.FenceAfter, fence.fromStart, stopped)
	if f.cfg.NodeLease {
		msg = NodeLeaseMessage(renewed.Sub(fence.lastRenewal), f.cfg.FenceAfter, fence.fromStart, stopped)
	}
	logger.Info("No longer fenced: the Lease is renewed again", "lease", klog.KRef(f.cfg.Namespace, f.leaseName),
		"fencedAt", fence.since.UTC().Format(time.RFC3339Nano), "fencedFor", renewed.Sub(fence.since).Round(time.Millisecond),
		"stoppedContainers", len(stopped), "message", msg)
	ref := &corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: f.cfg.NodeName}
	nctx, cancel := context.WithTimeout(ctx, f.requestTimeout)
	node, err := f.cfg.Client.CoreV1().Nodes().Get(nctx, f.cfg.NodeName, metav1.GetOptions{})
	cancel()
	if err == nil {
		ref.UID = node.UID
	} else {
		logger.V(2).Info("Cannot read the Node; the Fenced Event goes without its UID", "err", err)
	}
	f.cfg.Recorder.Event(ref, corev1.EventTypeWarning, conditions.EventReasonFenced, msg)
}
