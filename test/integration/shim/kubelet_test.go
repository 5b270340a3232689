package shim_test

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/conditions"
)

// The kubelet's moves. Pods are never scheduled or run: the test writes what a kubelet
// would write, through the status subresource, re-reading the pod on every attempt so a
// concurrent write by the controller (a finalizer removal, say) is never undone.

// kubeletOpt adjusts a status the kubelet helpers are about to write.
type kubeletOpt func(p *corev1.Pod)

// finishedAt sets the finish time of the exited containers and of the Ready=False
// transition (default: now).
func finishedAt(t time.Time) kubeletOpt {
	return func(p *corev1.Pod) {
		mt := metav1.NewTime(t)
		for i := range p.Status.ContainerStatuses {
			if term := p.Status.ContainerStatuses[i].State.Terminated; term != nil {
				term.FinishedAt = mt
				if term.StartedAt.After(t) {
					term.StartedAt = mt
				}
			}
		}
		for i := range p.Status.Conditions {
			if c := &p.Status.Conditions[i]; c.Type == corev1.PodReady && c.Status == corev1.ConditionFalse {
				c.LastTransitionTime = mt
			}
		}
	}
}

// withoutFinishTime leaves the containers' finishedAt empty, so that the pod's finish
// time is its Ready=False transition (KEP-3850).
func withoutFinishTime() kubeletOpt {
	return func(p *corev1.Pod) {
		for i := range p.Status.ContainerStatuses {
			if term := p.Status.ContainerStatuses[i].State.Terminated; term != nil {
				term.FinishedAt = metav1.Time{}
			}
		}
	}
}

// disruption adds DisruptionTarget=True with the reason, as the eviction API, the taint
// manager, the scheduler or the kubelet would.
func disruption(reason string) kubeletOpt {
	return func(p *corev1.Pod) {
		setPodCondition(p, conditions.DisruptionTarget, corev1.ConditionTrue, reason, metav1.Now())
	}
}

// runPod moves the pod to Running with its containers running, Ready as asked.
func (f *fixture) runPod(pod *corev1.Pod, ready bool) *corev1.Pod {
	f.t.Helper()
	return f.writeStatus(pod, "run", func(p *corev1.Pod) {
		now := metav1.Now()
		readyStatus := corev1.ConditionFalse
		if ready {
			readyStatus = corev1.ConditionTrue
		}
		p.Status.Phase = corev1.PodRunning
		if p.Status.StartTime == nil {
			p.Status.StartTime = &now
		}
		setPodCondition(p, corev1.PodInitialized, corev1.ConditionTrue, "", now)
		setPodCondition(p, corev1.ContainersReady, readyStatus, "", now)
		setPodCondition(p, corev1.PodReady, readyStatus, "", now)
		p.Status.ContainerStatuses = nil
		for _, c := range p.Spec.Containers {
			p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{
				Name: c.Name, Image: c.Image, ImageID: "sha256:0", ContainerID: "containerd://" + string(p.UID)[:8] + c.Name,
				Ready: ready, Started: ptr.To(true),
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
			})
		}
	})
}

// succeedPod moves the pod to Succeeded: every container exited 0 now.
func (f *fixture) succeedPod(pod *corev1.Pod, opts ...kubeletOpt) *corev1.Pod {
	f.t.Helper()
	return f.finishPod(pod, corev1.PodSucceeded, 0, opts)
}

// failPod moves the pod to Failed: its first container exited with exitCode now (the
// others with 0), Ready=False; opts add conditions or change the times.
func (f *fixture) failPod(pod *corev1.Pod, exitCode int32, opts ...kubeletOpt) *corev1.Pod {
	f.t.Helper()
	return f.finishPod(pod, corev1.PodFailed, exitCode, opts)
}

func (f *fixture) finishPod(pod *corev1.Pod, phase corev1.PodPhase, exitCode int32, opts []kubeletOpt) *corev1.Pod {
	f.t.Helper()
	return f.writeStatus(pod, "finish ("+string(phase)+")", func(p *corev1.Pod) {
		now := metav1.Now()
		started := now
		if p.Status.StartTime != nil {
			started = *p.Status.StartTime
		} else {
			p.Status.StartTime = &now
		}
		p.Status.Phase = phase
		setPodCondition(p, corev1.ContainersReady, corev1.ConditionFalse, "PodCompleted", now)
		setPodCondition(p, corev1.PodReady, corev1.ConditionFalse, "PodCompleted", now)
		p.Status.ContainerStatuses = nil
		for i, c := range p.Spec.Containers {
			code := int32(0)
			if i == 0 {
				code = exitCode
			}
			reason := "Completed"
			if code != 0 {
				reason = "Error"
			}
			p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{
				Name: c.Name, Image: c.Image, ImageID: "sha256:0", ContainerID: "containerd://" + string(p.UID)[:8] + c.Name,
				Started: ptr.To(false),
				State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
					ExitCode: code, Reason: reason, StartedAt: started, FinishedAt: now,
					ContainerID: "containerd://" + string(p.UID)[:8] + c.Name,
				}},
			})
		}
		for _, o := range opts {
			o(p)
		}
	})
}

// writeStatus applies mutate to a fresh copy of the pod and writes its status, retrying
// on conflicts.
func (f *fixture) writeStatus(pod *corev1.Pod, what string, mutate func(p *corev1.Pod)) *corev1.Pod {
	f.t.Helper()
	ctx := context.Background()
	var out *corev1.Pod
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p, err := f.client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		mutate(p)
		out, err = f.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		f.t.Fatalf("kubelet: %s pod %s (index %s): %v", what, pod.Name, indexStr(pod), err)
	}
	return out
}

// bindPod binds the pod to a node, as the scheduler would, making the Node object first
// if there is none (a pod bound to a node that does not exist is an orphan, which the
// shim fails after a quarantine, Z3). A bound pod is deleted gracefully: it stays
// terminating after the controller removed its finalizer, until its kubelet (the test:
// finishDeletion) completes the deletion.
func (f *fixture) bindPod(pod *corev1.Pod, node string) {
	f.t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}
	if _, err := f.client.CoreV1().Nodes().Create(context.Background(), n, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		f.t.Fatalf("creating node %s: %v", node, err)
	}
	f.bindPodNoNode(pod, node)
}

// bindPodNoNode binds the pod to a node without making sure the node exists.
func (f *fixture) bindPodNoNode(pod *corev1.Pod, node string) {
	f.t.Helper()
	err := f.client.CoreV1().Pods(pod.Namespace).Bind(context.Background(), &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, UID: pod.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: node},
	}, metav1.CreateOptions{})
	if err != nil {
		f.t.Fatalf("binding pod %s to %s: %v", pod.Name, node, err)
	}
}

// deletePod deletes the pod with its default grace period, as a drain or an eviction does.
func (f *fixture) deletePod(pod *corev1.Pod) {
	f.t.Helper()
	err := f.client.CoreV1().Pods(pod.Namespace).Delete(context.Background(), pod.Name, metav1.DeleteOptions{})
	if err != nil {
		f.t.Fatalf("deleting pod %s: %v", pod.Name, err)
	}
}

// finishDeletion completes a graceful deletion as the kubelet does once the containers
// stopped: a delete with grace period 0. The pod is gone then unless it still has the
// tracking finalizer.
func (f *fixture) finishDeletion(pod *corev1.Pod) {
	f.t.Helper()
	err := f.client.CoreV1().Pods(pod.Namespace).Delete(context.Background(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	if err != nil && !apierrors.IsNotFound(err) {
		f.t.Fatalf("completing the deletion of pod %s: %v", pod.Name, err)
	}
}

// setPodCondition sets a pod condition, moving lastTransitionTime only on a change.
func setPodCondition(p *corev1.Pod, t corev1.PodConditionType, s corev1.ConditionStatus, reason string, at metav1.Time) {
	for i := range p.Status.Conditions {
		c := &p.Status.Conditions[i]
		if c.Type == t {
			if c.Status != s {
				c.LastTransitionTime = at
			}
			c.Status, c.Reason = s, reason
			return
		}
	}
	p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: t, Status: s, Reason: reason, LastTransitionTime: at})
}
