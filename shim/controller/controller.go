// Package controller is coroner's Job controller: it watches Jobs and their pods with
// shared informers (shim/informers, built once by the caller), and for every Job whose
// spec.managedBy is its name (S1) carries out the Plan that the pure package
// shim/jobsync decides, in the order that package documents (pod deletions and creations,
// the status write, finalizer removals and the write that counts their pods, then Events,
// metrics and the Job's backoff).
//
// Jobs managed by anyone else are never synced and never written; neither are their pods,
// with one exception, shared with the built-in Job controller: a pod that still carries
// the batch.kubernetes.io/job-tracking finalizer although the Job that controlled it is
// gone (or it lost its controller reference) gets the finalizer removed, whoever managed
// the Job, because nobody else would (see orphans.go). Node-failure recovery, which also
// writes pods of Jobs that are not managed, is a controller of its own on the same
// informers (shim/recoverer).
package controller

import (
	"context"
	"fmt"
	"github.com/coroner-dev/coroner/api/v1alpha1"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	batchlisters "k8s.io/client-go/listers/batch/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/tools/cache"
	events "k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/backoff"
	"github.com/coroner-dev/coroner/shim/informers"
	"github.com/coroner-dev/coroner/shim/jobsync"
	"github.com/coroner-dev/coroner/shim/metrics"
	"github.com/coroner-dev/coroner/shim/queue"
)

// Defaults of Config.
const (
	DefaultBatchPeriod = time.Second
	DefaultWorkers     = 5
)

// Config configures a Controller. Zero fields take the defaults.
type Config struct {
	// ManagedBy is the spec.managedBy value of the Jobs to manage; default
	// conditions.ManagedBy.
	ManagedBy string
	// Backoff is the delay before failed pods are replaced; default backoff.Default.
	Backoff backoff.Policy
	// BatchPeriod delays the sync after a pod event, so that the events of one Job's
	// pods are handled in one sync; default 1s.
	BatchPeriod time.Duration
	// OOMVerdictWait is how long a Failed pod whose container was OOM-killed waits for the
	// agent's verdict (jobsync.Input.VerdictWait); 0: no wait.
	OOMVerdictWait time.Duration
	// DeviceVerdictWait is how long a Failed pod that held devices waits for the agent's
	// device verdict (jobsync.Input.DeviceVerdictWait); 0: no wait.
	DeviceVerdictWait time.Duration
	// DefaultAvoidance is the avoidance of failed nodes of Jobs without
	// coroner.dev/avoid-failed-nodes (jobsync.Input.DefaultAvoidance).
	DefaultAvoidance v1alpha1.Avoidance
	// Records is where the pods' stories go for coronerctl explain (jobrecord.go); a nil
	// Client keeps none.
	Records RecordsConfig
	// PodMetadata, when set, carries the controller's pod patches (the tracking finalizer,
	// the counted label, adoption and release), whose answers are then the pod's metadata
	// alone rather than the whole pod, which nothing reads; nil: the typed client's
	// patches (the unit tests' fake clientset has no metadata client).
	PodMetadata metadata.Interface
	// Workers is the number of Jobs synced concurrently; default 5.
	Workers int
	// Clock is the controller's clock; default clock.RealClock{}.
	Clock clock.WithTicker
	// Metrics receives the controller's metrics; nil means a private registry.
	Metrics *metrics.Metrics
	// Recorder emits Events on Jobs. Required: the caller shares one with node-failure
	// recovery (shim.NewControllers builds it, with source component
	// conditions.ShimComponent).
	Recorder events.EventRecorder
}

// Controller syncs the Jobs managed by Config.ManagedBy. Create it with New.
//
// What it remembers of each Job between syncs is in state (jobstate.go, one lock), the
// writes it waits to see in expectations (expectations.go, a lock of its own), and the
// last JobRecord it wrote in jobRecords (jobrecord.go, a lock of its own); no two of these
// locks are held at once. The queues and informers are safe for concurrent use.
type Controller struct {
	client kubernetes.Interface
	cfg    Config
	// logger is for the event handlers, which have no context of their own.
	logger   klog.Logger
	clock    clock.WithTicker
	metrics  *metrics.Metrics
	recorder events.EventRecorder

	// inf are the shared informers; the fields below are some of theirs, at hand.
	inf        *informers.Informers
	jobLister  batchlisters.JobLister
	podLister  corelisters.PodLister
	podIndexer cache.Indexer

	// queue holds Job keys (namespace/name) to sync; orphanQueue holds pod keys whose
	// tracking finalizer may have to go because their Job is gone; strayQueue the pods that
	// left the pod cache without being deleted (strays.go).
	queue       queue.Queue
	orphanQueue queue.Queue
	strayQueue  queue.Queue

	// state is the controller's memory of each Job (jobstate.go).
	state *jobStates

	expectations *expectations

	// jobRecords writes the Jobs' JobRecords (jobrecord.go).
	jobRecords *records

	// syncJob is jobsync.Sync; tests replace it with a canned Plan.
	syncJob func(jobsync.Input) jobsync.Plan
}

// New builds a Controller on the shared informers inf and registers its event handlers
// on them; nothing runs until Run (the caller starts the informers). ctx gives the logger
// of the event handlers; nothing else of it is kept.
func New(ctx context.Context, client kubernetes.Interface, inf *informers.Informers, cfg Config) *Controller {
	if cfg.ManagedBy == "" {
		cfg.ManagedBy = conditions.ManagedBy
	}
	if cfg.Backoff == (backoff.Policy{}) {
		cfg.Backoff = backoff.Default
	}
	if cfg.BatchPeriod <= 0 {
		cfg.BatchPeriod = DefaultBatchPeriod
	}
	if cfg.Workers <= 0 {
		cfg.Workers = DefaultWorkers
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.New(prometheus.NewRegistry())
	}
	if cfg.Recorder == nil {
		panic("controller.New: Config.Recorder is nil")
	}
	c := &Controller{
		client:       client,
		cfg:          cfg,
		logger:       klog.FromContext(ctx),
		clock:        cfg.Clock,
		metrics:      cfg.Metrics,
		recorder:     cfg.Recorder,
		inf:          inf,
		jobLister:    inf.JobLister,
		podLister:    inf.PodLister,
		podIndexer:   inf.Pods.GetIndexer(),
		queue:        queue.New("coroner_job", cfg.Clock),
		orphanQueue:  queue.New("coroner_orphan_pod", cfg.Clock),
		strayQueue:   queue.New("coroner_stray_pod", cfg.Clock),
		state:        newJobStates(),
		expectations: newExpectations(cfg.Clock),
		jobRecords:   newRecords(cfg.Records, cfg.Metrics),
		syncJob:      jobsync.Sync,
	}
	c.addHandlers()
	return c
}

// informers are the informers the controller reads, to wait for.
func (c *Controller) informers() []cache.SharedIndexInformer {
	return []cache.SharedIndexInformer{c.inf.Jobs, c.inf.Pods}
}

// HasSynced reports whether the informers the controller reads have synced.
func (c *Controller) HasSynced() bool { return informers.Synced(c.informers()...) }

// Run waits for the caches it reads to sync (the caller starts the informers), and runs
// the workers until ctx is done. Then it shuts the queues down and waits for every worker
// to finish the sync it is in: an in-flight sync carries on with a context that ctx's
// cancellation does not reach, so that the writes of one sync are not cut in half (callers
// bound the wait, see shim.Run). It returns an error if the caches did not sync before ctx
// was done.
func (c *Controller) Run(ctx context.Context) error {
	defer utilruntime.HandleCrash()
	logger := klog.FromContext(ctx)
	logger.Info("Starting the Job controller", "managedBy", c.cfg.ManagedBy, "workers", c.cfg.Workers)
	defer logger.Info("Shut down the Job controller")
	return queue.Serve(ctx, c.cfg.Workers, func() error {
		if !informers.WaitForCacheSync(ctx, c.informers()...) {
			return fmt.Errorf("the Job and Pod caches did not sync: %w", context.Cause(ctx))
		}
		return nil
	},
		queue.Worker{Queue: c.queue, Handle: c.sync, What: "Syncing the Job", Kind: "job"},
		queue.Worker{Queue: c.orphanQueue, Handle: c.syncOrphanPod, What: "Removing the tracking finalizer of an orphan pod", Kind: "pod"},
		queue.Worker{Queue: c.strayQueue, Handle: c.syncStrayPod, What: "Looking at a pod that left the pod cache", Kind: "pod"})
}

// ours reports whether the controller manages job (S1).
func (c *Controller) ours(job *batchv1.Job) bool {
	return informers.IsManagedBy(job, c.cfg.ManagedBy)
}

// jobFinished reports whether job has a Complete or Failed condition that is True.
func jobFinished(job *batchv1.Job) bool {
	for _, c := range job.Status.Conditions {
		if (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// hasTrackingFinalizer reports whether pod carries batch.kubernetes.io/job-tracking.
func hasTrackingFinalizer(pod *corev1.Pod) bool {
	for _, f := range pod.Finalizers {
		if f == conditions.JobTrackingFinalizer {
			return true
		}
	}
	return false
}

// keyOf is the queue key of a Job.
func keyOf(job *batchv1.Job) string {
	return cache.MetaObjectToName(job).String()
}

// completionMode is the completion_mode metric label of job.
func completionMode(job *batchv1.Job) string {
	if job.Spec.CompletionMode != nil && *job.Spec.CompletionMode == batchv1.IndexedCompletion {
		return string(batchv1.IndexedCompletion)
	}
	return string(batchv1.NonIndexedCompletion)
}

// backoffLimitLabel is the backoff_limit metric label of job.
func backoffLimitLabel(job *batchv1.Job) string {
	if job.Spec.BackoffLimitPerIndex != nil {
		return metrics.BackoffLimitPerIndex
	}
	return metrics.BackoffLimitGlobal
}
