package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// kubelet plays the scheduler and the kubelet for the workload's pods in the watched
// namespaces: it binds every new pod to nodeName, makes it Running after startDelay, and
// after runTime writes the terminal status the workload decides, as strategic merge
// patches of the status subresource computed the way the kubelet computes them (so a
// concurrent write by the controller, a finalizer removal say, is never undone). A pod
// the controller deletes is finished at once (delete with grace period 0), as a kubelet
// does once the containers are gone.
type kubelet struct {
	ctx                 context.Context
	client              kubernetes.Interface
	rec                 *recorder
	w                   workload
	startDelay, runTime time.Duration
	// longRunTime is the run time of the pods of a Job that one failure ends
	// (workload.doomIndex), other than the failing one: the controller must stop them.
	longRunTime time.Duration
	namespaces  map[string]bool
}

// podEvent takes a pod as a watch delivered it.
func (k *kubelet) podEvent(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok || !k.namespaces[pod.Namespace] {
		return
	}
	if pod.DeletionTimestamp != nil {
		if k.rec.takeDeletion(pod) {
			go k.finishDeletion(pod)
		}
		return
	}
	if pod.Spec.NodeName != "" || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return
	}
	jr, index, attempt, ok := k.rec.takePod(pod)
	if !ok {
		return
	}
	go func() {
		if err := k.run(pod, jr, index, attempt); err != nil && k.ctx.Err() == nil {
			k.rec.fail(fmt.Errorf("simulated kubelet, pod %s/%s: %w", pod.Namespace, pod.Name, err))
		}
	}()
}

// run takes a new pod through its life.
func (k *kubelet) run(pod *corev1.Pod, jr *jobRecord, index, attempt int) error {
	code := k.w.exitCode(jr.number, index, attempt)
	err := k.client.CoreV1().Pods(pod.Namespace).Bind(k.ctx, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, UID: pod.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: nodeName},
	}, metav1.CreateOptions{})
	if apierrors.IsNotFound(err) {
		return nil // deleted meanwhile
	}
	if err != nil {
		return fmt.Errorf("binding: %w", err)
	}
	if !k.sleep(k.startDelay) {
		return nil
	}
	running := pod.DeepCopy()
	setRunning(running, time.Now())
	cur, err := k.patchStatus(pod, running)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("writing Running: %w", err)
	}
	runTime := k.runTime
	if d := k.w.doomIndex(jr.number); d >= 0 && index != d {
		runTime = k.longRunTime
	}
	if !k.sleep(runTime) {
		return nil
	}
	done := cur.DeepCopy()
	setFinished(done, code, time.Now())
	w := k.rec.terminalWrite(jr, cur, index, code)
	if _, err := k.patchStatus(cur, done); err != nil {
		k.rec.dropWrite(jr, index, w)
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("writing %s: %w", done.Status.Phase, err)
	}
	k.rec.ack(w, time.Now())
	return nil
}

func (k *kubelet) sleep(d time.Duration) bool {
	if d <= 0 {
		return k.ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-k.ctx.Done():
		return false
	}
}

// patchStatus writes the status of mod as a strategic merge patch from old, as the
// kubelet's status manager does, with the pod's UID as precondition.
func (k *kubelet) patchStatus(old, mod *corev1.Pod) (*corev1.Pod, error) {
	oldJSON, err := json.Marshal(corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: old.UID}, Status: old.Status})
	if err != nil {
		return nil, err
	}
	modJSON, err := json.Marshal(corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: old.UID}, Status: mod.Status})
	if err != nil {
		return nil, err
	}
	patch, err := strategicpatch.CreateTwoWayMergePatch(oldJSON, modJSON, corev1.Pod{})
	if err != nil {
		return nil, err
	}
	patch, err = addUIDPrecondition(patch, old.UID)
	if err != nil {
		return nil, err
	}
	return k.client.CoreV1().Pods(old.Namespace).Patch(k.ctx, old.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
}

// addUIDPrecondition adds metadata.uid to a patch, which the API server checks.
func addUIDPrecondition(patch []byte, uid types.UID) ([]byte, error) {
	var m map[string]any
	if err := json.Unmarshal(patch, &m); err != nil {
		return nil, err
	}
	m["metadata"] = map[string]any{"uid": uid}
	return json.Marshal(m)
}

func (k *kubelet) finishDeletion(pod *corev1.Pod) {
	err := k.client.CoreV1().Pods(pod.Namespace).Delete(k.ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: ptr.To[int64](0),
		Preconditions:      &metav1.Preconditions{UID: &pod.UID},
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) && k.ctx.Err() == nil {
		k.rec.fail(fmt.Errorf("simulated kubelet, completing the deletion of pod %s/%s: %w", pod.Namespace, pod.Name, err))
	}
}

// setRunning gives the pod the status of a started, ready pod.
func setRunning(p *corev1.Pod, now time.Time) {
	t := metav1.NewTime(now)
	p.Status.Phase = corev1.PodRunning
	p.Status.StartTime = &t
	setCondition(p, corev1.PodInitialized, corev1.ConditionTrue, "", t)
	setCondition(p, corev1.ContainersReady, corev1.ConditionTrue, "", t)
	setCondition(p, corev1.PodReady, corev1.ConditionTrue, "", t)
	p.Status.ContainerStatuses = nil
	for _, c := range p.Spec.Containers {
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: "sha256:0", ContainerID: containerID(p, c.Name),
			Ready: true, Started: ptr.To(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: t}},
		})
	}
}

// setFinished gives the pod a terminal status: its first container exited with code
// (Succeeded for 0, else Failed), the others with 0.
func setFinished(p *corev1.Pod, code int32, now time.Time) {
	t := metav1.NewTime(now)
	p.Status.Phase = corev1.PodSucceeded
	if code != 0 {
		p.Status.Phase = corev1.PodFailed
	}
	started := t
	if p.Status.StartTime != nil {
		started = *p.Status.StartTime
	}
	setCondition(p, corev1.ContainersReady, corev1.ConditionFalse, "PodCompleted", t)
	setCondition(p, corev1.PodReady, corev1.ConditionFalse, "PodCompleted", t)
	p.Status.ContainerStatuses = nil
	for i, c := range p.Spec.Containers {
		exit, reason := int32(0), "Completed"
		if i == 0 && code != 0 {
			exit, reason = code, "Error"
		}
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: "sha256:0", ContainerID: containerID(p, c.Name),
			Started: ptr.To(false),
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
				ExitCode: exit, Reason: reason, StartedAt: started, FinishedAt: t, ContainerID: containerID(p, c.Name),
			}},
		})
	}
}

func containerID(p *corev1.Pod, name string) string {
	return "containerd://" + string(p.UID)[:8] + "-" + name
}

// setCondition sets a pod condition, moving lastTransitionTime only on a change.
func setCondition(p *corev1.Pod, t corev1.PodConditionType, s corev1.ConditionStatus, reason string, at metav1.Time) {
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
