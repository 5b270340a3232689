package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/informers"
	"github.com/coroner-dev/coroner/shim/jobsync"
)

// Claiming pods: adoption and release.
//
// A Job's pods are the pods its selector matches and that it controls, as for every
// built-in workload controller (a controller-ref manager): before each sync the shim
//   - adopts an orphan, a pod with no controller reference at all, that matches the
//     selector and is not being deleted, by giving it the Job's controller reference and
//     the tracking finalizer (the pod is then counted like one the Job made), and
//   - releases a pod it controls whose labels stopped matching the selector, by taking
//     the Job's reference and the tracking finalizer away (the pod is no longer counted;
//     the Job replaces it if it was active).
// A Job being deleted neither adopts nor releases. Before adopting, the Job is read from the
// API server (not the cache): a Job deleted and recreated under the same name must not
// adopt pods meant for its successor, and a Job being deleted must not take new pods.
//
// Where the candidates come from. The shim's pod informer holds the pods that carry the
// label coroner.dev/managed (conditions.ManagedPodLabel), which every pod the shim creates
// has; a Job's own pods are indexed by the UID of their controller, orphans by the value of
// their batch.kubernetes.io/controller-uid label. Every Job selector the API server
// generates is exactly that label, so an orphan matching a Job is in the orphan index under
// the Job's UID. So the orphans a Job adopts are pods the shim made (a Job deleted with
// propagationPolicy Orphan, a controller reference removed by hand); a pod made by
// someone else is adopted once it carries coroner.dev/managed too, and a Job with a manual
// selector (manualSelector: true) adopts only orphans that also carry its controller-uid
// label. That is a choice: such pods can be of any shape, and the shim does not watch every
// pod of the cluster to find them. A pod whose labels were changed so that it lost
// coroner.dev/managed (all its labels removed, say) leaves the informer: strays.go looks at
// it again, and releases it when it no longer matches its Job's selector.
//
// The decision (planClaims) is a pure function of the Job and the candidate pods; claimPods
// carries it out.

// claimPlan is what planClaims decided for the candidate pods of one Job.
type claimPlan struct {
	// Keep are the Job's pods: controlled by it and matching its selector.
	Keep []*corev1.Pod
	// Adopt are the orphans to adopt; Release the pods to let go.
	Adopt, Release []*corev1.Pod
}

// planClaims decides, for the pods the Job controls (owned: its controller reference has
// the Job's UID) and the orphans (no controller reference) that may match it, which pods
// are the Job's, which to adopt and which to release. selector is the Job's selector, nil
// when it has none or it does not parse: then nothing is adopted or released and the pods
// it controls stay its own.
func planClaims(job *batchv1.Job, selector labels.Selector, owned, orphans []*corev1.Pod) claimPlan {
	var p claimPlan
	deleting := job.DeletionTimestamp != nil
	for _, pod := range owned {
		switch {
		case selector == nil || selector.Matches(labels.Set(pod.Labels)):
			p.Keep = append(p.Keep, pod)
		case deleting:
			// Neither the Job's to count nor to release: the garbage collector is on it.
		default:
			p.Release = append(p.Release, pod)
		}
	}
	if selector == nil || deleting {
		return p
	}
	for _, pod := range orphans {
		if pod.DeletionTimestamp == nil && metav1.GetControllerOf(pod) == nil &&
			selector.Matches(labels.Set(pod.Labels)) {
			p.Adopt = append(p.Adopt, pod)
		}
	}
	return p
}

// jobSelector is the Job's selector, nil when it has none or it does not parse (the API
// server validates it, so neither happens to a stored Job).
func jobSelector(job *batchv1.Job) labels.Selector {
	if job.Spec.Selector == nil {
		return nil
	}
	sel, err := metav1.LabelSelectorAsSelector(job.Spec.Selector)
	if err != nil || sel.Empty() {
		return nil
	}
	return sel
}

// claimPods returns the Job's pods from the informers after adopting and releasing what
// planClaims says. A pod that could not be adopted is left out (a later sync tries again);
// one that could not be released stays out as well, as it no longer matches. Errors are
// returned with the pods, so that the sync goes on with what it has and is retried.
func (c *Controller) claimPods(ctx context.Context, job *batchv1.Job) ([]*corev1.Pod, error) {
	owned, err := c.podsByIndex(job.Namespace, informers.ControllerUIDIndex, string(job.UID))
	if err != nil {
		return nil, err
	}
	orphans, err := c.podsByIndex(job.Namespace, informers.OrphanUIDIndex, string(job.UID))
	if err != nil {
		return nil, err
	}
	plan := planClaims(job, jobSelector(job), owned, orphans)
	if len(plan.Release) == 0 && len(plan.Adopt) == 0 {
		return plan.Keep, nil
	}
	logger := klog.FromContext(ctx)
	pods := plan.Keep
	var errs []error
	for _, pod := range plan.Release {
		err := c.patchPod(ctx, pod, releasePatch(job, pod))
		switch {
		case err == nil:
			logger.V(2).Info("Released a pod whose labels no longer match the Job's selector", "pod", klog.KObj(pod))
			c.recorder.Eventf(job, corev1.EventTypeNormal, conditions.EventReasonReleased, conditions.ReleasedPodMessage, pod.Name)
		case apierrors.IsNotFound(err), apierrors.IsConflict(err):
			// Gone, or another pod of that name: nothing to release.
		default:
			errs = append(errs, fmt.Errorf("releasing pod %s: %w", klog.KObj(pod), err))
		}
	}
	if len(plan.Adopt) > 0 {
		if why, err := c.cannotAdopt(ctx, job); err != nil || why != "" {
			if why != "" {
				logger.V(2).Info("Not adopting orphan pods", "why", why, "orphans", len(plan.Adopt))
			}
			return pods, errors.Join(append(errs, err)...)
		}
	}
	for _, pod := range plan.Adopt {
		err := c.patchPod(ctx, pod, adoptPatch(job, pod))
		switch {
		case err == nil:
			logger.V(2).Info("Adopted an orphan pod that matches the Job's selector", "pod", klog.KObj(pod))
			c.recorder.Eventf(job, corev1.EventTypeNormal, conditions.EventReasonAdopted, conditions.AdoptedPodMessage, pod.Name)
			// Counted from now on as the Job's, as the informer will show it.
			adopted := pod.DeepCopy()
			adopted.OwnerReferences = append(adopted.OwnerReferences, jobsync.ControllerRef(job))
			if !hasTrackingFinalizer(adopted) {
				adopted.Finalizers = append(adopted.Finalizers, conditions.JobTrackingFinalizer)
			}
			pods = append(pods, adopted)
		case apierrors.IsNotFound(err), apierrors.IsConflict(err):
			// Gone or replaced; the next sync sees what is there.
		default:
			errs = append(errs, fmt.Errorf("adopting pod %s: %w", klog.KObj(pod), err))
		}
	}
	return pods, errors.Join(errs...)
}

// cannotAdopt reads the Job from the API server and says why it may not adopt pods (it is
// another Job now, or being deleted), "" when it may.
func (c *Controller) cannotAdopt(ctx context.Context, job *batchv1.Job) (string, error) {
	fresh, err := c.client.BatchV1().Jobs(job.Namespace).Get(ctx, job.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return "the Job is gone", nil
	case err != nil:
		return "", fmt.Errorf("reading Job %s before adopting pods: %w", keyOf(job), err)
	case fresh.UID != job.UID:
		return fmt.Sprintf("the Job was replaced (UID %s, cached %s)", fresh.UID, job.UID), nil
	case fresh.DeletionTimestamp != nil:
		return "the Job is being deleted", nil
	}
	return "", nil
}

// patchPod applies a strategic merge patch to pod.
func (c *Controller) patchPod(ctx context.Context, pod *corev1.Pod, patch []byte) error {
	return c.patchPodNamed(ctx, pod.Namespace, pod.Name, patch)
}

// patchPodNamed applies a strategic merge patch to the pod namespace/name, through
// Config.PodMetadata when set (the answer is then the pod's metadata alone).
func (c *Controller) patchPodNamed(ctx context.Context, namespace, name string, patch []byte) error {
	if c.cfg.PodMetadata != nil {
		_, err := c.cfg.PodMetadata.Resource(podsResource).Namespace(namespace).Patch(ctx, name, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
		return err
	}
	_, err := c.client.CoreV1().Pods(namespace).Patch(ctx, name, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
	return err
}

var podsResource = corev1.SchemeGroupVersion.WithResource("pods")

// adoptPatch adds the Job's controller reference and the tracking finalizer to pod. The
// pod's UID in the patch makes it fail (a conflict) on another pod of the same name.
func adoptPatch(job *batchv1.Job, pod *corev1.Pod) []byte {
	return mustJSON(map[string]any{
		"metadata": map[string]any{
			"uid":             pod.UID,
			"ownerReferences": []metav1.OwnerReference{jobsync.ControllerRef(job)},
			"finalizers":      []string{conditions.JobTrackingFinalizer},
		},
	})
}

// releasePatch removes the Job's reference and the tracking finalizer from pod (other
// owner references and finalizers stay), on that pod only (its UID).
func releasePatch(job *batchv1.Job, pod *corev1.Pod) []byte {
	return mustJSON(map[string]any{
		"metadata": map[string]any{
			"uid":                                 pod.UID,
			"ownerReferences":                     []map[string]any{{"$patch": "delete", "uid": job.UID}},
			"$deleteFromPrimitiveList/finalizers": []string{conditions.JobTrackingFinalizer},
		},
	})
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// podsByIndex returns the pods of the main pod informer under an index key, in namespace ns.
func (c *Controller) podsByIndex(ns, index, key string) ([]*corev1.Pod, error) {
	objs, err := c.podIndexer.ByIndex(index, key)
	if err != nil {
		return nil, err
	}
	pods := make([]*corev1.Pod, 0, len(objs))
	for _, o := range objs {
		if pod, ok := o.(*corev1.Pod); ok && pod.Namespace == ns {
			pods = append(pods, pod)
		}
	}
	return pods, nil
}

// enqueueAdopters enqueues the managed Jobs of the pod's namespace whose selector matches
// it, for a pod without a controller reference: their next sync may adopt it.
func (c *Controller) enqueueAdopters(pod *corev1.Pod) {
	if pod.DeletionTimestamp != nil || metav1.GetControllerOf(pod) != nil {
		return
	}
	jobs, err := c.jobLister.Jobs(pod.Namespace).List(labels.Everything())
	if err != nil {
		return
	}
	for _, job := range jobs {
		if !c.ours(job) || job.DeletionTimestamp != nil {
			continue
		}
		if sel := jobSelector(job); sel != nil && sel.Matches(labels.Set(pod.Labels)) {
			c.enqueueBatched(keyOf(job))
		}
	}
}
