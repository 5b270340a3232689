package agent

// The Agent: its Config, its pieces wired together (New), their goroutines (Run) and the
// drain at shutdown. Run starts the flow, which goes one way: the runtime's events
// (events.go), the kernel's kills (kernel.go) and the pod cache's events (pods.go) into
// the ledger (agent/ledger) and the queue (queue.go); the work (work.go) from the ledger
// to the classification (agent/classify) to the stamps (stamps.go, podsync.go), which
// the stamper (agent/stamper) writes.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/coroner-dev/coroner/agent/classify"
	"github.com/coroner-dev/coroner/agent/exithistory"
	"github.com/coroner-dev/coroner/agent/fence"
	"github.com/coroner-dev/coroner/agent/kmsg"
	"github.com/coroner-dev/coroner/agent/ledger"
	"github.com/coroner-dev/coroner/agent/metrics"
	"github.com/coroner-dev/coroner/agent/stamper"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/cri"
)

// Component is the agent's name in Events and managedFields.
const Component = "coroner-agent"

// Defaults of Config.
const (
	DefaultWorkers      = 2
	DefaultKernelWait   = 250 * time.Millisecond
	DefaultPodCacheWait = 2 * time.Second
	DefaultPodWaitMax   = time.Minute
	// DefaultShutdownGrace is --shutdown-grace-period's default, under the DaemonSet's
	// terminationGracePeriodSeconds (15).
	DefaultShutdownGrace = 10 * time.Second
)

// Config configures an Agent. NodeName, Client and Source are required.
type Config struct {
	// NodeName is this node's name: the agent watches and writes only pods bound to it
	// (spec.nodeName, A7).
	NodeName string
	// Client talks to the API server; its pod informer is limited to NodeName.
	Client kubernetes.Interface
	// Source yields the runtime's container events (cri.Watcher, or crifake in tests).
	// When it also has LastError() error, /readyz says why the runtime is unreachable;
	// when it has Stats() cri.Stats, the ignored containers are counted.
	Source cri.Source
	// Patcher writes pods; default conditions.NewPodPatcher(Client, Component). Tests
	// inject errors here.
	Patcher conditions.PodPatcher
	// Kernel, when not nil, delivers the kernel's OOM kills (kmsg.Reader), matched to
	// containers by cgroup and PID.
	Kernel <-chan kmsg.OOMKill
	// KernelCaughtUp, when not nil, is closed once Kernel has delivered (into its
	// buffer) every kill of the kernel log's backlog, the records already in the ring
	// buffer when the reader started (kmsg.OpenFromOldest, kmsg.Reader.CaughtUp).
	// Until then, for at most KernelBacklogWait after the start, exits and OOM kills
	// wait before they are classified, so that a kill logged while the agent was not
	// running is there to attribute them. Nil: no wait.
	KernelCaughtUp <-chan struct{}
	// Xids, when not nil, delivers the NVIDIA driver's Xid reports from the kernel log
	// (kmsg.Reader.Xids); a hardware Xid of a GPU a container holds is evidence of a
	// device failure (devices.go).
	Xids <-chan kmsg.XidReport
	// NvidiaGPUsDir is the NVIDIA driver's GPU list (nvidia.GPUsDir), which maps an Xid's
	// PCI address to the GPU's UUID, the device ID of NVIDIA's device plugin; empty: Xids
	// are not mapped, and blame no device.
	NvidiaGPUsDir string
	// PodResources, when not nil, says which devices the kubelet allocated to a
	// container whose pod's status does not (asked on a device-holding container's
	// death only).
	PodResources PodResourcesLister
	// DeviceWindow is how long after a container's death a device turning Unhealthy, or
	// a hardware fault logged, still explains it; default DefaultDeviceWindow.
	DeviceWindow time.Duration
	// CgroupRoot is where the cgroup hierarchies are mounted (/sys/fs/cgroup); empty
	// means do not read cgroups.
	CgroupRoot string
	// PhaseGrace is the kubelet's time to set a terminal phase itself (A4); see
	// classify.StampsForPod.
	PhaseGrace time.Duration
	// ExitHistorySize bounds the exit history annotation (A5); 0 means the default.
	ExitHistorySize int
	// BatchPeriod is the stamper's; 0 means stamper.DefaultBatchPeriod.
	BatchPeriod time.Duration
	// RetryBase and RetryMax bound the stamper's backoff; 0 means its defaults.
	RetryBase, RetryMax time.Duration
	// KernelWait is how long an OOM kill with no matching kernel line yet waits for the
	// kernel log reader to catch up, once, before it is classified without; default
	// 250ms. Only when Kernel is set.
	KernelWait time.Duration
	// PodCacheWait is how long an event whose pod is not in the cache waits for it
	// before the agent asks the API server whether the pod still exists and is on this
	// node; default 2s. PodWaitMax is when it gives up on a pod that exists on this node
	// but does not reach the cache; default 1m.
	PodCacheWait, PodWaitMax time.Duration
	// Workers is how many events are classified at the same time; default 2.
	Workers int
	// ShutdownGrace bounds the drain when Run's context ends (SIGTERM: a rollout, a node
	// drain): the agent stops following the runtime and the kernel, then classifies
	// the events it already has and writes every stamp pending, for at most this long
	// (see Agent.drain); 0: no drain (coroner-agent's --shutdown-grace-period defaults
	// to DefaultShutdownGrace).
	ShutdownGrace time.Duration
	// Clock is the agent's clock; default the real one.
	Clock clock.WithTicker
	// Metrics receives the agent's metrics; nil means a private registry.
	Metrics *metrics.Metrics
	// Recorder emits Stamped Events on pods (and the Fenced Event on the node); nil means
	// one built from Client.
	Recorder record.EventRecorder
	// InitPIDNamespace reports whether the agent runs in the init PID namespace
	// (hostPID), where the PIDs it reads from cgroup.procs are the kernel's (see
	// classify.TrustedPIDs); nil means read /proc/self/ns/pid (the init namespace's
	// inode is PROC_PID_INIT_INO, 0xEFFFFFFC). An error counts as not.
	InitPIDNamespace func() (bool, error)
	// Fencing, when not nil, turns fencing on (A6, agent/fence): its Namespace,
	// FenceAfter and Runtime (and optionally Client, MaxStopTimeout and Start) are the
	// caller's; the agent fills in its NodeName, Client when nil, Pods (its pod cache),
	// Recorder, Metrics and Clock. A Runtime that also lists the pod sandboxes
	// (fence.SandboxLister, as cri.RuntimeClient does) lets the fence find opted-in pods
	// the pod cache does not know, as when the agent started cut off from the API server.
	// Nil: no Lease, nothing is ever stopped.
	Fencing *fence.Config
}

// Agent is the node agent: it follows the runtime's container events and its node's pods,
// classifies exits and OOM kills, and has the stamper write what it decided. Create it
// with New and run it with Run.
type Agent struct {
	cfg         Config
	clock       clock.WithTicker
	metrics     *metrics.Metrics
	stamper     *stamper.Stamper
	broadcaster record.EventBroadcaster
	history     exithistory.Limits

	informer cache.SharedIndexInformer
	queue    workqueue.TypedDelayingInterface[item]
	// fencer renews the Lease and fences the node; nil without Config.Fencing.
	fencer *fence.Fencer

	// logger is for the informer's handlers, which have no context; Run sets it.
	logger klog.Logger

	// ledger is the per-container state: the containers, the runtime's states of the
	// pods' containers, the kernel's kills and what they taught (its own lock).
	ledger *ledger.Ledger

	// mu guards gone and reasonSeen, and nothing else.
	mu sync.Mutex
	// gone are pods known not to be this node's to write: deleted (seen by the
	// informer, or a 404) or bound to another node, with the reason and when learned.
	gone map[types.UID]goneRecord
	// reasonSeen is when the agent first saw a pod's status.reason (A3's event time).
	reasonSeen map[types.UID]time.Time

	// kernelReady: the kernel log's backlog has been consumed (or there is none to
	// wait for): see Config.KernelCaughtUp. It is set after the backlog's kills are in
	// the ledger, so that a classification that sees it set also sees them.
	kernelReady atomic.Bool
	// started is when Run started.
	started time.Time
	// draining: Run's context is done and the agent finishes what it has (drain); the
	// kernel's reports no longer come, so nothing waits for them.
	draining atomic.Bool
	// busy counts the work items being processed (the queue's Len counts the waiting).
	busy atomic.Int32

	// gpus maps NVIDIA GPUs' PCI addresses to their UUIDs (gpus.go).
	gpus *gpuMap
	// podResourcesOnce says once that the kubelet's PodResources socket is missing.
	podResourcesOnce sync.Once
}

// New builds an Agent; nothing runs until Run.
func New(cfg Config) (*Agent, error) {
	if cfg.NodeName == "" || cfg.Client == nil || cfg.Source == nil {
		return nil, errors.New("agent: NodeName, Client and Source are required")
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.New(prometheus.NewRegistry())
	}
	if cfg.Patcher == nil {
		cfg.Patcher = conditions.NewPodPatcher(cfg.Client, Component)
	}
	if cfg.Workers <= 0 {
		cfg.Workers = DefaultWorkers
	}
	if cfg.KernelWait <= 0 {
		cfg.KernelWait = DefaultKernelWait
	}
	if cfg.DeviceWindow <= 0 {
		cfg.DeviceWindow = DefaultDeviceWindow
	}
	if cfg.PodCacheWait <= 0 {
		cfg.PodCacheWait = DefaultPodCacheWait
	}
	if cfg.PodWaitMax < cfg.PodCacheWait {
		cfg.PodWaitMax = max(DefaultPodWaitMax, cfg.PodCacheWait)
	}
	if cfg.InitPIDNamespace == nil {
		cfg.InitPIDNamespace = initPIDNamespace
	}
	var pids classify.PIDFacts
	pids.InitNamespace, _ = cfg.InitPIDNamespace()
	a := &Agent{
		cfg:        cfg,
		clock:      cfg.Clock,
		metrics:    cfg.Metrics,
		logger:     klog.Background(),
		ledger:     ledger.New(pids),
		gone:       map[types.UID]goneRecord{},
		reasonSeen: map[types.UID]time.Time{},
		history:    exithistory.Limits{MaxEntries: cfg.ExitHistorySize},
		gpus:       &gpuMap{dir: cfg.NvidiaGPUsDir},
	}
	// Nothing to wait for without a kernel log or without a backlog signal.
	a.kernelReady.Store(cfg.Kernel == nil || cfg.KernelCaughtUp == nil)
	recorder := cfg.Recorder
	if recorder == nil {
		a.broadcaster = record.NewBroadcaster()
		recorder = a.broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: Component, Host: cfg.NodeName})
	}
	a.queue = workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[item]{
		Name: "coroner_agent", Clock: cfg.Clock,
	})

	// Only this node's pods (A7). The pod informer alone, not a factory of them: the
	// factory's package links the informers and listers of every API group (about 120
	// packages) into the agent's binary, whose pages are most of its memory.
	a.informer = coreinformers.NewFilteredPodInformer(cfg.Client, metav1.NamespaceAll, 0, cache.Indexers{},
		func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", cfg.NodeName).String()
		})
	// The cache keeps no managedFields (about a third of a pod's bytes): nothing here
	// reads them, and pods are only patched, never written whole from the cache.
	if err := a.informer.SetTransform(func(obj any) (any, error) {
		if m, ok := obj.(metav1.Object); ok {
			m.SetManagedFields(nil)
		}
		return obj, nil
	}); err != nil {
		return nil, fmt.Errorf("agent: setting the pod cache's transform: %w", err)
	}
	if err := a.informer.AddIndexers(podIndexers()); err != nil {
		return nil, fmt.Errorf("agent: adding the pod index: %w", err)
	}
	if _, err := a.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    a.podChanged,
		UpdateFunc: func(_, obj any) { a.podChanged(obj) },
		DeleteFunc: a.podDeleted,
	}); err != nil {
		return nil, fmt.Errorf("agent: adding the pod handler: %w", err)
	}

	a.stamper = stamper.New(stamper.Config{
		Patcher:       cfg.Patcher,
		Lookup:        a.podByUID,
		Clock:         cfg.Clock,
		BatchPeriod:   cfg.BatchPeriod,
		RetryBase:     cfg.RetryBase,
		RetryMax:      cfg.RetryMax,
		History:       a.history,
		Metrics:       cfg.Metrics,
		Recorder:      recorder,
		RuntimeScheme: func() string { return runtimeScheme(cfg.Source) },
	})

	if cfg.Fencing != nil {
		fc := *cfg.Fencing
		fc.NodeName, fc.Pods = cfg.NodeName, a.nodePods
		if fc.Client == nil {
			fc.Client = cfg.Client
		}
		fc.Recorder, fc.Metrics, fc.Clock = recorder, cfg.Metrics, cfg.Clock
		f, err := fence.New(fc)
		if err != nil {
			return nil, fmt.Errorf("agent: %w", err)
		}
		a.fencer = f
	}
	return a, nil
}

// Metrics returns the agent's metrics.
func (a *Agent) Metrics() *metrics.Metrics { return a.metrics }

// HasSynced reports whether the pod cache has synced.
func (a *Agent) HasSynced() bool { return a.informer.HasSynced() }

// Healthy is the /readyz check: nil while the container runtime answers.
func (a *Agent) Healthy() error { return RuntimeHealth(a.cfg.Source) }

// Run runs the agent until ctx is done: the pod informer, the runtime's events, the
// kernel's OOM kills, the stamper, the workers and, with Config.Fencing, the fencer (from
// the start: its Lease does not wait for the pod cache). Events that arrive before the pod
// cache has synced wait for it. It returns nil when ctx is done, or an error when the
// cache could not sync.
func (a *Agent) Run(ctx context.Context) error {
	defer utilruntime.HandleCrash()
	logger := klog.FromContext(ctx)
	a.logger = logger
	a.started = a.clock.Now()
	if a.broadcaster != nil {
		a.broadcaster.StartStructuredLogging(3)
		a.broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: a.cfg.Client.CoreV1().Events("")})
		defer a.broadcaster.Shutdown()
	}
	logger.Info("Starting the node agent", "node", a.cfg.NodeName, "phaseGrace", a.cfg.PhaseGrace,
		"cgroupRoot", a.cfg.CgroupRoot, "kernelLog", a.cfg.Kernel != nil, "fencing", a.fencer != nil,
		"deviceWindow", a.cfg.DeviceWindow, "xids", a.cfg.Xids != nil, "podResources", a.cfg.PodResources != nil)

	var wg sync.WaitGroup
	informerCtx, stopInformer := context.WithCancel(ctx)
	informerDone := make(chan struct{})
	defer func() {
		a.queue.ShutDown()
		wg.Wait()
		stopInformer()
		<-informerDone
		logger.Info("The node agent stopped")
	}()
	// The stamper and the workers outlive ctx by the drain (ShutdownGrace): what the
	// agent already knows when it is told to stop is still written.
	workCtx, stopWork := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWork()
	goFunc := func(f func()) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer utilruntime.HandleCrash()
			f()
		}()
	}

	go func() {
		defer close(informerDone)
		a.informer.RunWithContext(informerCtx)
	}()
	events := a.cfg.Source.Events(ctx)
	goFunc(func() { a.consumeEvents(ctx, events) })
	if a.cfg.Kernel != nil || a.cfg.Xids != nil {
		if a.cfg.Xids != nil {
			a.gpus.load(logger, a.clock.Now())
		}
		goFunc(func() { a.consumeKernel(ctx) })
	}
	goFunc(func() { a.stamper.Run(workCtx) })
	goFunc(func() { a.watchRuntime(ctx) })
	goFunc(func() { a.collectGarbage(ctx) })
	if a.fencer != nil {
		goFunc(func() { a.fencer.Run(ctx) })
	}

	if !cache.WaitForNamedCacheSyncWithContext(ctx, a.informer.HasSynced) {
		if ctx.Err() != nil {
			return nil
		}
		return errors.New("agent: the pod cache did not sync")
	}
	for range a.cfg.Workers {
		goFunc(func() {
			for a.processNext(workCtx) {
			}
		})
	}
	<-ctx.Done()
	a.drain(logger)
	stopWork()
	return nil
}

// drainTick is how often drain looks whether the work is done.
const drainTick = 20 * time.Millisecond

// drain finishes, for at most Config.ShutdownGrace, what the agent knows when Run's
// context ends: the runtime's and the kernel's streams have stopped, the workers classify
// the events already queued (an OOM kill no longer waits for a kernel report that cannot
// come; items delayed earlier return within KernelWait) and the stamper writes every
// pending stamp without waiting for its batch period (Stamper.Flush). A rolling update
// of the DaemonSet then loses nothing the old agent saw: the new one's replay places
// exits from the runtime's statuses, but an OOM kill whose kernel report has left the
// ring buffer can no longer be told a limit OOM from a node OOM. What is left when the
// grace period is over is logged, pod by pod, and counted as dropped (reason Shutdown).
func (a *Agent) drain(logger klog.Logger) {
	if a.cfg.ShutdownGrace <= 0 {
		return
	}
	a.draining.Store(true)
	a.stamper.Flush()
	start := a.clock.Now()
	deadline := start.Add(a.cfg.ShutdownGrace)
	settled := start.Add(a.cfg.KernelWait + drainTick)
	tick := a.clock.NewTicker(drainTick)
	defer tick.Stop()
	for {
		now := a.clock.Now()
		if !now.Before(deadline) {
			break
		}
		if !now.Before(settled) && a.queue.Len() == 0 && a.busy.Load() == 0 && a.stamper.Idle() {
			logger.Info("Drained: every stamp written", "took", now.Sub(start))
			return
		}
		<-tick.C()
	}
	pods, stamps := a.stamper.Unwritten()
	for range stamps {
		a.metrics.Dropped(metrics.DroppedShutdown)
	}
	names := make([]string, 0, min(len(pods), 10))
	for _, p := range pods[:min(len(pods), 10)] {
		names = append(names, p.String())
	}
	logger.Error(nil, "Stopping with stamps unwritten: the shutdown grace period is over",
		"grace", a.cfg.ShutdownGrace, "stamps", stamps, "pods", len(pods), "firstPods", names,
		"eventsUnclassified", a.queue.Len()+int(a.busy.Load()))
}
