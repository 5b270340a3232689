// Package controller is coroner's Job controller: it watches Jobs and their pods with
// shared informers, and for every Job whose spec.managedBy is its name (S1) carries out
// the Plan that the pure package shim/jobsync decides, in the order that package
// documents (pod deletions and creations, one status write, finalizer removals, then
// Events, metrics and the backoff record).
//
// Jobs managed by anyone else are never synced and never written; neither are their pods,
// with two exceptions. One is shared with the built-in Job controller: a pod that still
// carries the batch.kubernetes.io/job-tracking finalizer although the Job that controlled it
// is gone (or it lost its controller reference) gets the finalizer removed, whoever managed
// the Job, because nobody else would (see orphans.go). The other is node-failure recovery
// of pods whose owner opted them in by annotation (Z1, Z2; Config.RecoverPods, see
// recovery.go).
package controller

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	batchlisters "k8s.io/client-go/listers/batch/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/backoff"
	"github.com/coroner-dev/coroner/shim/jobsync"
	"github.com/coroner-dev/coroner/shim/metrics"
	"github.com/coroner-dev/coroner/shim/recovery"
)

// Defaults of Config.
const (
	DefaultBatchPeriod = time.Second
	DefaultWorkers     = 5
	// Component is the Event source of the recorder New builds.
	Component = "coroner-shim"
)

// Retry backoff of a key whose sync failed (the built-in controller's DefaultJobApiBackOff
// and MaxJobApiBackOff).
const (
	retryBase = time.Second
	retryMax  = time.Minute
)

// controllerUIDIndex indexes pods by the UID of their controller (a batch/v1 Job).
const controllerUIDIndex = "coroner.dev/controller-uid"

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
	// Records is where the pods' stories go for coronerctl explain (jobrecord.go); a nil
	// Client keeps none.
	Records RecordsConfig
	// Workers is the number of Jobs synced concurrently; default 5.
	Workers int
	// Clock is the controller's clock; default clock.RealClock{}.
	Clock clock.WithTicker
	// Metrics receives the controller's metrics; nil means a private registry.
	Metrics *metrics.Metrics
	// Recorder emits Events on Jobs; nil means one built from the client, with
	// source component "coroner-shim".
	Recorder record.EventRecorder
	// Recovery holds the times of node-failure recovery (Z1-Z4); zero fields take the
	// package recovery's defaults.
	Recovery recovery.Config
	// AgentNamespace is where coroner-agent's fencing Leases are; default
	// "coroner-system".
	AgentNamespace string
	// RecoverPods says whose pods node-failure recovery covers: RecoverAll (the default)
	// every opted-in pod, as Kueue does, RecoverManaged only the pods of managed Jobs.
	RecoverPods RecoverScope
	// RecoveryNamespace limits the recovery of pods that are not of managed Jobs to one
	// namespace; "" (the shim's) is every namespace. Tests that run controllers side by
	// side on one API server set it.
	RecoveryNamespace string
}

// RecoverScope is Config.RecoverPods.
type RecoverScope string

// Values of RecoverScope.
const (
	// RecoverAll recovers every opted-in pod (Z1, Z2), whoever owns it, and every case
	// (Z1-Z4) for the pods of managed Jobs.
	RecoverAll RecoverScope = "all"
	// RecoverManaged recovers only the pods of managed Jobs.
	RecoverManaged RecoverScope = "managed"
)

// Controller syncs the Jobs managed by Config.ManagedBy. Create it with New.
type Controller struct {
	client kubernetes.Interface
	cfg    Config
	// logger is for the event handlers, which have no context; Run sets it from its
	// context before the informers start.
	logger   klog.Logger
	clock    clock.WithTicker
	metrics  *metrics.Metrics
	recorder record.EventRecorder
	// broadcaster is set when New built the recorder; Run starts and stops it.
	broadcaster record.EventBroadcaster

	jobFactory, podFactory informers.SharedInformerFactory
	jobInformer            cache.SharedIndexInformer
	podInformer            cache.SharedIndexInformer
	jobLister              batchlisters.JobLister
	podLister              corelisters.PodLister
	podIndexer             cache.Indexer
	recoveryListers
	// patcher writes pod status (recovery).
	patcher conditions.PodPatcher

	// queue holds Job keys (namespace/name) to sync; orphanQueue holds pod keys whose
	// tracking finalizer may have to go because their Job is gone.
	queue       workqueue.TypedRateLimitingInterface[string]
	orphanQueue workqueue.TypedRateLimitingInterface[string]
	// recoveryQueue holds pod keys to check for node-failure recovery (recovery.go).
	recoveryQueue workqueue.TypedRateLimitingInterface[string]

	expectations *expectations

	mu sync.Mutex
	// jobRecords writes the Jobs' JobRecords (jobrecord.go); it has its own lock.
	jobRecords *records
	// records are the global backoff records of the Jobs, by Job UID.
	records map[types.UID]backoff.Record
	// written maps a Job key to the resourceVersion that our last status write replaced:
	// while the Job lister still shows that version, the informer has not caught up with
	// our write and a sync would decide from a stale status, so it waits for the Job's
	// update event (the built-in controller's finishedJobExpectations, generalised).
	written map[string]string
	// urgent maps the keys of Jobs whose events sync them at once rather than batched, to
	// until when (markUrgent).
	urgent map[string]time.Time
	// managed are the keys of the managed Jobs that are not finished (for the gauge).
	managed map[string]struct{}
	// finishedWithFinalizer are the UIDs of terminated pods of managed Jobs that were
	// counted by the coroner_terminated_pods_tracking_finalizer_total{event="add"}, so
	// that "delete" is counted for exactly those.
	finishedWithFinalizer map[types.UID]struct{}
	// deletedJobs are the UIDs of Jobs whose delete event this process saw, with when
	// (see jobGone).
	deletedJobs map[types.UID]time.Time
	// nodesMissing are the nodes the API server said do not exist, with when it first
	// said so (orphan quarantine, recovery.go).
	nodesMissing map[string]time.Time

	// syncJob is jobsync.Sync; tests replace it with a canned Plan.
	syncJob func(jobsync.Input) jobsync.Plan
}

// New builds a Controller for client. It registers the event handlers on its own
// informers; nothing runs until Run.
func New(client kubernetes.Interface, cfg Config) *Controller {
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
	if cfg.AgentNamespace == "" {
		cfg.AgentNamespace = "coroner-system"
	}
	if cfg.RecoverPods == "" {
		cfg.RecoverPods = RecoverAll
	}
	c := &Controller{
		client:                client,
		cfg:                   cfg,
		clock:                 cfg.Clock,
		metrics:               cfg.Metrics,
		recorder:              cfg.Recorder,
		expectations:          newExpectations(cfg.Clock),
		records:               map[types.UID]backoff.Record{},
		written:               map[string]string{},
		urgent:                map[string]time.Time{},
		managed:               map[string]struct{}{},
		finishedWithFinalizer: map[types.UID]struct{}{},
		deletedJobs:           map[types.UID]time.Time{},
		nodesMissing:          map[string]time.Time{},
		syncJob:               jobsync.Sync,
		logger:                klog.Background(),
		patcher:               conditions.NewPodPatcher(client, Component),
		jobRecords:            newRecords(cfg.Records, cfg.Metrics),
	}
	if c.recorder == nil {
		c.broadcaster = record.NewBroadcaster(record.WithCorrelatorOptions(eventCorrelation()))
		c.recorder = c.broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: Component})
	}
	c.queue = workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedItemExponentialFailureRateLimiter[string](retryBase, retryMax),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "coroner_job", Clock: cfg.Clock})
	c.orphanQueue = workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedItemExponentialFailureRateLimiter[string](retryBase, retryMax),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "coroner_orphan_pod", Clock: cfg.Clock})
	c.recoveryQueue = workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedItemExponentialFailureRateLimiter[string](retryBase, retryMax),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "coroner_recovery_pod", Clock: cfg.Clock})

	// Jobs: all of them (spec.managedBy cannot be selected on). Pods: only those that
	// carry a Job controller UID label, which every Job's pod has. Neither cache keeps
	// managedFields, which nothing here reads (kube-controller-manager drops them too):
	// they are about a third of a pod's memory. A status Update of a Job without them
	// leaves the stored managedFields as they are.
	c.jobFactory = informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTransform(stripManagedFields))
	c.podFactory = informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = batchv1.ControllerUidLabel }),
		informers.WithTransform(stripManagedFields))
	jobs := c.jobFactory.Batch().V1().Jobs()
	pods := c.podFactory.Core().V1().Pods()
	c.jobInformer, c.jobLister = jobs.Informer(), jobs.Lister()
	c.podInformer, c.podLister = pods.Informer(), pods.Lister()
	if err := c.podInformer.AddIndexers(cache.Indexers{controllerUIDIndex: indexByControllerUID, orphanUIDIndex: indexOrphanByUIDLabel}); err != nil {
		// Only fails once the informer has started, which it has not.
		panic(fmt.Sprintf("adding the pod index: %v", err))
	}
	c.podIndexer = c.podInformer.GetIndexer()

	if _, err := c.jobInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.addJob,
		UpdateFunc: c.updateJob,
		DeleteFunc: c.deleteJob,
	}); err != nil {
		panic(fmt.Sprintf("adding the Job event handler: %v", err))
	}
	if _, err := c.podInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.addPod,
		UpdateFunc: c.updatePod,
		DeleteFunc: c.deletePod,
	}); err != nil {
		panic(fmt.Sprintf("adding the Pod event handler: %v", err))
	}
	c.setupRecovery()
	return c
}

// stripManagedFields is the transform of the Job and pod informers: it drops
// metadata.managedFields from the object before it is cached. An informer's transform
// owns the object it is given.
func stripManagedFields(obj any) (any, error) {
	if m, ok := obj.(metav1.Object); ok && m.GetManagedFields() != nil {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

// indexByControllerUID is the pod index: the UID of the pod's controller when it is a
// batch/v1 Job.
func indexByControllerUID(obj any) ([]string, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return nil, nil
	}
	ref := jobControllerRef(pod)
	if ref == nil {
		return nil, nil
	}
	return []string{string(ref.UID)}, nil
}

// HasSynced reports whether the informers have synced (for /readyz).
func (c *Controller) HasSynced() bool {
	if !c.jobInformer.HasSynced() || !c.podInformer.HasSynced() {
		return false
	}
	for _, synced := range c.synced() {
		if !synced() {
			return false
		}
	}
	return true
}

// Run starts the informers, waits for their caches to sync, and runs the workers until
// ctx is done. Then it shuts the queues down and waits for every worker to finish the
// sync it is in: an in-flight sync carries on with a context that ctx's cancellation does
// not reach, so that the writes of one sync are not cut in half (callers bound the wait,
// see shim.Run). It returns an error if the caches did not sync before ctx was done.
func (c *Controller) Run(ctx context.Context) error {
	defer utilruntime.HandleCrash()
	logger := klog.FromContext(ctx)
	c.logger = logger
	if c.broadcaster != nil {
		c.broadcaster.StartStructuredLogging(3)
		c.broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: c.client.CoreV1().Events("")})
		defer c.broadcaster.Shutdown()
	}
	logger.Info("Starting the Job controller", "managedBy", c.cfg.ManagedBy, "workers", c.cfg.Workers)

	var wg sync.WaitGroup
	defer func() {
		logger.Info("Shutting down the Job controller")
		c.queue.ShutDown()
		c.orphanQueue.ShutDown()
		c.recoveryQueue.ShutDown()
		wg.Wait()
		c.jobFactory.Shutdown()
		c.podFactory.Shutdown()
		for _, f := range c.factories() {
			f.Shutdown()
		}
	}()

	c.jobFactory.Start(ctx.Done())
	c.podFactory.Start(ctx.Done())
	for _, f := range c.factories() {
		f.Start(ctx.Done())
	}
	if !cache.WaitForNamedCacheSyncWithContext(ctx, append([]cache.InformerSynced{c.jobInformer.HasSynced, c.podInformer.HasSynced}, c.synced()...)...) {
		return fmt.Errorf("the Job, Pod, Node and Lease caches did not sync: %w", context.Cause(ctx))
	}

	work := context.WithoutCancel(ctx)
	for range c.cfg.Workers {
		wg.Go(func() {
			for c.processNext(ctx, work) {
			}
		})
		wg.Go(func() {
			for c.processNextPod(ctx, work, c.orphanQueue, c.syncOrphanPod, "Removing the tracking finalizer of an orphan pod") {
			}
		})
	}
	wg.Go(func() {
		for c.processNextPod(ctx, work, c.recoveryQueue, c.recoverPod, "Recovering a pod from a node failure") {
		}
	})
	<-ctx.Done()
	return nil
}

// processNext syncs one Job key. It returns false when the queue is shut down or stop is
// done; the sync itself runs with work.
func (c *Controller) processNext(stop, work context.Context) bool {
	key, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(key)
	if stop.Err() != nil {
		return false
	}
	switch err := c.sync(work, key); err {
	case nil:
		c.queue.Forget(key)
	default:
		utilruntime.HandleErrorWithContext(work, err, "Syncing the Job failed; will retry", "job", key)
		c.queue.AddRateLimited(key)
	}
	return true
}

// processNextPod handles one pod key of a pod queue (orphans, recovery) with handle;
// what names the work in the error log.
func (c *Controller) processNextPod(stop, work context.Context, queue workqueue.TypedRateLimitingInterface[string], handle func(context.Context, string) error, what string) bool {
	key, quit := queue.Get()
	if quit {
		return false
	}
	defer queue.Done(key)
	if stop.Err() != nil {
		return false
	}
	if err := handle(work, key); err != nil {
		utilruntime.HandleErrorWithContext(work, err, what+" failed; will retry", "pod", key)
		queue.AddRateLimited(key)
		return true
	}
	queue.Forget(key)
	return true
}

// ours reports whether the controller manages job (S1).
func (c *Controller) ours(job *batchv1.Job) bool {
	return job != nil && job.Spec.ManagedBy != nil && *job.Spec.ManagedBy == c.cfg.ManagedBy
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

// jobControllerRef returns the pod's controller reference when it is a batch/v1 Job.
func jobControllerRef(pod *corev1.Pod) *metav1.OwnerReference {
	ref := metav1.GetControllerOf(pod)
	if ref == nil || ref.Kind != "Job" || ref.APIVersion != batchv1.SchemeGroupVersion.String() {
		return nil
	}
	return ref
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

// eventCorrelation is how the shim's Events are thinned, chosen for people now that
// explain reads the Jobs' records (jobrecord.go) rather than Events:
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
