package fence

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
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
