package shim

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/controller"
	"github.com/coroner-dev/coroner/shim/informers"
	"github.com/coroner-dev/coroner/shim/metrics"
	"github.com/coroner-dev/coroner/shim/quarantine"
	"github.com/coroner-dev/coroner/shim/recoverer"
)

// Config configures the shim's controllers (NewControllers). Zero fields take the
// defaults of their packages.
type Config struct {
	// Jobs configures the Job controller. Its ManagedBy, Clock, Metrics and Recorder are
	// node-failure recovery's too, unless Recovery sets its own. A nil Recorder means one
	// built by NewControllers and run by Controllers.Run, with source component
	// conditions.ShimComponent; a nil Metrics a private registry.
	Jobs controller.Config
	// Recovery configures node-failure recovery.
	Recovery recoverer.Config
	// Quarantine configures the quarantine of nodes that keep killing pods (and the count
	// of the deaths blamed on nodes). Its ManagedBy, Clock, Metrics and Recorder default to
	// the Job controller's.
	Quarantine quarantine.Config
	// Informers configures the shared informers: where the agents' Leases are, and the
	// namespace of the pods that are not Jobs' pods.
	Informers informers.Config
}

// Controllers are coroner-shim's controllers, the Job controller, node-failure recovery and
// the node quarantine, on one set of shared informers. Build them with NewControllers; Run runs
// them.
type Controllers struct {
	client     kubernetes.Interface
	informers  *informers.Informers
	jobs       *controller.Controller
	recoverer  *recoverer.Recoverer
	quarantine *quarantine.Controller
	// broadcaster is set when NewControllers built the recorder; Run starts and stops it.
	broadcaster record.EventBroadcaster
}

// NewControllers builds the shared informers once, and the Job controller and the
// recoverer on them, each registering its event handlers; nothing runs until Run. ctx gives
// the logger of the controllers' event handlers; nothing else of it is kept.
func NewControllers(ctx context.Context, client kubernetes.Interface, cfg Config) *Controllers {
	c := &Controllers{client: client, informers: informers.New(client, cfg.Informers)}
	if cfg.Jobs.Metrics == nil {
		cfg.Jobs.Metrics = metrics.New(prometheus.NewRegistry())
	}
	if cfg.Jobs.Recorder == nil {
		c.broadcaster = record.NewBroadcaster(record.WithCorrelatorOptions(eventCorrelation()))
		cfg.Jobs.Recorder = c.broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: conditions.ShimComponent})
	}
	// Recovery and the quarantine share the Job controller's settings unless set.
	r, q := &cfg.Recovery, &cfg.Quarantine
	inherit(&r.ManagedBy, cfg.Jobs.ManagedBy)
	inherit(&r.Clock, cfg.Jobs.Clock)
	inherit(&r.Metrics, cfg.Jobs.Metrics)
	inherit(&r.Recorder, cfg.Jobs.Recorder)
	inherit(&q.ManagedBy, cfg.Jobs.ManagedBy)
	inherit(&q.Clock, cfg.Jobs.Clock)
	inherit(&q.Metrics, cfg.Jobs.Metrics)
	inherit(&q.Recorder, cfg.Jobs.Recorder)
	c.jobs = controller.New(ctx, client, c.informers, cfg.Jobs)
	c.recoverer = recoverer.New(ctx, client, c.informers, cfg.Recovery)
	c.quarantine = quarantine.New(ctx, client, c.informers, cfg.Quarantine)
	return c
}

// HasSynced reports whether the caches of every controller have synced (for /readyz).
func (c *Controllers) HasSynced() bool {
	return c.jobs.HasSynced() && c.recoverer.HasSynced() && c.quarantine.HasSynced()
}

// Run starts the Event recorder (when NewControllers built it) and the informers, runs every
// controller until ctx is done, and returns once all have stopped (each lets the work it
// is on finish first, see controller.Controller.Run), after shutting the informers and the
// recorder down. It returns an error if the caches did not sync before ctx was done.
func (c *Controllers) Run(ctx context.Context) error {
	defer utilruntime.HandleCrash()
	if c.broadcaster != nil {
		c.broadcaster.StartStructuredLogging(3)
		c.broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: c.client.CoreV1().Events("")})
		defer c.broadcaster.Shutdown()
	}
	// After every controller has stopped: nothing reads the informers any more.
	defer c.informers.Shutdown()

	var wg sync.WaitGroup
	var jobsErr, recoveryErr, quarantineErr error
	wg.Go(func() { jobsErr = c.jobs.Run(ctx) })
	wg.Go(func() { recoveryErr = c.recoverer.Run(ctx) })
	wg.Go(func() { quarantineErr = c.quarantine.Run(ctx) })
	// The pods a shim made before coroner.dev/managed must carry it before the pod cache
	// fills, or the Job controller would take them for missing and replace them.
	if err := c.labelOwnPods(ctx); err == nil {
		// The handlers are registered (NewControllers): no event is missed.
		c.informers.Start(ctx.Done())
	}
	wg.Wait()
	return errors.Join(jobsErr, recoveryErr, quarantineErr)
}

// labelOwnPods runs controller.LabelOwnPods until it succeeds, retrying after an error
// (the API server down, say) with a back-off of 1 s doubling up to 30 s; it returns an
// error only when ctx is done first.
func (c *Controllers) labelOwnPods(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	delay := time.Second
	for {
		n, err := c.jobs.LabelOwnPods(ctx)
		if n > 0 {
			logger.Info("Labelled the pods of managed Jobs that lacked the label", "label", conditions.ManagedPodLabel, "pods", n)
		}
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		logger.Error(err, "Labelling the pods of managed Jobs before the caches start; retrying", "after", delay)
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(delay):
		}
		delay = min(2*delay, 30*time.Second)
	}
}

// eventCorrelation is how the shim's Events are thinned, chosen for people now that
// explain reads the Jobs' records (controller/jobrecord.go) rather than Events:
//   - aggregation is client-go's: past 10 Events of one reason on one object within 10
//     minutes, similar ones are combined ("(combined from similar events): ...");
//   - the spam filter (a burst of 25, then one every 5 minutes) counts per object, Event
//     type and reason, not per object as client-go's default: a Job's 25th
//     SuccessfulCreate must not silence the Warning that says why it failed.
func eventCorrelation() record.CorrelatorOptions {
	return record.CorrelatorOptions{SpamKeyFunc: spamKeyByReason}
}

// spamKeyByReason is the spam filter's key: the source, the object and the Event's type
// and reason.
func spamKeyByReason(e *corev1.Event) string {
	o := e.InvolvedObject
	return strings.Join([]string{e.Source.Component, e.Source.Host, o.Kind, o.Namespace, o.Name, string(o.UID), o.APIVersion, e.Type, e.Reason}, "\x00")
}

// inherit sets *v to d when *v is the zero value.
func inherit[T comparable](v *T, d T) {
	var zero T
	if *v == zero {
		*v = d
	}
}
