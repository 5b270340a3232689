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
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"

	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/jobsync"
	"github.com/coroner-dev/coroner/shim/metrics"
	"github.com/coroner-dev/coroner/shim/observe"
)

// Carrying out a Plan: the writes of one sync, in the order jobsync documents.

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

// budgetVerdictPatch removes the tracking finalizer of a failed pod and writes on it what
// its Job's disruption budget did with its failure (jobsync.Plan.BudgetVerdicts), in one
// write. Such a pod stays in the pod cache (jobsync.LeavesCache): it is not labelled
// counted.
func budgetVerdictPatch(verdict string) []byte {
	return mustJSON(map[string]any{
		"metadata": map[string]any{
			"annotations":                         map[string]string{v1alpha1.AnnotationBudgetVerdict: verdict},
			"$deleteFromPrimitiveList/finalizers": []string{conditions.JobTrackingFinalizer},
		},
	})
}

// execute carries out the plan of a sync of job (key) in the order jobsync documents:
//
//  0. the JobRecord entries of the pods that leave the Job in this plan, stored before any
//     of them goes (jobrecord.go). The write runs beside the creations and the status
//     write, which take no pod away: deletions (1.) and finalizer removals (3.) wait for
//     it. When it failed in a way a retry may mend, no pod goes: before deletions the sync
//     stops; before finalizer removals it ends as if they had failed (the next sync
//     records those pods again and removes their finalizers). When it cannot succeed (the
//     namespace is being deleted, RBAC or the CRD missing, the JobRecord refused), the Job
//     goes on without it: the JobRecord is for explain, and a Job must never stall for it
//     (explain then says its story is incomplete);
//  1. pod deletions, then creations (managePods);
//  2. the plan's status write (writeStatus);
//  3. only now, the tracking finalizers of the pods the status accounts for, once the
//     JobRecord holds their entries, then a second status write that counts those whose
//     removal succeeded (countRemoved);
//  4. Events, metrics, the backoff, the next sync (afterWrites).
func (c *Controller) execute(ctx context.Context, key string, job *batchv1.Job, plan jobsync.Plan) error {
	rec := c.startRecordWrite(ctx, key, job, plan.Leaving)
	defer rec.wait() // no write outlives its sync
	if len(plan.Delete) > 0 {
		if err := rec.settle(); err != nil {
			return err
		}
	}
	manageErr := c.managePods(ctx, key, job, &plan)
	written := job // the Job as the API server holds it after step 2
	if plan.WriteStatus {
		updated, retry, err := c.writeStatus(ctx, key, job, plan.Status)
		if err != nil {
			return errors.Join(manageErr, err)
		}
		if retry {
			return manageErr
		}
		written = updated
	}
	finalizerErr := rec.settle()
	var countErr error
	if finalizerErr == nil {
		var removed sets.Set[types.UID]
		removed, finalizerErr = c.removeFinalizers(ctx, key, job, plan.RemoveFinalizer, plan.BudgetVerdicts)
		countErr = c.countRemoved(ctx, key, written, removed)
	}
	c.afterWrites(ctx, key, job, plan)
	return errors.Join(manageErr, finalizerErr, countErr)
}

// countRemoved counts the pods whose tracking finalizer removal succeeded (removed) in the
// status of written, the Job as step 2 left it: step 3's second write (jobsync's order),
// so that they are counted in this sync, not in the next one. A conflict leaves them to
// the next sync, which counts them too.
func (c *Controller) countRemoved(ctx context.Context, key string, written *batchv1.Job, removed sets.Set[types.UID]) error {
	if removed.Len() == 0 || written.Status.UncountedTerminatedPods == nil {
		return nil
	}
	status := written.Status.DeepCopy()
	if !jobsync.CountRemoved(status, removed) {
		return nil
	}
	_, _, err := c.writeStatus(ctx, key, written, *status)
	return err
}

// managePods deletes, then creates, the pods of the plan, and corrects the planned status
// for the writes that failed. A pod whose deletion an earlier sync issued and the
// informer has not shown yet is not deleted again (a sync that follows a failure decision
// at once can see it still active); it stays expected.
func (c *Controller) managePods(ctx context.Context, key string, job *batchv1.Job, plan *jobsync.Plan) error {
	if len(plan.Delete) == 0 && len(plan.Create) == 0 {
		return nil
	}
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
	failedDeletes, deleteErr := c.deletePods(ctx, key, job, plan.Delete)
	failedCreates, createErr := c.createPods(ctx, key, job, plan.Create)
	if failedCreates > 0 || len(failedDeletes) > 0 {
		klog.FromContext(ctx).V(2).Info("Correcting the planned status for failed pod writes", "failedCreates", failedCreates, "failedDeletes", len(failedDeletes))
		plan.Adjust(&job.Status, failedCreates, failedDeletes)
	}
	return errors.Join(deleteErr, createErr)
}

// writeStatus writes status as the status of job (key) and returns the Job the API server
// answered. On a conflict it asks for the Job to be synced again, and returns retry: the
// informer is behind, and the sync must end there, its finalizers staying, as step 3
// requires.
func (c *Controller) writeStatus(ctx context.Context, key string, job *batchv1.Job, status batchv1.JobStatus) (written *batchv1.Job, retry bool, err error) {
	logger := klog.FromContext(ctx)
	updated := job.DeepCopy()
	updated.Status = status
	written, err = c.client.BatchV1().Jobs(job.Namespace).UpdateStatus(ctx, updated, metav1.UpdateOptions{})
	if err != nil {
		if apierrors.IsConflict(err) {
			// The update event of the newer Job re-queues it; the AddAfter is a backstop.
			logger.V(2).Info("Conflict writing the Job status; will sync again", "resourceVersion", job.ResourceVersion)
			c.queue.AddAfter(key, c.cfg.BatchPeriod)
			return nil, true, nil
		}
		return nil, false, fmt.Errorf("writing the status of Job %s: %w", key, err)
	}
	c.state.statusWritten(key, job.ResourceVersion)
	logger.V(4).Info("Wrote the Job status", "active", status.Active, "succeeded", status.Succeeded, "failed", status.Failed)
	return written, false, nil
}

// afterWrites emits the plan's Events, records its metrics, keeps its backoff and
// schedules the next sync it asks for.
func (c *Controller) afterWrites(ctx context.Context, key string, job *batchv1.Job, plan jobsync.Plan) {
	c.emit(job, plan.Events)
	c.metrics.Record(plan.Observations, completionMode(job), backoffLimitLabel(job))
	if plan.Observations.JobFinished != nil {
		c.jobRecords.forget(key) // read again should a pod be left over
	}
	c.state.setRetries(job, plan.Retries)
	if plan.RequeueAfter > 0 {
		klog.FromContext(ctx).V(4).Info("Syncing the Job again later", "after", plan.RequeueAfter)
		c.queue.AddAfter(key, plan.RequeueAfter)
	}
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
		created     = map[observe.CreateReason]int{}
		failed      = map[observe.CreateReason]int{}
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
func (c *Controller) removeFinalizers(ctx context.Context, key string, job *batchv1.Job, pods []*corev1.Pod, verdicts map[types.UID]string) (removed sets.Set[types.UID], _ error) {
	removed = sets.New[types.UID]()
	if len(pods) == 0 {
		return removed, nil
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
			if v, ok := verdicts[p.UID]; ok {
				patch = budgetVerdictPatch(v)
			} else if jobsync.LeavesCache(job, p) {
				patch = countedPatch
			}
			err := c.patchPod(ctx, p, patch)
			if err == nil {
				logger.V(4).Info("Removed the tracking finalizer", "pod", klog.KObj(p))
			} else {
				c.expectations.finalizerRemovalObserved(key, p.UID)
			}
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil, apierrors.IsNotFound(err):
				removed.Insert(p.UID)
			default:
				errs = append(errs, fmt.Errorf("removing the tracking finalizer of pod %s: %w", klog.KObj(p), err))
			}
		})
	}
	wg.Wait()
	return removed, errors.Join(errs...)
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
	given, ok := pod.Annotations[v1alpha1.AnnotationMemoryGiven]
	if !ok || (!apierrors.IsForbidden(err) && !apierrors.IsInvalid(err)) {
		return
	}
	ix := -1
	if v, ok := pod.Annotations[batchv1.JobCompletionIndexAnnotation]; ok {
		if n, perr := strconv.Atoi(v); perr == nil {
			ix = n
		}
	}
	if seen := c.state.refuseMemory(key, ix, err.Error()); !seen {
		who := "the Job's next pod"
		if ix >= 0 {
			who = fmt.Sprintf("index %d", ix)
		}
		c.recorder.Eventf(job, corev1.EventTypeWarning, jobsync.EventReasonMemoryRefused,
			"%s: the pod with more memory (%s) was refused: %v; its failure counts as without %s", who, given, err, v1alpha1.AnnotationOOMMemoryRetry)
	}
}
