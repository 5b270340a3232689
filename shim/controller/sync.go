package controller

import (
	"context"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/coroner-dev/coroner/shim/jobsync"
	"github.com/coroner-dev/coroner/shim/metrics"
)

// sync syncs the Job with the given key: it asks jobsync.Sync for a Plan and carries it
// out (execute.go) in the order jobsync documents. An error re-queues the key with rate
// limiting.
func (c *Controller) sync(ctx context.Context, key string) (rErr error) {
	logger := klog.LoggerWithValues(klog.FromContext(ctx), "job", key)
	ctx = klog.NewContext(ctx, logger)
	start := c.clock.Now()
	job, err := c.jobToSync(ctx, key)
	if job == nil || err != nil {
		return err
	}
	if c.expectations.satisfied(key) {
		// This sync acts on everything the informer shows: an urgent failure decision
		// (markUrgent) is carried out by it.
		c.state.clearUrgent(key)
	}
	action := metrics.ActionTracking
	defer func() { c.observeSync(logger, job, start, action, rErr) }()

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
	plan := c.syncJob(c.syncInput(key, job, pods, satisfied, beingRemoved))
	if plan.Skip != "" {
		logger.V(2).Info("Not syncing the Job", "why", plan.Skip)
		c.emit(job, plan.Events)
		return nil
	}
	action = syncAction(plan, satisfied)
	logger.V(2).Info("Carrying out the plan", "pods", len(pods), "delete", len(plan.Delete), "create", len(plan.Create),
		"writeStatus", plan.WriteStatus, "removeFinalizer", len(plan.RemoveFinalizer), "requeueAfter", plan.RequeueAfter,
		"expectationsSatisfied", satisfied)
	return c.execute(ctx, key, job, plan)
}

// jobToSync returns the Job with key from the lister when this controller is to sync it
// now, nil otherwise: the key is invalid, the Job is gone (what was kept of it is
// forgotten), managed by someone else, or the lister does not show our last status write
// yet.
func (c *Controller) jobToSync(ctx context.Context, key string) (*batchv1.Job, error) {
	logger := klog.FromContext(ctx)
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil || ns == "" || name == "" {
		logger.Error(err, "Dropping an invalid Job key")
		return nil, nil
	}
	job, err := c.jobLister.Jobs(ns).Get(name)
	if apierrors.IsNotFound(err) {
		logger.V(4).Info("Job is gone; forgetting its expectations")
		c.expectations.forget(key)
		c.jobRecords.forget(key)
		c.state.jobGone(key)
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	// Checked again here although only managed Jobs are enqueued: a key may be queued
	// for a Job that was then replaced by one with another managedBy.
	if !c.ours(job) {
		logger.V(4).Info("Not syncing a Job managed by someone else", "managedBy", job.Spec.ManagedBy)
		return nil, nil
	}
	if c.state.staleCache(key, job) {
		logger.V(4).Info("Waiting for the informer to show the Job status written by the previous sync", "resourceVersion", job.ResourceVersion)
		return nil, nil
	}
	return job, nil
}

// syncInput is what jobsync.Sync decides from for the Job with key.
func (c *Controller) syncInput(key string, job *batchv1.Job, pods []*corev1.Pod, satisfied bool, beingRemoved sets.Set[types.UID]) jobsync.Input {
	retries, _ := c.state.retries(job)
	return jobsync.Input{
		Job:                    job,
		Pods:                   pods,
		Now:                    c.clock.Now(),
		Backoff:                c.cfg.Backoff,
		Retries:                retries,
		ExpectationsSatisfied:  satisfied,
		FinalizersBeingRemoved: beingRemoved,
		MemoryRefused:          c.state.refusedMemory(key),
		VerdictWait:            c.cfg.OOMVerdictWait,
		DeviceVerdictWait:      c.cfg.DeviceVerdictWait,
		DefaultAvoidance:       c.cfg.DefaultAvoidance,
	}
}

// syncAction is the action label of the sync that carries out plan.
func syncAction(plan jobsync.Plan, satisfied bool) string {
	switch {
	case len(plan.Delete) > 0:
		return metrics.ActionPodsDeleted
	case len(plan.Create) > 0:
		return metrics.ActionPodsCreated
	case !satisfied:
		return metrics.ActionReconciling
	}
	return metrics.ActionTracking
}

// observeSync measures a sync of job that began at start.
func (c *Controller) observeSync(logger klog.Logger, job *batchv1.Job, start time.Time, action string, err error) {
	result := metrics.ResultSuccess
	if err != nil {
		result = metrics.ResultError
	}
	c.metrics.JobSyncDuration.WithLabelValues(completionMode(job), result, action).Observe(c.clock.Since(start).Seconds())
	logger.V(4).Info("Finished syncing the Job", "elapsed", c.clock.Since(start), "action", action, "result", result)
}
