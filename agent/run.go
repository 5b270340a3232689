package agent

// The process: the flags of cmd/coroner-agent into a Config, the API server check, the
// metrics and probes server, and a running Agent until the context ends.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/coroner-dev/coroner/agent/fence"
	"github.com/coroner-dev/coroner/agent/kmsg"
	"github.com/coroner-dev/coroner/agent/metrics"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/cri"
	"github.com/coroner-dev/coroner/internal/daemon"
)

// ServerCheckTimeout bounds the check, at start, that the API server answers.
const ServerCheckTimeout = 15 * time.Second

// LeaseClientQPS and LeaseClientBurst are the rate limits of the fencing Lease's own
// client (a renewal every 1-10s, and the Node read at a fence's end), apart from
// --kube-api-qps.
const (
	LeaseClientQPS   = 5
	LeaseClientBurst = 10
)

// Run runs coroner-agent until ctx is done: the Agent on the runtime at
// opts.RuntimeEndpoint, or the one found among cri.DefaultSockets (under
// opts.RuntimeHostPrefix) when it is "auto" or empty (cri.Watcher), the kernel log at
// opts.KmsgPath (from its oldest record: kills logged while the agent was not running
// place the exits the first relist replays), and /metrics, /healthz and /readyz on opts.MetricsAddress ("0": off).
// opts must be valid (Validate).
//
// Without opts.Fencing it fails at once, with an error that says so, when the API server
// cannot be reached at start; with it, it starts anyway (below). It fails at once when the
// metrics address cannot be bound. A container runtime that is not there (no socket, not
// a CRI runtime, none found) is not an error: the agent keeps running and reconnecting
// (or looking), /readyz answers 503 with the reason (naming every socket tried), the log
// says why once (again only when the reason changes, or after cri.Options'
// ErrorLogInterval), and /healthz (liveness) stays ok, so that the kubelet does not
// restart the agent in a loop; a runtime started after the agent, or restarted, is
// picked up. A kernel log it cannot read (no CAP_SYSLOG) is
// logged, and OOM kills are then classified without the kernel's reports.
//
// With opts.Fencing (A6) the agent also fences its node. With --fence-signal=node-lease
// (the default) it watches its kubelet's Lease in kube-node-lease and writes its own Lease
// coroner-agent-<node> in opts.LeaseNamespace only at the start and after a fence (naming
// its pod, opts.PodName); with agent-lease it renews that Lease every opts.FenceAfter/4.
// When the heartbeat (the kubelet's renewals, or its own) has been silent for
// opts.FenceAfter, it stops the containers of its node's opted-in pods over CRI (cri.RuntimeClient, a connection of its
// own to the watcher's runtime, the discovered one with "auto") until one does: see agent/fence. The Lease has an API
// client of its own (LeaseClientQPS), so that pod writes never hold up a renewal. Without
// it there is no Lease and nothing is ever stopped; a Lease that an earlier agent of the
// node (with --fencing) left loses its fence-after annotation at the start (fence.Disown),
// or the shim would take the stale Lease for a fence and recover pods nobody stopped.
//
// With opts.Fencing an API server that cannot be reached at start is logged, not an
// error, and not waited for (the check runs beside the start): an agent that exited then
// would crash-loop and never fence, while the shim, which reads the Lease's stale
// renewTime, takes its node for fenced. The start, the moment Run is called, counts as
// the agent's last renewal (fence.Config.Start): the node is fenced opts.FenceAfter after
// it unless a renewal succeeds (or is seen) first, and the opted-in pods, which the empty pod cache
// does not know, are found from their sandboxes' annotations (the kubelet's copy of the
// pod's). The Lease's renewTime is older than the start, so the agent fences later than
// the shim expects by about the time it took to restart: agent/fence says why this is
// the earliest it can, and what is left.
func Run(ctx context.Context, cfg *rest.Config, opts *Options) error {
	start := time.Now()
	logger := klog.FromContext(ctx)
	// Protobuf, as the kubelet's client: decoding the node's pod events costs a fraction
	// of JSON's CPU and garbage.
	cfg = protobuf(cfg)
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("building the client: %w", err)
	}
	if !opts.Fencing {
		if err := daemon.CheckAPIServer(ctx, client, ServerCheckTimeout); err != nil {
			return fmt.Errorf("cannot reach the API server at %s: %w", cfg.Host, err)
		}
	} else {
		// Not waited for: the fence clock runs from the start, whatever the answer.
		go func() {
			if err := daemon.CheckAPIServer(ctx, client, ServerCheckTimeout); err != nil && ctx.Err() == nil {
				logger.Error(err, "Cannot reach the API server at start; starting anyway, since --fencing is on: the node is fenced (the containers of its opted-in pods stopped) --fence-after after the start unless the fencing Lease is renewed by then",
					"host", cfg.Host, "start", start.UTC().Format(time.RFC3339Nano), "fenceAfter", opts.FenceAfter,
					"fencesAt", start.Add(opts.FenceAfter).UTC().Format(time.RFC3339Nano))
			}
		}()
	}
	if v, set, err := opts.oomScoreAdj(); err != nil {
		return err
	} else if set {
		if before, err := setOOMScoreAdj(selfOOMScoreAdj, v); err != nil {
			logger.Error(err, "Cannot lower the agent's OOM score; a node OOM may kill the agent before the pods whose kills it reports (needs CAP_SYS_RESOURCE; --oom-score-adj= keeps the runtime's)", "path", selfOOMScoreAdj)
		} else if before != v {
			logger.Info("Set the agent's OOM score", "from", before, "to", v)
		}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := metrics.New(reg)

	watcher := cri.New(cri.Options{
		Endpoint:            opts.RuntimeEndpoint,
		HostPrefix:          opts.RuntimeHostPrefix,
		ContainerdNamespace: opts.ContainerdNamespace,
		NoContainerdEvents:  !opts.ContainerdEvents,
		RelistPeriod:        opts.RelistPeriod,
	})

	var kernel chan kmsg.OOMKill
	var kernelCaughtUp <-chan struct{}
	var xids chan kmsg.XidReport
	if opts.KmsgPath != "" {
		if opts.NvidiaGPUsDir != "" {
			xids = make(chan kmsg.XidReport, 64)
		}
		if k, up, err := startKernelLog(ctx, opts.KmsgPath, xids, opts.UserSpaceXids); err != nil {
			logger.Error(err, "Cannot read the kernel log; OOM kills are classified without the kernel's reports, and no Xid blames a GPU", "path", opts.KmsgPath)
			xids = nil
		} else {
			kernel, kernelCaughtUp = k, up
		}
	}
	var podResources PodResourcesLister
	if opts.PodResourcesSocket != "" {
		c := NewPodResourcesClient(opts.PodResourcesSocket, nil)
		defer c.Close()
		podResources = c
	}
	cgroupRoot := opts.CgroupRoot
	if cgroupRoot != "" {
		if _, err := os.Stat(cgroupRoot); err != nil {
			logger.Error(err, "Cannot read cgroups; OOM kills are classified without their memory counters", "cgroupRoot", cgroupRoot)
			cgroupRoot = ""
		}
	}

	var fencing *fence.Config
	if opts.Fencing {
		rt, err := watcher.RuntimeClient()
		if err != nil {
			return err
		}
		defer rt.Close()
		// A client of its own, so that a burst of pod writes waiting for the agent's
		// rate limiter cannot delay renewals into a fence.
		lcfg := rest.CopyConfig(cfg)
		lcfg.QPS, lcfg.Burst = LeaseClientQPS, LeaseClientBurst
		leaseClient, err := kubernetes.NewForConfig(lcfg)
		if err != nil {
			return fmt.Errorf("building the Lease client: %w", err)
		}
		fencing = &fence.Config{Namespace: opts.LeaseNamespace, FenceAfter: opts.FenceAfter, Runtime: rt, Client: leaseClient, Start: start,
			NodeLease: opts.FenceSignal == conditions.FenceSignalNodeLease,
			Pod:       types.NamespacedName{Namespace: opts.PodNamespace, Name: opts.PodName}}
	} else {
		logger.Info("Fencing is off (no --fencing): no Lease, the agent never stops containers")
		if err := disownLease(ctx, client, opts); err != nil {
			return err
		}
	}

	a, err := New(Config{
		NodeName:        opts.NodeName,
		Client:          client,
		Source:          watcher,
		Kernel:          kernel,
		KernelCaughtUp:  kernelCaughtUp,
		Xids:            xids,
		NvidiaGPUsDir:   opts.NvidiaGPUsDir,
		PodResources:    podResources,
		DeviceWindow:    opts.DeviceWindow,
		CgroupRoot:      cgroupRoot,
		PhaseGrace:      opts.PhaseGrace,
		ExitHistorySize: opts.ExitHistorySize,
		BatchPeriod:     opts.StampBatchPeriod,
		ShutdownGrace:   opts.ShutdownGrace,
		Metrics:         m,
		Fencing:         fencing,
	})
	if err != nil {
		return err
	}

	if opts.MetricsAddress != "0" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
		reg.MustRegister(watcher.Collector(metrics.Namespace, metrics.Subsystem))
		mux.Handle("/healthz", HealthHandler(Alive))
		mux.Handle("/readyz", HealthHandler(a.Healthy))
		s, err := daemon.Serve(ctx, "/metrics, /healthz and /readyz", opts.MetricsAddress, mux)
		if err != nil {
			return err
		}
		defer func() {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = s.Shutdown(sctx)
		}()
	}
	return a.Run(ctx)
}

// startKernelLog opens the kernel log at its oldest record and sends its OOM kills (and,
// with xids, its NVIDIA Xid reports: the driver's, and with userSpaceXids those a program
// wrote too) until ctx is done; the channel returned second is
// closed once the backlog (the kills logged before the start, while the agent was not
// running) has been sent.
func startKernelLog(ctx context.Context, path string, xids chan<- kmsg.XidReport, userSpaceXids bool) (chan kmsg.OOMKill, <-chan struct{}, error) {
	f, err := kmsg.OpenFromOldest(path)
	if err != nil {
		return nil, nil, err
	}
	boot, err := kmsg.BootTime(time.Now())
	if err != nil {
		boot = time.Time{} // kill times unknown; kills are matched by cgroup and PID
	}
	r := kmsg.NewReader(f, boot)
	r.Xids, r.UserSpaceXids = xids, userSpaceXids
	out := make(chan kmsg.OOMKill, 256)
	logger := klog.FromContext(ctx)
	go func() {
		if err := r.Run(ctx, out); err != nil && !errors.Is(err, context.Canceled) {
			logger.Error(err, "Reading the kernel log stopped; OOM kills are classified without the kernel's reports from now on", "path", path)
		}
	}()
	logger.Info("Reading the kernel log for OOM kills, from its oldest record", "path", path)
	return out, r.CaughtUp(), nil
}

// disownLease takes the fence-after annotation off the Lease an earlier agent of this node
// left when it fenced (fence.Disown): without it the shim would take this agent's silence
// for a fence. A Lease the agent may not read or write (RBAC without Leases: no agent of
// it could have fenced either) is logged, not an error; any other failure stops the start,
// since the API server answered a moment ago and a stale Lease is unsafe.
func disownLease(ctx context.Context, client kubernetes.Interface, opts *Options) error {
	logger := klog.FromContext(ctx)
	l, err := fence.Disown(ctx, client, opts.LeaseNamespace, opts.NodeName)
	switch {
	case apierrors.IsForbidden(err):
		logger.Error(err, "Cannot check for a fencing Lease left by an earlier agent with --fencing; if there is one, the shim takes this node for fenced once the Lease is stale",
			"lease", klog.KRef(opts.LeaseNamespace, conditions.AgentLeaseName(opts.NodeName)))
	case err != nil:
		return err
	case l != nil:
		logger.Info("Took fence-after off the Lease an earlier agent with --fencing left: the shim no longer takes this node's silence for a fence",
			"lease", klog.KObj(l))
	}
	return nil
}

// protobuf is a copy of cfg whose requests and answers are protobuf (JSON accepted too).
func protobuf(cfg *rest.Config) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.ContentType = runtime.ContentTypeProtobuf
	c.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	return c
}
