package controller

import (
	"fmt"
	"reflect"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/coroner-dev/coroner/shim/backoff"
	"github.com/coroner-dev/coroner/shim/informers"
	"github.com/coroner-dev/coroner/shim/metrics"
	"github.com/coroner-dev/coroner/shim/policy"
)

// Event handlers. They only read the informer objects, observe expectations and enqueue
// keys: Job events enqueue the Job (at once for a new Job or a spec change, after the
// batch period for a status-only update), pod events enqueue the pod's Job after the
// batch period, so that a burst of pod events makes one sync. One exception: a pod that
// just failed and matches a FailJob or FailIndex rule of its Job's podFailurePolicy
// enqueues the Job at once, and for one batch period after that the Job's other events
// do too (enqueueBatched), so that the pods the decision stops are deleted, and the
// FailureTarget written, without waiting for the batching (the built-in controller
// batches these events too; what it decides is the same). Two more syncs are not
// batched: the one that follows the last tracking finalizer removal of a sync the
// informer shows, and one that waited for the informer to show our status write
// (jobStates.caughtUp). Only Jobs
// managed by Config.ManagedBy are enqueued. Pods whose Job is gone go to the orphan
// queue; a pod with no controller at all also enqueues the managed Jobs whose selector
// matches it, which may adopt it (claim.go).

// addHandlers registers the event handlers on the informers.
func (c *Controller) addHandlers() {
	if _, err := c.inf.Jobs.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.addJob,
		UpdateFunc: c.updateJob,
		DeleteFunc: c.deleteJob,
	}); err != nil {
		panic(fmt.Sprintf("adding the Job event handler: %v", err))
	}
	if _, err := c.inf.Pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.addPod,
		UpdateFunc: c.updatePod,
		DeleteFunc: c.deletePod,
	}); err != nil {
		panic(fmt.Sprintf("adding the Pod event handler: %v", err))
	}
}

func (c *Controller) addJob(obj any) {
	job, ok := obj.(*batchv1.Job)
	if !ok {
		return
	}
	c.trackManaged(job, false)
	if !c.ours(job) {
		return
	}
	c.logger.V(4).Info("Job added", "job", klog.KObj(job))
	c.queue.Add(keyOf(job))
}

func (c *Controller) updateJob(old, cur any) {
	oldJob, ok1 := old.(*batchv1.Job)
	curJob, ok2 := cur.(*batchv1.Job)
	if !ok1 || !ok2 {
		return
	}
	c.trackManaged(curJob, false)
	if !c.ours(curJob) {
		return
	}
	if jobFinished(curJob) {
		c.state.setRetries(curJob, backoff.Record{})
	}
	key := keyOf(curJob)
	if curJob.Generation != oldJob.Generation {
		c.logger.V(4).Info("Job spec changed", "job", key)
		c.queue.Add(key)
		return
	}
	if c.state.caughtUp(key, curJob.ResourceVersion) {
		// A sync was skipped because the informer did not show our status write yet
		// (staleCache); it shows it now: that sync is carried out at once, not batched.
		c.queue.Add(key)
		return
	}
	c.enqueueBatched(key)
}

func (c *Controller) deleteJob(obj any) {
	job, ok := obj.(*batchv1.Job)
	if !ok {
		tombstone, ok := obj.(cache.DeletedFinalStateUnknown)
		if !ok {
			return
		}
		if job, ok = tombstone.Obj.(*batchv1.Job); !ok {
			return
		}
	}
	c.trackManaged(job, true)
	c.state.jobDeleted(job, c.clock.Now())
	if !c.ours(job) {
		return
	}
	key := keyOf(job)
	c.logger.V(4).Info("Job deleted", "job", key, "uid", job.UID)
	c.expectations.forget(key)
	c.state.forgetDeletedManaged(job)
	c.queue.Add(key)
	// Its pods that still carry the tracking finalizer would never go away.
	objs, _ := c.podIndexer.ByIndex(informers.ControllerUIDIndex, string(job.UID))
	for _, o := range objs {
		if pod, ok := o.(*corev1.Pod); ok && hasTrackingFinalizer(pod) {
			c.enqueueOrphan(pod)
		}
	}
}

// trackManaged keeps the set of managed, unfinished Jobs behind the coroner_managed_jobs
// gauge.
func (c *Controller) trackManaged(job *batchv1.Job, deleted bool) {
	if n, changed := c.state.setManaged(keyOf(job), !deleted && c.ours(job) && !jobFinished(job)); changed {
		c.metrics.ManagedJobs.Set(float64(n))
	}
}

func (c *Controller) addPod(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	c.trackFinishedWithFinalizer(pod, false)
	if pod.DeletionTimestamp != nil {
		// A pod seen for the first time already being deleted (after a restart, or a
		// relist) is no creation to observe.
		c.podDeleted(pod, false)
		return
	}
	job, orphan := c.jobOf(pod)
	if orphan {
		if hasTrackingFinalizer(pod) {
			c.enqueueOrphan(pod)
		}
		c.enqueueAdopters(pod)
		return
	}
	if job == nil {
		return
	}
	key := keyOf(job)
	c.expectations.creationObserved(key)
	c.expectations.strayResolved(key, pod.UID) // a stray labelled again (strays.go)
	c.enqueueBatched(key)
}

func (c *Controller) updatePod(old, cur any) {
	oldPod, ok1 := old.(*corev1.Pod)
	curPod, ok2 := cur.(*corev1.Pod)
	if !ok1 || !ok2 {
		return
	}
	c.trackFinishedWithFinalizer(curPod, false)
	if curPod.ResourceVersion == oldPod.ResourceVersion {
		return // a resync; nothing changed
	}
	if curPod.DeletionTimestamp != nil {
		// Being deleted: the Job may replace it now rather than when it is gone.
		c.podDeleted(curPod, false)
		return
	}
	finalizerGone := !hasTrackingFinalizer(curPod)
	if oldRef, curRef := metav1.GetControllerOf(oldPod), metav1.GetControllerOf(curPod); oldRef != nil && !reflect.DeepEqual(oldRef, curRef) {
		// The controller reference changed: the old Job must hear of it too.
		if job, _ := c.jobOf(oldPod); job != nil {
			key := keyOf(job)
			if finalizerGone {
				c.expectations.finalizerRemovalObserved(key, curPod.UID)
			}
			c.enqueueBatched(key)
		}
	}
	job, orphan := c.jobOf(curPod)
	if orphan {
		if !finalizerGone {
			c.enqueueOrphan(curPod)
		}
		c.enqueueAdopters(curPod)
		return
	}
	if job == nil {
		return
	}
	key := keyOf(job)
	if finalizerGone && c.expectations.finalizerRemovalObserved(key, curPod.UID) {
		// The last finalizer removal of the previous sync is seen: what it leads to
		// (the Job's end once no pod terminates, say) is decided now, not batched.
		c.queue.Add(key)
		return
	}
	if failureDecision(job, oldPod, curPod) {
		// A FailJob or FailIndex rule matched a pod that just failed: the Job's (or the
		// index's) other pods are stopped by a sync now rather than after the batch
		// period, and so are the syncs this one leads to (see enqueueBatched).
		c.logger.V(4).Info("Pod failure decides the Job or its index; syncing at once", "job", key, "pod", klog.KObj(curPod))
		c.markUrgent(key)
		c.queue.Add(key)
		return
	}
	c.enqueueBatched(key)
}

func (c *Controller) deletePod(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		tombstone, ok := obj.(cache.DeletedFinalStateUnknown)
		if !ok {
			return
		}
		if pod, ok = tombstone.Obj.(*corev1.Pod); !ok {
			return
		}
	}
	c.trackFinishedWithFinalizer(pod, true)
	c.noteStray(pod)
	c.podDeleted(pod, true)
}

// podDeleted observes the deletion of pod (final: it is gone; otherwise it has a
// deletionTimestamp) and enqueues its Job.
func (c *Controller) podDeleted(pod *corev1.Pod, final bool) {
	job, orphan := c.jobOf(pod)
	if orphan {
		if !final && hasTrackingFinalizer(pod) {
			c.enqueueOrphan(pod)
		}
		return
	}
	if job == nil {
		return
	}
	key := keyOf(job)
	c.expectations.deletionObserved(key, pod.UID)
	if (final || !hasTrackingFinalizer(pod)) && c.expectations.finalizerRemovalObserved(key, pod.UID) {
		c.queue.Add(key) // as in updatePod: the uncounted pods can be counted now
		return
	}
	c.enqueueBatched(key)
}

// jobOf resolves the Job controlling pod in the Job lister. It returns the Job when this
// controller manages it; orphan is true when the pod has no controller at all, or its
// controlling Job is not in the lister (gone, or the informer is behind: the orphan path
// asks the API server before it acts). A pod controlled by anything else, or by a Job
// managed by someone else, gives (nil, false).
func (c *Controller) jobOf(pod *corev1.Pod) (job *batchv1.Job, orphan bool) {
	if metav1.GetControllerOf(pod) == nil {
		return nil, true
	}
	if informers.JobControllerRef(pod) == nil {
		return nil, false
	}
	job = c.inf.CachedJobOf(pod)
	if job == nil {
		return nil, true
	}
	if !c.ours(job) {
		return nil, false
	}
	return job, false
}

// trackFinishedWithFinalizer counts, for coroner_terminated_pods_tracking_finalizer_total,
// the terminated pods of managed Jobs that gain the tracking finalizer (add) and those
// that lose it or go away (delete). A pod is counted "delete" exactly when it was counted
// "add" by this process.
func (c *Controller) trackFinishedWithFinalizer(pod *corev1.Pod, gone bool) {
	is := !gone && hasTrackingFinalizer(pod) &&
		(pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed)
	was := c.state.finishedPod(pod.UID)
	switch {
	case is && !was:
		if job, _ := c.jobOf(pod); job == nil {
			return
		}
		c.state.setFinishedPod(pod.UID, true)
		c.metrics.TerminatedPodsTrackingFinalizer.WithLabelValues(metrics.EventAdd).Inc()
	case !is && was:
		c.state.setFinishedPod(pod.UID, false)
		c.metrics.TerminatedPodsTrackingFinalizer.WithLabelValues(metrics.EventDelete).Inc()
	}
}

// failureDecision reports whether cur, a pod of job, has just failed (it was not Failed
// in old) while still tracked, and matches a FailJob or FailIndex rule of the Job's
// podFailurePolicy: its failure ends the Job or its index, and the Job's sync should not
// wait for the batch period.
func failureDecision(job *batchv1.Job, old, cur *corev1.Pod) bool {
	if job.Spec.PodFailurePolicy == nil || cur.Status.Phase != corev1.PodFailed ||
		old.Status.Phase == corev1.PodFailed || !hasTrackingFinalizer(cur) {
		return false
	}
	switch policy.Match(job.Spec.PodFailurePolicy, cur).Action {
	case batchv1.PodFailurePolicyActionFailJob, batchv1.PodFailurePolicyActionFailIndex:
		return true
	}
	return false
}

// markUrgent makes the events of the Job with key sync it at once, not batched, for one
// batch period or until a sync carried out a plan with its expectations satisfied
// (jobStates.clearUrgent): the status write and pod deletions that a failure decision leads to are
// then acted on without delay, also when the first immediate sync found the cache behind.
func (c *Controller) markUrgent(key string) {
	c.state.markUrgent(key, c.clock.Now().Add(c.cfg.BatchPeriod))
}

// enqueueBatched enqueues the Job with key after the batch period, or at once while it
// is urgent (markUrgent).
func (c *Controller) enqueueBatched(key string) {
	if c.state.urgent(key, c.clock.Now()) {
		c.queue.Add(key)
		return
	}
	c.queue.AddAfter(key, c.cfg.BatchPeriod)
}
