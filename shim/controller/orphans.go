package controller

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/informers"
)

// Orphan pods.
//
// The tracking finalizer of a pod is removed by the sync of its Job, including, for a
// finished Job, any left over (jobsync returns them in Plan.RemoveFinalizer). What the
// sync cannot reach are pods whose Job is gone: deleted with its pods still carrying the
// finalizer, or deleted with propagationPolicy Orphan, which leaves pods without a
// controller reference. Nobody would ever remove their finalizer, so the pods would never
// go away. Like the built-in controller's orphan handling, the pod handlers put such
// pods (with the finalizer) on a separate queue, and syncOrphanPod removes the finalizer
// once the API server confirms the Job is gone; this is idempotent, so it does not matter
// that the built-in controller may do the same for the same pod. A pod whose controller
// is a Job managed by someone else that still exists is never touched.
//
// The Job lister alone is not trusted with "gone": the Pod and Job informers are separate
// watches, and a pod may reach this controller before its new Job does. syncOrphanPod
// asks the API server (one GET per such pod) unless this process saw the Job's delete
// event; Job UIDs are never reused, so that answer never goes stale.

// syncOrphanPod removes the tracking finalizer of the pod with the given key when it has
// no controller or its controlling Job is gone.
func (c *Controller) syncOrphanPod(ctx context.Context, key string) error {
	logger := klog.FromContext(ctx)
	pod, err := informers.PodByKey(c.podLister, key)
	if pod == nil || err != nil {
		return err
	}
	if !hasTrackingFinalizer(pod) {
		return nil
	}
	if ref := metav1.GetControllerOf(pod); ref != nil {
		if informers.JobControllerRef(pod) == nil {
			return nil // controlled by something other than a Job
		}
		gone, err := c.jobGone(ctx, pod.Namespace, ref.Name, ref.UID)
		if err != nil {
			return err
		}
		if !gone {
			// Its Job exists: its own controller (this one, through the Job's sync, or
			// another) is in charge.
			return nil
		}
	}
	// On the version this decision was made from: a Job may have adopted the pod since
	// (claim.go), and the finalizer it gave the pod must stay. A newer version comes
	// with its own update event, which enqueues the pod again if it is still an orphan.
	if removed, err := c.removeOrphanFinalizer(ctx, pod); err != nil || !removed {
		return err
	}
	logger.V(2).Info("Removed the tracking finalizer of a pod whose Job is gone", "pod", klog.KObj(pod))
	return nil
}

// removeOrphanFinalizer removes the tracking finalizer of the orphan pod, on its version
// pod.ResourceVersion only. removed is false when the pod changed since (a newer version
// is looked at on its own) or is gone, neither of which is an error.
func (c *Controller) removeOrphanFinalizer(ctx context.Context, pod *corev1.Pod) (removed bool, err error) {
	err = c.patchPodNamed(ctx, pod.Namespace, pod.Name, removeTrackingFinalizerAtPatch(pod.ResourceVersion))
	switch {
	case err == nil:
		return true, nil
	case apierrors.IsConflict(err):
		klog.FromContext(ctx).V(4).Info("The orphan pod changed since it was read; looking again at its next version", "pod", klog.KObj(pod))
		return false, nil
	case apierrors.IsNotFound(err):
		return false, nil
	}
	return false, fmt.Errorf("removing the tracking finalizer of orphan pod %s: %w", klog.KObj(pod), err)
}

// removeTrackingFinalizerAtPatch is removeTrackingFinalizerPatch on the pod's version
// resourceVersion only (a conflict otherwise).
func removeTrackingFinalizerAtPatch(resourceVersion string) []byte {
	return mustJSON(map[string]any{
		"metadata": map[string]any{
			"resourceVersion":                     resourceVersion,
			"$deleteFromPrimitiveList/finalizers": []string{conditions.JobTrackingFinalizer},
		},
	})
}

// jobGone reports whether the Job ns/name with the given UID no longer exists: this
// process saw its delete event, or it is not in the lister and the API server does not
// have it either (or has another Job of that name).
func (c *Controller) jobGone(ctx context.Context, ns, name string, uid types.UID) (bool, error) {
	if job, err := c.jobLister.Jobs(ns).Get(name); err == nil && job.UID == uid {
		return false, nil
	}
	if c.state.seenDeleted(ns, name, uid) {
		return true, nil
	}
	job, err := c.client.BatchV1().Jobs(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("checking whether Job %s/%s still exists: %w", ns, name, err)
	}
	return job.UID != uid, nil
}

func (c *Controller) enqueueOrphan(pod *corev1.Pod) {
	c.orphanQueue.Add(cache.MetaObjectToName(pod).String())
}
