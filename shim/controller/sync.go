package controller

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/backoff"
	"github.com/coroner-dev/coroner/shim/jobsync"
	"github.com/coroner-dev/coroner/shim/memretry"
	"github.com/coroner-dev/coroner/shim/metrics"
	"github.com/coroner-dev/coroner/shim/record"
)

// slowStartInitialBatchSize is the size of the first batch of pod creations; each
// successful batch doubles the next (the built-in controller's SlowStartInitialBatchSize).
const slowStartInitialBatchSize = 1

// removeTrackingFinalizerPatch is the strategic merge patch that removes the tracking
// finalizer and leaves any other finalizer alone, the built-in controller's.
var removeTrackingFinalizerPatch = mustJSON(map[string]any{
	"metadata": map[string]any{
		"$deleteFromPrimitiveList/finalizers": []string{conditions.JobTrackingFinalizer},
	},
})

// countedPatch removes the tracking finalizer of a counted pod that may leave the pod
// cache (jobsync.LeavesCache) and labels it conditions.CountedLabel in the same write,
// which the cache's selector excludes: no request more than the built-in controller's.
var countedPatch = mustJSON(map[string]any{
	"metadata": map[string]any{
		"labels":                              map[string]string{conditions.CountedLabel: "true"},
		"$deleteFromPrimitiveList/finalizers": []string{conditions.JobTrackingFinalizer},
	},
})

// sync syncs the Job with the given key: it asks jobsync.Sync for a Plan and carries it
// out in the order jobsync documents. An error re-queues the key with rate limiting.
func (c *Controller) sync(ctx context.Context, key string) (rErr error) {
	logger := klog.LoggerWithValues(klog.FromContext(ctx), "job", key)
	ctx = klog.NewContext(ctx, logger)
	start := c.clock.Now()

	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil || ns == "" || name == "" {
		logger.Error(err, "Dropping an invalid Job key")
		return nil
	}
	job, err := c.jobLister.Jobs(ns).Get(name)
	if apierrors.IsNotFound(err) {
		logger.V(4).Info("Job is gone; forgetting its expectations")
		c.expectations.forget(key)
		c.jobRecords.forget(key)
		c.mu.Lock()
		delete(c.memoryRefused, key)
		delete(c.written, key)
		c.mu.Unlock()
		return nil
	}
	if err != nil {
		return err
	}
	// Checked again here although only managed Jobs are enqueued: a key may be queued
	// for a Job that was then replaced by one with another managedBy.
	if !c.ours(job) {
		logger.V(4).Info("Not syncing a Job managed by someone else", "managedBy", job.Spec.ManagedBy)
		return nil
	}
	if c.staleCache(key, job) {
		logger.V(4).Info("Waiting for the informer to show the Job status written by the previous sync", "resourceVersion", job.ResourceVersion)
		return nil
	}

	if satisfiedNow := c.expectations.satisfied(key); satisfiedNow {
		// This sync acts on everything the informer shows: an urgent failure decision
		// (markUrgent) is carried out by it.
		c.clearUrgent(key)
	}

	action := metrics.ActionTracking
	defer func() {
		result := metrics.ResultSuccess
		if rErr != nil {
			result = metrics.ResultError
		}
		c.metrics.JobSyncDuration.WithLabelValues(completionMode(job), result, action).Observe(c.clock.Since(start).Seconds())
		logger.V(4).Info("Finished syncing the Job", "elapsed", c.clock.Since(start), "action", action, "result", result)
	}()

	// Expectations are read before the pods are listed, as upstream does: a pod that
	// shows up in between only defers work to the next sync.
	satisfied := c.expectations.satisfied(key)
	beingRemoved := c.expectations.finalizersBeingRemoved(key)
	// Adoptions and releases come first; when one fails the sync stops there, as the
	// built-in controller's does, and is retried: it would count the wrong pods.
	pods, err := c.claimPods(ctx, job)
	if err != nil {
		return err
	}
	c.mu.Lock()
	record := c.records[job.UID]
	c.mu.Unlock()

	plan := c.syncJob(jobsync.Input{
		Job:                    job,
		Pods:                   pods,
		Now:                    c.clock.Now(),
		Backoff:                c.cfg.Backoff,
		Record:                 record,
		ExpectationsSatisfied:  satisfied,
		FinalizersBeingRemoved: beingRemoved,
		MemoryRefused:          c.refusedMemory(key),
		VerdictWait:            c.cfg.OOMVerdictWait,
	})
	if plan.Skip != "" {
		logger.V(2).Info("Not syncing the Job", "why", plan.Skip)
		c.emit(job, plan.Events)
		return nil
	}
	switch {
	case len(plan.Delete) > 0:
		action = metrics.ActionPodsDeleted
	case len(plan.Create) > 0:
		action = metrics.ActionPodsCreated
	case !satisfied:
		action = metrics.ActionReconciling
	}
	logger.V(2).Info("Carrying out the plan", "pods", len(pods), "delete", len(plan.Delete), "create", len(plan.Create),
		"writeStatus", plan.WriteStatus, "removeFinalizer", len(plan.RemoveFinalizer), "requeueAfter", plan.RequeueAfter,
		"expectationsSatisfied", satisfied)

	// 0. The record of the pods that leave the Job in this plan, stored before any of
	// them goes (jobrecord.go). The write runs beside the creations and the status write,
	// which take no pod away: deletions (1.) and finalizer removals (3.) wait for it.
	// When it failed in a way a retry may mend, no pod goes: before deletions the sync
	// stops; before finalizer removals it ends as if they had failed (the next sync
	// records those pods again and removes their finalizers). When it cannot succeed
	// (the namespace is being deleted, RBAC or the CRD missing, the record refused), the
	// Job goes on without it: the record is for explain, and a Job must never stall for
	// it (explain then says its story is incomplete).
	rec := c.startRecordWrite(ctx, key, job, plan.Leaving)
	defer rec.wait() // no write outlives its sync
	if len(plan.Delete) > 0 {
		if err := rec.settle(); err != nil {
			return err
		}
	}

	// 1. Pod deletions, then creations. A pod whose deletion an earlier sync issued and
	// the informer has not shown yet is not deleted again (a sync that follows a failure
	// decision at once can see it still active); it stays expected.
	if len(plan.Delete) > 0 || len(plan.Create) > 0 {
		pending := c.expectations.pendingDeletions(key)
		uids := make([]types.UID, 0, len(plan.Delete)+pending.Len())
		dels := plan.Delete[:0:0]
		for _, d := range plan.Delete {
			if !pending.Has(d.Pod.UID) {
				dels = append(dels, d)
				uids = append(uids, d.Pod.UID)
			}
		}
		plan.Delete = dels
		c.expectations.expect(key, len(plan.Create), append(uids, pending.UnsortedList()...))
	}
	failedDeletes, deleteErr := c.deletePods(ctx, key, job, plan.Delete)
	failedCreates, createErr := c.createPods(ctx, key, job, plan.Create)
	if failedCreates > 0 || len(failedDeletes) > 0 {
		logger.V(2).Info("Correcting the planned status for failed pod writes", "failedCreates", failedCreates, "failedDeletes", len(failedDeletes))
		plan.Adjust(&job.Status, failedCreates, failedDeletes)
	}
	manageErr := errors.Join(deleteErr, createErr)

	// 2. One status write.
	if plan.WriteStatus {
		updated := job.DeepCopy()
		updated.Status = plan.Status
		if _, err := c.client.BatchV1().Jobs(ns).UpdateStatus(ctx, updated, metav1.UpdateOptions{}); err != nil {
			if apierrors.IsConflict(err) {
				// The informer is behind: the update event of the newer Job re-queues
				// it; the AddAfter is a backstop. Finalizers stay, as step 3 requires.
				logger.V(2).Info("Conflict writing the Job status; will sync again", "resourceVersion", job.ResourceVersion)
				c.queue.AddAfter(key, c.cfg.BatchPeriod)
				return manageErr
			}
			return errors.Join(manageErr, fmt.Errorf("writing the status of Job %s: %w", key, err))
		}
		c.mu.Lock()
		c.written[key] = job.ResourceVersion
		c.mu.Unlock()
		logger.V(4).Info("Wrote the Job status", "active", plan.Status.Active, "succeeded", plan.Status.Succeeded, "failed", plan.Status.Failed)
	}

	// 3. Only now: the tracking finalizers of the pods the status accounts for, once the
	// record holds their entries.
	finalizerErr := rec.settle()
	if finalizerErr == nil {
		finalizerErr = c.removeFinalizers(ctx, key, job, plan.RemoveFinalizer)
	}

	// 4. Events, metrics, the backoff record, the next sync.
	c.emit(job, plan.Events)
	c.metrics.Record(plan.Observations, completionMode(job), backoffLimitLabel(job))
	if plan.Observations.JobFinished != nil {
		c.jobRecords.forget(key) // read again should a pod be left over
	}
	c.mu.Lock()
	if plan.Record == (backoff.Record{}) {
		delete(c.records, job.UID)
	} else {
		c.records[job.UID] = plan.Record
	}
	c.mu.Unlock()
	if plan.RequeueAfter > 0 {
		logger.V(4).Info("Syncing the Job again later", "after", plan.RequeueAfter)
		c.queue.AddAfter(key, plan.RequeueAfter)
	}
	return errors.Join(manageErr, finalizerErr)
}

// recordWrite is a JobRecord write running beside the rest of a sync.
type recordWrite struct {
	done    chan struct{}
	err     error // set before done closes
	settled bool
	result  error
	logger  klog.Logger
	entries int
}

// startRecordWrite writes the entries to the Job's record in the background.
func (c *Controller) startRecordWrite(ctx context.Context, key string, job *batchv1.Job, entries []record.Entry) *recordWrite {
	w := &recordWrite{done: make(chan struct{}), logger: klog.FromContext(ctx), entries: len(entries)}
	if len(entries) == 0 {
		close(w.done)
		return w
	}
	go func() {
		defer close(w.done)
		w.err = c.jobRecords.write(ctx, key, job, entries)
	}()
	return w
}

func (w *recordWrite) wait() { <-w.done }

// settle waits for the write and returns the error that must stop the pods from going: a
// failure a retry may mend. Any other failure is logged, once, and let go.
func (w *recordWrite) settle() error {
	w.wait()
	if w.settled {
		return w.result
	}
	w.settled = true
	switch err := w.err; {
	case err == nil:
	case recordRetriable(err):
		w.result = err
	case apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause):
		w.logger.V(2).Info("Not recording the pods that leave the Job: its namespace is being deleted", "pods", w.entries)
	default:
		w.logger.Error(err, "Not recording the pods that leave the Job; going on without", "pods", w.entries)
	}
	return w.result
}

// staleCache reports whether the Job lister still shows the version our last status
// write replaced; when it shows another one, the memory of the write is dropped.
func (c *Controller) staleCache(key string, job *batchv1.Job) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	rv, ok := c.written[key]
	if !ok {
		return false
	}
	if rv == job.ResourceVersion {
		return true
	}
	delete(c.written, key)
	return false
}

// deletePods deletes the pods of the plan concurrently and returns those that were not
// deleted. A pod with RemoveFinalizerFirst loses its tracking finalizer first, so that it
// is not counted as failed. A pod already gone counts as deleted.
func (c *Controller) deletePods(ctx context.Context, key string, job *batchv1.Job, dels []jobsync.PodDelete) ([]*corev1.Pod, error) {
	if len(dels) == 0 {
		return nil, nil
	}
	logger := klog.FromContext(ctx)
	var (
		mu     sync.Mutex
		failed []*corev1.Pod
		errs   []error
		wg     sync.WaitGroup
	)
	for _, d := range dels {
		wg.Go(func() {
			err := c.deleteOne(ctx, d)
			if err == nil || apierrors.IsNotFound(err) {
				if err != nil {
					// Gone already: no event may come for it.
					c.expectations.deletionObserved(key, d.Pod.UID)
				}
				logger.V(2).Info("Deleted a pod", "pod", klog.KObj(d.Pod), "reason", d.Reason, "removeFinalizerFirst", d.RemoveFinalizerFirst)
				// Upstream's "Deleted pod: <name>", then the pod's last state: its exits
				// stay known once it is gone (coronerctl explain reads them back).
				c.recorder.Event(job, corev1.EventTypeNormal, conditions.EventReasonSuccessfulDelete, conditions.DeletedPodMessage(d.Pod, d.Reason))
				return
			}
			c.expectations.deletionObserved(key, d.Pod.UID)
			logger.V(2).Info("Failed to delete a pod", "pod", klog.KObj(d.Pod), "reason", d.Reason, "err", err)
			c.recorder.Eventf(job, corev1.EventTypeWarning, conditions.EventReasonFailedDelete, "Error deleting: %v", err)
			mu.Lock()
			failed = append(failed, d.Pod)
			errs = append(errs, fmt.Errorf("deleting pod %s: %w", klog.KObj(d.Pod), err))
			mu.Unlock()
		})
	}
	wg.Wait()
	return failed, errors.Join(errs...)
}

func (c *Controller) deleteOne(ctx context.Context, d jobsync.PodDelete) error {
	if d.RemoveFinalizerFirst && hasTrackingFinalizer(d.Pod) {
		if err := c.patchPod(ctx, d.Pod, removeTrackingFinalizerPatch); err != nil {
			return err
		}
	}
	return c.client.CoreV1().Pods(d.Pod.Namespace).Delete(ctx, d.Pod.Name, metav1.DeleteOptions{})
}

// createPods creates the pods of the plan in slow-start batches of 1, 2, 4, ... and
// returns how many were not created. After a batch with an error the remaining pods are
// not attempted (they are retried by a later sync); neither are they after the API
// server refused a creation because the namespace is terminating, which is not an error.
func (c *Controller) createPods(ctx context.Context, key string, job *batchv1.Job, creates []jobsync.PodCreate) (int, error) {
	if len(creates) == 0 {
		return 0, nil
	}
	logger := klog.FromContext(ctx)
	var (
		mu          sync.Mutex
		errs        []error
		created     = map[jobsync.CreateReason]int{}
		failed      = map[jobsync.CreateReason]int{}
		terminating atomic.Bool
		notCreated  int
	)
	remaining := creates
	for batch := min(slowStartInitialBatchSize, len(remaining)); len(remaining) > 0; batch = min(2*batch, len(remaining)) {
		var wg sync.WaitGroup
		errsBefore := len(errs)
		for _, pc := range remaining[:batch] {
			wg.Go(func() {
				pod, err := c.client.CoreV1().Pods(job.Namespace).Create(ctx, pc.Pod, metav1.CreateOptions{})
				mu.Lock()
				defer mu.Unlock()
				if err == nil {
					created[pc.Reason]++
					logger.V(4).Info("Created a pod", "pod", klog.KObj(pod), "reason", pc.Reason)
					c.recorder.Eventf(job, corev1.EventTypeNormal, conditions.EventReasonSuccessfulCreate, "Created pod: %v", pod.Name)
					return
				}
				// No pod will show up for this creation.
				c.expectations.creationObserved(key)
				notCreated++
				if apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
					terminating.Store(true)
					return
				}
				failed[pc.Reason]++
				c.noteRefusedMemory(key, job, pc.Pod, err)
				logger.V(2).Info("Failed to create a pod", "reason", pc.Reason, "err", err)
				c.recorder.Eventf(job, corev1.EventTypeWarning, conditions.EventReasonFailedCreate, "Error creating: %v", err)
				errs = append(errs, fmt.Errorf("creating a pod: %w", err))
			})
		}
		wg.Wait()
		remaining = remaining[batch:]
		if len(remaining) > 0 && (len(errs) > errsBefore || terminating.Load()) {
			logger.V(2).Info("Slow start: not creating the remaining pods after a failed batch", "skipped", len(remaining), "namespaceTerminating", terminating.Load())
			for range remaining {
				c.expectations.creationObserved(key)
			}
			notCreated += len(remaining)
			break
		}
	}
	for reason, n := range created {
		c.metrics.PodsCreated(reason, metrics.Succeeded, n)
	}
	for reason, n := range failed {
		c.metrics.PodsCreated(reason, metrics.Failed, n)
	}
	return notCreated, errors.Join(errs...)
}

// removeFinalizers removes the tracking finalizer of pods of job concurrently, and labels
// the pods that may leave the pod cache counted (countedPatch). Each removal is expected
// before it is issued; a failed one is forgotten again, as no update will come. A pod
// already gone is fine.
func (c *Controller) removeFinalizers(ctx context.Context, key string, job *batchv1.Job, pods []*corev1.Pod) error {
	if len(pods) == 0 {
		return nil
	}
	logger := klog.FromContext(ctx)
	uids := make([]types.UID, len(pods))
	for i, p := range pods {
		uids[i] = p.UID
	}
	c.expectations.expectFinalizersRemoved(key, uids)
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	for _, p := range pods {
		wg.Go(func() {
			patch := removeTrackingFinalizerPatch
			if jobsync.LeavesCache(job, p) {
				patch = countedPatch
			}
			err := c.patchPod(ctx, p, patch)
			if err == nil {
				logger.V(4).Info("Removed the tracking finalizer", "pod", klog.KObj(p))
				return
			}
			c.expectations.finalizerRemovalObserved(key, p.UID)
			if apierrors.IsNotFound(err) {
				return
			}
			mu.Lock()
			errs = append(errs, fmt.Errorf("removing the tracking finalizer of pod %s: %w", klog.KObj(p), err))
			mu.Unlock()
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// emit records the Events of a plan on the Job.
func (c *Controller) emit(job *batchv1.Job, events []jobsync.Event) {
	for _, e := range events {
		c.recorder.Event(job, e.Type, e.Reason, e.Message)
	}
}

// noteRefusedMemory remembers, when the API server refused a pod given more memory
// (coroner.dev/memory-given) because of a LimitRange or a ResourceQuota (403 Forbidden, or
// 422 Invalid), that its index must not grow again: the next sync counts the failure as
// without coroner.dev/oom-memory-retry. Said once, in a Warning Event.
func (c *Controller) noteRefusedMemory(key string, job *batchv1.Job, pod *corev1.Pod, err error) {
	given, ok := pod.Annotations[memretry.GivenAnnotation]
	if !ok || (!apierrors.IsForbidden(err) && !apierrors.IsInvalid(err)) {
		return
	}
	ix := -1
	if v, ok := pod.Annotations[batchv1.JobCompletionIndexAnnotation]; ok {
		if n, perr := strconv.Atoi(v); perr == nil {
			ix = n
		}
	}
	c.mu.Lock()
	if c.memoryRefused[key] == nil {
		c.memoryRefused[key] = map[int]string{}
	}
	_, seen := c.memoryRefused[key][ix]
	c.memoryRefused[key][ix] = err.Error()
	c.mu.Unlock()
	if !seen {
		who := "the Job's next pod"
		if ix >= 0 {
			who = fmt.Sprintf("index %d", ix)
		}
		c.recorder.Eventf(job, corev1.EventTypeWarning, jobsync.EventReasonMemoryRefused,
			"%s: the pod with more memory (%s) was refused: %v; its failure counts as without %s", who, given, err, memretry.Annotation)
	}
}

// refusedMemory is a copy of the Job's refused indexes (nil when none).
func (c *Controller) refusedMemory(key string) map[int]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.memoryRefused[key]) == 0 {
		return nil
	}
	out := make(map[int]string, len(c.memoryRefused[key]))
	for k, v := range c.memoryRefused[key] {
		out[k] = v
	}
	return out
}
