package controller

import (
	"context"
	"fmt"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/informers"
)

// Stray pods: pods that left the pod cache without being deleted.
//
// The pod informer selects the managed Jobs' pods by the label coroner.dev/managed
// (informers.JobPodSelector). A pod that loses it (someone removed it, or every label of the
// pod, as upstream's conformance test of release does) leaves the cache: the watch sends a
// delete event whose object is the pod as it was before the change. Such an event is told
// from a deletion by the pod it carries: it still has the tracking finalizer and no
// deletionTimestamp, which a deleted pod cannot have (the finalizer holds the pod, and the
// deletion sets deletionTimestamp first), unless the controller is removing that finalizer
// itself (a counted pod labelled coroner.dev/counted leaves the cache this way, expected).
//
// noteStray puts such a pod on the stray queue and holds its Job's creations and deletions
// (expectations.strayed) until syncStrayPod has read the pod from the API server:
//   - gone, another pod of that name, without the tracking finalizer, counted, or labelled
//     again: nothing to do;
//   - controlled by a managed Job that is being deleted, or whose selector it still
//     matches: labelled coroner.dev/managed again, so it comes back to the cache as the
//     Job's (its add event lets the Job go on);
//   - controlled by a managed Job whose selector it no longer matches: released, as
//     claimPods releases such a pod in the cache (controller reference and tracking
//     finalizer removed; the Job replaces it);
//   - without a controller, or controlled by a Job that is gone: its tracking finalizer is
//     removed, as for any orphan (orphans.go);
//   - controlled by anything else: left alone.
// A delete event the informer makes up after a relist (DeletedFinalStateUnknown) for a pod
// that was really deleted looks the same, and the read finds the pod gone. Each stray costs
// one GET: they are rare, and a counted pod, the many that leave the cache by design, costs
// nothing.

// noteStray queues pod, from a delete event of the pod informer, when it left the cache
// without being deleted (see above).
func (c *Controller) noteStray(pod *corev1.Pod) {
	if pod.DeletionTimestamp != nil || !hasTrackingFinalizer(pod) {
		return
	}
	jobName := ""
	if job, _ := c.jobOf(pod); job != nil {
		key := keyOf(job)
		if c.expectations.removingFinalizer(key, pod.UID) {
			return // counted, or released: the controller's own write took it out
		}
		c.expectations.strayed(key, pod.UID)
		jobName = job.Name
	}
	c.logger.V(2).Info("A pod left the pod cache without being deleted; reading it again", "pod", klog.KObj(pod))
	c.strayQueue.Add(strayKey(pod.Namespace, pod.Name, pod.UID, jobName))
}

// strayKey is the stray queue's key: namespace/name/uid/job (job "" when the pod had no
// managed Job), none of which contains a "/".
func strayKey(ns, name string, uid types.UID, job string) string {
	return strings.Join([]string{ns, name, string(uid), job}, "/")
}

// syncStrayPod reads the stray pod with the given key (strayKey) from the API server and
// labels it again, releases it, removes its tracking finalizer or leaves it, as described
// above.
func (c *Controller) syncStrayPod(ctx context.Context, key string) error {
	parts := strings.Split(key, "/")
	if len(parts) != 4 {
		return nil
	}
	ns, name, uid, jobName := parts[0], parts[1], types.UID(parts[2]), parts[3]
	resolve := func() {
		if jobName != "" {
			jobKey := ns + "/" + jobName
			c.expectations.strayResolved(jobKey, uid)
			c.enqueueBatched(jobKey)
		}
	}
	logger := klog.FromContext(ctx)
	pod, err := c.client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		resolve()
		return nil
	case err != nil:
		return fmt.Errorf("reading pod %s/%s, which left the pod cache: %w", ns, name, err)
	}
	if pod.UID != uid || !hasTrackingFinalizer(pod) || pod.Labels[conditions.CountedLabel] != "" ||
		pod.Labels[conditions.ManagedPodLabel] != "" {
		resolve()
		return nil
	}
	ref := metav1.GetControllerOf(pod)
	if ref != nil && informers.JobControllerRef(pod) == nil {
		resolve() // controlled by something other than a Job
		return nil
	}
	if ref != nil {
		job := c.inf.CachedJobOf(pod)
		if job != nil && c.ours(job) {
			return c.claimStray(ctx, pod, job, job.DeletionTimestamp != nil || matches(jobSelector(job), pod), resolve)
		}
		gone, err := c.jobGone(ctx, ns, ref.Name, ref.UID)
		if err != nil {
			return err
		}
		if !gone {
			resolve() // its Job exists, and is someone else's
			return nil
		}
	}
	// An orphan (no controller, or its Job is gone) that no cache shows: as orphans.go does.
	removed, err := c.removeOrphanFinalizer(ctx, pod)
	if err != nil {
		return err
	}
	if removed {
		logger.V(2).Info("Removed the tracking finalizer of an orphan pod that left the pod cache", "pod", klog.KObj(pod))
	}
	resolve()
	return nil
}

// claimStray labels pod, a stray of the managed Job job, coroner.dev/managed again when
// keep, and releases it otherwise.
func (c *Controller) claimStray(ctx context.Context, pod *corev1.Pod, job *batchv1.Job, keep bool, resolve func()) error {
	logger := klog.FromContext(ctx)
	if keep {
		err := c.patchPod(ctx, pod, managedLabelPatch(pod.UID))
		switch {
		case err == nil:
			// Its add event resolves the stray (addPod).
			logger.V(2).Info("Labelled again a pod of a managed Job that had lost the label "+conditions.ManagedPodLabel, "pod", klog.KObj(pod))
			return nil
		case apierrors.IsNotFound(err), apierrors.IsConflict(err):
			resolve()
			return nil
		}
		return fmt.Errorf("labelling pod %s %s again: %w", klog.KObj(pod), conditions.ManagedPodLabel, err)
	}
	err := c.patchPod(ctx, pod, releasePatch(job, pod))
	switch {
	case err == nil:
		logger.V(2).Info("Released a pod whose labels no longer match the Job's selector", "pod", klog.KObj(pod))
		c.recorder.Eventf(job, corev1.EventTypeNormal, conditions.EventReasonReleased, conditions.ReleasedPodMessage, pod.Name)
	case apierrors.IsNotFound(err), apierrors.IsConflict(err):
	default:
		return fmt.Errorf("releasing pod %s: %w", klog.KObj(pod), err)
	}
	resolve()
	return nil
}

// matches reports whether selector (nil: the Job has none, see jobSelector) matches pod:
// a Job without a usable selector keeps the pods it controls.
func matches(selector labels.Selector, pod *corev1.Pod) bool {
	return selector == nil || selector.Matches(labels.Set(pod.Labels))
}

// managedLabelPatch labels a pod coroner.dev/managed=true, on the pod with uid only.
func managedLabelPatch(uid types.UID) []byte {
	return mustJSON(map[string]any{
		"metadata": map[string]any{
			"uid":    uid,
			"labels": map[string]string{conditions.ManagedPodLabel: "true"},
		},
	})
}

// Pods from before the label. A shim older than conditions.ManagedPodLabel made pods
// without it, and its pod cache selected every Job's pod; this one sees only labelled pods.
// LabelOwnPods, run by the leader before its informers start (shim.Controllers.Run), labels
// the pods of managed Jobs that lack it: it lists the Jobs, then the pods with
// batch.kubernetes.io/controller-uid and neither coroner.dev/managed nor
// coroner.dev/counted (through Config.PodMetadata when set: their metadata is all it reads),
// page by page, and labels those whose controller is a managed Job. Nothing else makes pods
// for managed Jobs meanwhile: the previous leader is gone. After an upgrade that is each
// unlabelled pod once; after that, a list that finds only other controllers' pods.

// listPageSize is the page size of LabelOwnPods' lists.
const listPageSize = 500

// unlabelledSelector selects the Jobs' pods that LabelOwnPods looks at.
const unlabelledSelector = conditions.ControllerUIDLabel + ",!" + conditions.ManagedPodLabel + ",!" + conditions.CountedLabel

// LabelOwnPods labels coroner.dev/managed the pods of managed Jobs that lack it (see
// above), and returns how many it labelled. Call it before the informers start.
func (c *Controller) LabelOwnPods(ctx context.Context) (int, error) {
	managed := map[types.UID]bool{}
	opts := metav1.ListOptions{Limit: listPageSize}
	for {
		jobs, err := c.client.BatchV1().Jobs("").List(ctx, opts)
		if err != nil {
			return 0, fmt.Errorf("listing the Jobs: %w", err)
		}
		for i := range jobs.Items {
			if c.ours(&jobs.Items[i]) {
				managed[jobs.Items[i].UID] = true
			}
		}
		if jobs.Continue == "" {
			break
		}
		opts.Continue = jobs.Continue
	}
	if len(managed) == 0 {
		return 0, nil
	}
	labelled := 0
	opts = metav1.ListOptions{Limit: listPageSize, LabelSelector: unlabelledSelector}
	for {
		pods, next, err := c.listPodMetadata(ctx, opts)
		if err != nil {
			return labelled, fmt.Errorf("listing the Jobs' pods without %s: %w", conditions.ManagedPodLabel, err)
		}
		for i := range pods {
			ref := metav1.GetControllerOf(&pods[i])
			if ref == nil || ref.Kind != "Job" || !managed[ref.UID] {
				continue
			}
			err := c.patchPodNamed(ctx, pods[i].Namespace, pods[i].Name, managedLabelPatch(pods[i].UID))
			switch {
			case err == nil:
				labelled++
			case apierrors.IsNotFound(err), apierrors.IsConflict(err):
			default:
				return labelled, fmt.Errorf("labelling pod %s/%s %s: %w", pods[i].Namespace, pods[i].Name, conditions.ManagedPodLabel, err)
			}
		}
		if next == "" {
			return labelled, nil
		}
		opts.Continue = next
	}
}

// listPodMetadata lists one page of pods' metadata, through Config.PodMetadata when set.
func (c *Controller) listPodMetadata(ctx context.Context, opts metav1.ListOptions) ([]metav1.ObjectMeta, string, error) {
	var out []metav1.ObjectMeta
	if c.cfg.PodMetadata != nil {
		l, err := c.cfg.PodMetadata.Resource(podsResource).List(ctx, opts)
		if err != nil {
			return nil, "", err
		}
		for i := range l.Items {
			out = append(out, l.Items[i].ObjectMeta)
		}
		return out, l.Continue, nil
	}
	l, err := c.client.CoreV1().Pods("").List(ctx, opts)
	if err != nil {
		return nil, "", err
	}
	for i := range l.Items {
		out = append(out, l.Items[i].ObjectMeta)
	}
	return out, l.Continue, nil
}
