package recoverer

import (
	"context"
	"errors"
	"fmt"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/informers"
	"github.com/coroner-dev/coroner/shim/recovery"
)

// recoverPod decides about one pod and carries the decision out: a pod of a managed Job,
// or an opted-in pod of anything else (recoversOthers).
func (r *Recoverer) recoverPod(ctx context.Context, key string) error {
	pod, other, err := r.cachedPod(key)
	if pod == nil || err != nil {
		return err
	}
	ns, name := pod.Namespace, pod.Name
	var job *batchv1.Job
	if !other {
		job = r.managedJob(pod)
	}
	if job == nil && !r.recoversOthers(pod) {
		return nil
	}
	in := recovery.Input{Pod: pod, Now: r.cfg.Clock.Now(), OptedInOnly: job == nil}
	if node := pod.Spec.NodeName; node != "" {
		n, err := r.inf.NodeLister.Get(node)
		switch {
		case err == nil:
			in.Node = n
			r.nodeFound(node)
		case apierrors.IsNotFound(err) && in.OptedInOnly:
			// Orphans (Z3) of others are pod GC's: no need to ask the API server.
		case apierrors.IsNotFound(err):
			// The cache may lag behind a node that was just made: ask the API server.
			n, err := r.client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
				in.NodeGone, in.NodeMissingFor = true, r.nodeMissingFor(node, in.Now)
			case err != nil:
				return err
			default:
				in.Node = n
				r.nodeFound(node)
			}
		default:
			return err
		}
		in.Fence.Node = node
		if l, err := r.inf.LeaseLister.Leases(r.inf.AgentNamespace).Get(conditions.AgentLeaseName(node)); err == nil {
			in.Fence.Agent = l
		}
		if in.Node != nil && recovery.FenceMatters(pod) {
			if in.Fence, err = r.fenceEvidence(ctx, in.Node, in.Fence.Agent); err != nil {
				return err
			}
		}
	}

	d := r.cfg.Recovery.Decide(in)
	logger := klog.FromContext(ctx).WithValues("pod", key, "node", pod.Spec.NodeName)
	now := func() metav1.Time { return metav1.NewTime(r.cfg.Clock.Now()) }
	switch d.Action {
	case recovery.ForceTerminate, recovery.FailOrphan:
		if _, err := conditions.EnsurePodPhase(ctx, r.patcher, pod, corev1.PodFailed, now, d.Conditions...); err != nil {
			if errors.Is(err, conditions.ErrPodGone) {
				return nil
			}
			return err
		}
		logger.Info("Recovered a pod from a node failure", "action", d.Action, "message", d.Message, "managedJob", job != nil)
		r.event(pod, job, corev1.EventTypeWarning, d.Reason, d.Message)
		r.cfg.Metrics.PodsRecovered.WithLabelValues(string(d.Action), d.Conditions[0].Reason).Inc()
	case recovery.ClearDisruption:
		if _, err := conditions.EnsurePodCondition(ctx, r.patcher, pod, d.Conditions[0], now); err != nil {
			if errors.Is(err, conditions.ErrPodGone) {
				return nil
			}
			return err
		}
		logger.Info("Cleared a stale DisruptionTarget", "message", d.Message)
		r.event(pod, nil, corev1.EventTypeNormal, d.Reason, d.Message)
		r.cfg.Metrics.PodsRecovered.WithLabelValues(string(d.Action), d.Reason).Inc()
	}
	if d.Delete {
		err := r.client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{
			GracePeriodSeconds: ptr.To[int64](0),
			Preconditions:      &metav1.Preconditions{UID: &pod.UID},
		})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("force-deleting pod %s: %w", key, err)
		}
		if err == nil && d.Action == recovery.DeleteTerminal {
			// The deletion is the write: its Events come after it.
			logger.Info("Force-deleted a terminal pod left on an unreachable node", "message", d.Message, "managedJob", job != nil)
			r.event(pod, job, corev1.EventTypeWarning, d.Reason, d.Message)
			r.cfg.Metrics.PodsRecovered.WithLabelValues(string(d.Action), conditions.ReasonNodeUnreachable).Inc()
		}
	}
	if d.RequeueAfter > 0 {
		r.queue.AddAfter(key, d.RequeueAfter)
	}
	return nil
}

// event records an Event on the pod, and on its managed Job when job is not nil.
func (r *Recoverer) event(pod *corev1.Pod, job *batchv1.Job, eventType, reason, message string) {
	r.cfg.Recorder.Event(pod, eventType, reason, message)
	if job != nil {
		r.cfg.Recorder.Event(job, eventType, reason, message)
	}
}

// cachedPod returns the pod of a queue key from the cache of the managed Jobs' pods, else
// from the informer of its node's pods (other is true then: the pod is a stub, never taken
// for a managed Job's); nil without error when the key is malformed or the pod is in
// neither.
func (r *Recoverer) cachedPod(key string) (pod *corev1.Pod, other bool, err error) {
	if pod, err = informers.PodByKey(r.inf.PodLister, key); pod != nil || err != nil {
		return pod, false, err
	}
	pod = r.nodePod(key)
	return pod, pod != nil, nil
}

// managedJob returns the managed Job controlling pod from the Job cache; nil when there
// is none (not a Job's pod, a Job managed by someone else, or a Job the cache does not
// hold).
func (r *Recoverer) managedJob(pod *corev1.Pod) *batchv1.Job {
	if job := r.inf.CachedJobOf(pod); informers.IsManagedBy(job, r.cfg.ManagedBy) {
		return job
	}
	return nil
}

// recoversOthers reports whether the pod, not of a managed Job, is to be recovered: with
// RecoverAll, within the informers' OtherPodsNamespace (when set), opted in.
func (r *Recoverer) recoversOthers(pod *corev1.Pod) bool {
	ns := r.inf.OtherPodsNamespace
	return r.cfg.RecoverPods == RecoverAll && (ns == "" || pod.Namespace == ns) &&
		conditions.OptedInToForcefulDeletion(pod.Annotations)
}

// nodeMissingFor records that the API server said the node does not exist, and returns
// for how long that has been so as far as this process knows.
func (r *Recoverer) nodeMissingFor(node string, now time.Time) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	since, ok := r.nodesMissing[node]
	if !ok {
		r.nodesMissing[node] = now
		return 0
	}
	return now.Sub(since)
}

// nodeFound forgets that the node was missing.
func (r *Recoverer) nodeFound(node string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.nodesMissing, node)
}
