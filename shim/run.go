package shim

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"

	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/internal/daemon"
	"github.com/coroner-dev/coroner/shim/backoff"
	"github.com/coroner-dev/coroner/shim/controller"
	"github.com/coroner-dev/coroner/shim/informers"
	"github.com/coroner-dev/coroner/shim/metrics"
	"github.com/coroner-dev/coroner/shim/recoverer"
	"github.com/coroner-dev/coroner/shim/recovery"
)

// ServerCheckTimeout bounds the check, at start, that the API server answers.
const ServerCheckTimeout = 15 * time.Second

// leaderHealthTimeout is how long the leader may fail to renew its Lease beyond the
// lease duration before /healthz reports it unhealthy.
const leaderHealthTimeout = 20 * time.Second

// Run runs coroner-shim until ctx is done: the Job controller, node-failure recovery and
// the node quarantine on their shared informers (Controllers; all under leader election on
// a Lease when opts.LeaderElect), /metrics on opts.MetricsAddress, and /healthz and /readyz on
// opts.HealthAddress (either "0" for off). opts must be valid (Validate).
//
// It fails at once, with an error that says so, when the API server cannot be reached
// at start or a listen address cannot be bound. When ctx is done it stops the
// controllers, waits up to opts.ShutdownGrace for the syncs in flight to finish, then
// releases the Lease (if it holds it) and closes the HTTP servers, and returns nil.
// Losing the Lease while leading is an error: the process should exit and start over, as
// every Kubernetes controller does, since its caches and expectations belong to the term
// that ended.
//
// /healthz answers 200 while the process runs (and, when leading, while the Lease is
// renewed). /readyz answers 200 once the controllers' caches have synced, and also while
// this replica is standing by without the Lease: a standby has nothing to be ready for,
// and a Deployment of two replicas must be able to roll out with one of them waiting.
// The standby starts its informers only when it becomes the leader.
//
// Only the leader serves the Job metrics (see package metrics): every replica serves
// coroner_leader, 1 while it leads and 0 while it stands by. A standby's normal start logs
// no error: the losing side of the replicas' race for the Lease (both create it at once on
// a fresh install, or update it at once when the leader released it) is logged at V(2).
func Run(ctx context.Context, cfg *rest.Config, opts *Options) error {
	// The typed client speaks protobuf, as kube-controller-manager's does: the shim's CPU
	// goes mostly to decoding watch events and to the garbage that decoding leaves, which
	// protobuf cuts to a fraction of JSON's, and shim/podwire cuts further. The JobRecords'
	// clients stay JSON (RecordsConfig). All share one rate limiter (NewClients).
	clients, err := NewClients(cfg, opts.JobRecords, opts.JobRecordMaxPods)
	if err != nil {
		return err
	}
	client := clients.Kube
	if err := daemon.CheckAPIServer(ctx, client, ServerCheckTimeout); err != nil {
		return fmt.Errorf("cannot reach the API server at %s: %w", cfg.Host, err)
	}
	if opts.JobRecords {
		if err := checkJobRecords(ctx, client); err != nil {
			return err
		}
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := metrics.New(reg)
	// Built outside the leader election, but started only by the leader (Controllers.Run):
	// a standby starts no informer.
	ctrl := NewControllers(ctx, client, Config{
		Jobs: controller.Config{
			ManagedBy:         opts.ManagedBy,
			Backoff:           backoff.Policy{Base: opts.PodBackoffBase, Max: opts.PodBackoffMax},
			Workers:           opts.Workers,
			Metrics:           m,
			OOMVerdictWait:    opts.OOMVerdictWait,
			DeviceVerdictWait: opts.DeviceVerdictWait,
			DefaultAvoidance:  v1alpha1.Avoidance(opts.AvoidFailedNodes),
			Records:           clients.Records,
			PodMetadata:       clients.PodMetadata,
		},
		Recovery: recoverer.Config{
			Recovery: recovery.Config{
				Threshold:   opts.ZombieThreshold,
				FenceMargin: opts.FenceMargin,
				StaleAfter:  opts.StaleDisruptionAfter,
			},
			RecoverPods: recoverer.RecoverScope(opts.RecoverPods),
		},
		Informers:  informers.Config{AgentNamespace: opts.AgentNamespace},
		Quarantine: opts.QuarantineConfig(),
	})

	var leading, standingBy atomic.Bool
	var watchdog *leaderelection.HealthzAdaptor
	if opts.LeaderElect {
		watchdog = leaderelection.NewLeaderHealthzAdaptor(leaderHealthTimeout)
		standingBy.Store(true)
		m.SetLeader(false)
	}

	var servers []*http.Server
	defer func() {
		// The controller has stopped (or the grace period is over): close the servers.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		for _, s := range servers {
			_ = s.Shutdown(sctx)
		}
	}()
	if opts.MetricsAddress != "0" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
		s, err := daemon.Serve(ctx, "metrics", opts.MetricsAddress, mux)
		if err != nil {
			return err
		}
		servers = append(servers, s)
	}
	if opts.HealthAddress != "0" {
		mux := http.NewServeMux()
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
			if watchdog != nil {
				if err := watchdog.Check(r); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
			}
			_, _ = w.Write([]byte("ok"))
		})
		mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
			switch {
			case ctrl.HasSynced():
				_, _ = w.Write([]byte("ok"))
			case standingBy.Load() && !leading.Load():
				_, _ = w.Write([]byte("ok: standing by without the leader Lease"))
			default:
				http.Error(w, "caches not synced yet", http.StatusServiceUnavailable)
			}
		})
		s, err := daemon.Serve(ctx, "health", opts.HealthAddress, mux)
		if err != nil {
			return err
		}
		servers = append(servers, s)
	}

	if !opts.LeaderElect {
		return runController(ctx, ctrl, opts.ShutdownGrace)
	}
	return runLeaderElected(ctx, cfg, opts, ctrl, m, watchdog, &leading)
}

// RecordsConfig is where the Job controller writes the JobRecords through cfg: a dynamic
// client, JSON (custom resources have no protobuf; dynamic.NewForConfig sets JSON
// itself), and a metadata client for the patches, whose answer is then the record's
// metadata alone.
func RecordsConfig(cfg *rest.Config, maxPods int) (controller.RecordsConfig, error) {
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return controller.RecordsConfig{}, fmt.Errorf("building the JobRecords' client: %w", err)
	}
	meta, err := metadata.NewForConfig(cfg)
	if err != nil {
		return controller.RecordsConfig{}, fmt.Errorf("building the JobRecords' client: %w", err)
	}
	return controller.RecordsConfig{Client: dyn, Metadata: meta, MaxPods: maxPods}, nil
}

// jobRecordsWait is how long the start waits for the API server to serve JobRecords: a
// CRD applied in the same `kubectl apply` as the shim's Deployment is established a moment
// later.
var jobRecordsWait = 30 * time.Second

// checkJobRecords fails, saying what to do, when the API server does not serve JobRecords
// (the CRD is not installed) within jobRecordsWait.
func checkJobRecords(ctx context.Context, client kubernetes.Interface) error {
	gv := v1alpha1.Group + "/" + v1alpha1.Version
	served := func() (bool, error) {
		list, err := client.Discovery().ServerResourcesForGroupVersion(gv)
		if err != nil && !apierrors.IsNotFound(err) {
			return false, fmt.Errorf("checking that the API server serves %s %s: %w", gv, v1alpha1.Resource, err)
		}
		return list != nil && slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool { return r.Name == v1alpha1.Resource }), nil
	}
	deadline := time.Now().Add(jobRecordsWait)
	for {
		ok, err := served()
		if ok || err != nil {
			return err
		}
		if time.Now().After(deadline) {
			break
		}
		klog.FromContext(ctx).Info("Waiting for the API server to serve JobRecords (their CRD is applied with the shim, or not installed)", "groupVersion", gv)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
	return fmt.Errorf("the API server does not serve %s %s: install the CRD (kubectl apply -f deploy/base/jobrecord-crd.yaml; the kustomize base and the Helm chart include it), or run with --job-records=false (coronerctl explain then tells only the pods that still exist)", gv, v1alpha1.Resource)
}

// runController runs ctrl until ctx is done, then waits up to grace for it to stop.
func runController(ctx context.Context, ctrl *Controllers, grace time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- ctrl.Run(ctx) }()
	select {
	case err := <-done:
		if ctx.Err() != nil {
			return nil
		}
		return err
	case <-ctx.Done():
	}
	return waitStopped(ctx, done, grace)
}

// waitStopped waits up to grace for the controller's Run to return after ctx is done.
func waitStopped(ctx context.Context, done <-chan error, grace time.Duration) error {
	logger := klog.FromContext(ctx)
	logger.Info("Shutting down: letting the syncs in flight finish", "grace", grace)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case err := <-done:
		if err != nil {
			// Stopped before its caches synced: the shutdown is the reason.
			logger.Info("The controller stopped", "reason", err)
		} else {
			logger.Info("The controller stopped")
		}
	case <-t.C:
		logger.Info("The shutdown grace period is over; stopping with syncs in flight", "grace", grace)
	}
	return nil
}

// runLeaderElected runs ctrl while this process holds the Lease.
func runLeaderElected(ctx context.Context, cfg *rest.Config, opts *Options, ctrl *Controllers,
	m *metrics.Metrics, watchdog *leaderelection.HealthzAdaptor, leading *atomic.Bool) error {
	logger := klog.FromContext(ctx)
	hostname, err := os.Hostname()
	if err != nil {
		return fmt.Errorf("leader election identity: %w", err)
	}
	id := hostname + "_" + string(uuid.NewUUID())
	// A client of its own, so that the controller's traffic cannot starve the renewals.
	leClient, err := kubernetes.NewForConfig(rest.AddUserAgent(protobuf(cfg), "leader-election"))
	if err != nil {
		return fmt.Errorf("building the leader election client: %w", err)
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: opts.LeaseNamespace, Name: opts.LeaseName},
		Client:     leClient.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: id},
	}

	// The elector runs on a context that ends only after the controller has stopped, so
	// that the Lease is released (ReleaseOnCancel) once no sync of ours is in flight.
	leCtx, leCancel := context.WithCancel(context.WithoutCancel(ctx))
	defer leCancel()
	ctrlDone := make(chan error, 1)
	var started atomic.Bool
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   opts.LeaseDuration,
		RenewDeadline:   opts.RenewDeadline,
		RetryPeriod:     opts.RetryPeriod,
		ReleaseOnCancel: true,
		Name:            opts.LeaseName,
		WatchDog:        watchdog,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(lctx context.Context) {
				logger.Info("Acquired the leader Lease; starting the controller", "identity", id)
				leading.Store(true)
				m.SetLeader(true)
				started.Store(true)
				// Stop on a lost Lease (lctx) or on shutdown (ctx).
				cctx, cancel := context.WithCancel(lctx)
				stop := context.AfterFunc(ctx, cancel)
				defer stop()
				defer cancel()
				ctrlDone <- ctrl.Run(cctx)
			},
			OnStoppedLeading: func() {
				leading.Store(false)
				m.SetLeader(false)
			},
			OnNewLeader: func(identity string) {
				if identity != id {
					logger.Info("Standing by; another replica holds the leader Lease", "leader", identity)
				}
			},
		},
	})
	if err != nil {
		return fmt.Errorf("leader election: %w", err)
	}
	leDone := make(chan struct{})
	go func() {
		defer close(leDone)
		le.Run(klog.NewContext(leCtx, standbyLogger(logger, leading)))
	}()
	logger.Info("Waiting for the leader Lease", "lease", opts.LeaseNamespace+"/"+opts.LeaseName, "identity", id)

	select {
	case <-leDone:
		// le.Run returns before leCtx ends only when the Lease was lost.
		return fmt.Errorf("lost the leader Lease %s/%s", opts.LeaseNamespace, opts.LeaseName)
	case <-ctx.Done():
	}
	if started.Load() {
		_ = waitStopped(ctx, ctrlDone, opts.ShutdownGrace)
	}
	leCancel()
	select {
	case <-leDone:
	case <-time.After(opts.RenewDeadline):
		logger.Info("Gave up waiting for the leader Lease to be released")
	}
	return nil
}

// standbyLogger returns logger for the leader elector: while this replica does not lead,
// the errors that only say another replica got to the Lease first (AlreadyExists when both
// create it, Conflict when both update it) are logged as information at V(2), not as
// errors: they are how a replica learns it is the standby. Every other error, and every
// error while leading, passes as it is.
func standbyLogger(logger klog.Logger, leading *atomic.Bool) klog.Logger {
	sink := logger.GetSink()
	if sink == nil {
		return logger
	}
	// One more frame (raceSink's) between the caller and the sink, so that klog names the
	// caller's line. WithCallDepth returns a copy: the logger's own sink is left as it is.
	if cd, ok := sink.(interface{ WithCallDepth(int) klog.LogSink }); ok {
		sink = cd.WithCallDepth(1)
	}
	return klog.New(&raceSink{sink: sink, leading: leading})
}

// raceSink is the klog.LogSink behind standbyLogger.
type raceSink struct {
	sink    klog.LogSink
	leading *atomic.Bool
}

// Init does nothing: the wrapped sink was initialised by the logger it comes from, and
// initialising it again would change that logger's call depth too.
func (s *raceSink) Init(klog.RuntimeInfo) {}

func (s *raceSink) Enabled(level int) bool { return s.sink.Enabled(level) }

func (s *raceSink) Info(level int, msg string, kv ...any) { s.sink.Info(level, msg, kv...) }

func (s *raceSink) Error(err error, msg string, kv ...any) {
	if !s.leading.Load() && (apierrors.IsAlreadyExists(err) || apierrors.IsConflict(err)) {
		if s.sink.Enabled(2) {
			s.sink.Info(2, "Another replica got to the leader Lease first; standing by",
				append(kv, "elector", msg, "err", err.Error())...)
		}
		return
	}
	s.sink.Error(err, msg, kv...)
}

func (s *raceSink) WithValues(kv ...any) klog.LogSink {
	return &raceSink{sink: s.sink.WithValues(kv...), leading: s.leading}
}

func (s *raceSink) WithName(name string) klog.LogSink {
	return &raceSink{sink: s.sink.WithName(name), leading: s.leading}
}

// protobuf is a copy of cfg whose requests and answers are protobuf (JSON accepted too).
func protobuf(cfg *rest.Config) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.ContentType = runtime.ContentTypeProtobuf
	c.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	return c
}
