package classify

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/test/wrappers"
)

const grace = 5 * time.Second

// t1 is when the pod's last container exited in most cases; decisions are
// made at t1+10s (past the grace) or t1+2s (within it).
var t1 = time.Date(2026, 1, 2, 4, 0, 0, 0, time.UTC)

func ended(reason, message string) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.Status.Reason, p.Status.Message = reason, message }
}

func deletedAt(t time.Time, graceSeconds int64) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.DeletionTimestamp = &metav1.Time{Time: t}
		p.DeletionGracePeriodSeconds = ptr.To(graceSeconds)
	}
}

func pod(w *wrappers.PodWrapper, mods ...func(*corev1.Pod)) *corev1.Pod {
	p := w.Obj()
	for _, m := range mods {
		m(p)
	}
	return p
}

func kubeletCond(msg string, at time.Time) *corev1.PodCondition {
	return &corev1.PodCondition{Type: conditions.DisruptionTarget, Status: corev1.ConditionTrue,
		Reason: conditions.ReasonTerminationByKubelet, Message: msg, LastTransitionTime: metav1.NewTime(at)}
}

func TestStampsForPod(t *testing.T) {
	const evictMsg = "The node was low on resource: memory. Threshold quantity: 100Mi, available: 48Mi. Container main was using 900Mi, request is 0, has larger consumption of memory. "
	running := func() *wrappers.PodWrapper { return wrappers.MakePod("p", "default").Phase(corev1.PodRunning) }
	exitedAt := func(w *wrappers.PodWrapper, code int32, at time.Time) *wrappers.PodWrapper {
		return w.ExitedContainer("main", code).FinishedAt(at)
	}
	later, soon := t1.Add(10*time.Second), t1.Add(2*time.Second)

	cases := map[string]struct {
		pod      *corev1.Pod
		observed []ContainerState
		now      time.Time
		want     PodDecision
		// wantWhy only checks that Why is set when no stamp is due.
	}{
		// A3: kubelet-initiated terminations.
		"evicted and Failed without DisruptionTarget: the condition, with the eviction message": {
			pod: pod(exitedAt(running().Phase(corev1.PodFailed), 137, t1), ended(PodReasonEvicted, evictMsg)),
			now: later,
			want: PodDecision{Stamps: []Stamp{{Kind: KindTerminationByKubelet, Reason: PodReasonEvicted,
				Condition: kubeletCond(evictMsg, later), Message: "the kubelet ended the pod (Evicted): " + evictMsg}},
				Why: "phase is already Failed"},
		},
		"evicted with DisruptionTarget True already: nothing": {
			pod:  pod(exitedAt(running().Phase(corev1.PodFailed), 137, t1).Condition(conditions.DisruptionTarget, corev1.ConditionTrue), ended(PodReasonEvicted, evictMsg)),
			now:  later,
			want: PodDecision{Why: "phase is already Failed"},
		},
		"evicted with a stale DisruptionTarget False: set True": {
			pod: pod(exitedAt(running().Phase(corev1.PodFailed), 137, t1).Condition(conditions.DisruptionTarget, corev1.ConditionFalse), ended(PodReasonEvicted, evictMsg)),
			now: later,
			want: PodDecision{Stamps: []Stamp{{Kind: KindTerminationByKubelet, Reason: PodReasonEvicted,
				Condition: kubeletCond(evictMsg, later), Message: "the kubelet ended the pod (Evicted): " + evictMsg}},
				Why: "phase is already Failed"},
		},
		"graceful node shutdown without a message: the kubelet's text": {
			pod: pod(exitedAt(running().Phase(corev1.PodFailed), 143, t1), ended(PodReasonNodeShutdownTerminated, "")),
			now: later,
			want: PodDecision{Stamps: []Stamp{{Kind: KindTerminationByKubelet, Reason: PodReasonNodeShutdownTerminated,
				Condition: kubeletCond("Pod was terminated in response to imminent node shutdown.", later),
				Message:   "the kubelet ended the pod (Terminated): Pod was terminated in response to imminent node shutdown."}},
				Why: "phase is already Failed"},
		},
		"rejected at admission because the node is shutting down": {
			pod: pod(running().Phase(corev1.PodFailed), ended(PodReasonNodeShutdownRejected, "Pod was rejected as the node is shutting down.")),
			now: later,
			want: PodDecision{Stamps: []Stamp{{Kind: KindTerminationByKubelet, Reason: PodReasonNodeShutdownRejected,
				Condition: kubeletCond("Pod was rejected as the node is shutting down.", later),
				Message:   "the kubelet ended the pod (NodeShutdown): Pod was rejected as the node is shutting down."}},
				Why: "phase is already Failed"},
		},
		"preempted by the kubelet: the kubelet's own condition text": {
			pod: pod(exitedAt(running().Phase(corev1.PodFailed), 137, t1), ended(PodReasonPreempting, "Preempted in order to admit critical pod")),
			now: later,
			want: PodDecision{Stamps: []Stamp{{Kind: KindTerminationByKubelet, Reason: PodReasonPreempting,
				Condition: kubeletCond("Pod was preempted by Kubelet to accommodate a critical pod.", later),
				Message:   "the kubelet ended the pod (Preempting): Pod was preempted by Kubelet to accommodate a critical pod."}},
				Why: "phase is already Failed"},
		},
		"other kubelet reasons (an admission failure) are not disruptions coroner knows": {
			pod:  pod(running().Phase(corev1.PodFailed), ended("OutOfmemory", "Node didn't have enough resource: memory")),
			now:  later,
			want: PodDecision{Why: "phase is already Failed"},
		},
		"evicted, phase still Running, container still running: the condition now, the phase later": {
			pod: pod(running().RunningContainer("main"), ended(PodReasonEvicted, evictMsg)),
			now: later,
			want: PodDecision{Stamps: []Stamp{{Kind: KindTerminationByKubelet, Reason: PodReasonEvicted,
				Condition: kubeletCond(evictMsg, later), Message: "the kubelet ended the pod (Evicted): " + evictMsg}},
				Why: "container main is running"},
		},
		"evicted, phase still Running, containers stopped within the grace: the condition and a recheck": {
			pod: pod(exitedAt(running(), 137, t1), ended(PodReasonEvicted, evictMsg)),
			now: soon,
			want: PodDecision{Stamps: []Stamp{{Kind: KindTerminationByKubelet, Reason: PodReasonEvicted,
				Condition: kubeletCond(evictMsg, soon), Message: "the kubelet ended the pod (Evicted): " + evictMsg}},
				RecheckAt: t1.Add(grace), Why: "all containers stopped; the kubelet has until 2026-01-02T04:00:05Z to set a terminal phase"},
		},
		"evicted, phase still Running, containers stopped past the grace: condition and Failed in one write": {
			pod: pod(exitedAt(running(), 0, t1), ended(PodReasonEvicted, evictMsg)),
			now: later,
			want: PodDecision{Stamps: []Stamp{{Kind: KindTerminationByKubelet, Reason: PodReasonEvicted, Phase: corev1.PodFailed,
				Condition: kubeletCond(evictMsg, later),
				Message:   "phase Failed: the kubelet ended the pod (Evicted) and all its containers have stopped, but its phase is still Running"}}},
		},
		"evicted with DisruptionTarget, phase still Running, containers stopped: Failed alone": {
			pod: pod(exitedAt(running(), 137, t1).Condition(conditions.DisruptionTarget, corev1.ConditionTrue), ended(PodReasonEvicted, evictMsg)),
			now: later,
			want: PodDecision{Stamps: []Stamp{{Kind: KindTerminalPhase, Reason: "Failed", Phase: corev1.PodFailed,
				Message: "phase Failed: the kubelet ended the pod (Evicted) and all its containers have stopped, but its phase is still Running"}}},
		},

		// A4: pods being deleted.
		"deleted, a container exited 1, past the grace: Failed": {
			pod: pod(exitedAt(running(), 1, t1), deletedAt(t1.Add(25*time.Second), 30)),
			now: later,
			want: PodDecision{Stamps: []Stamp{{Kind: KindTerminalPhase, Reason: "Failed", Phase: corev1.PodFailed,
				Message: "phase Failed: the pod is being deleted and all its containers have stopped, but its phase is still Running"}}},
		},
		"deleted, every app container exited 0: Succeeded, whatever the restartPolicy": {
			pod: pod(exitedAt(running(), 0, t1).ExitedContainer("side", 0).FinishedAt(t1.Add(-time.Second)),
				func(p *corev1.Pod) {
					p.Spec.RestartPolicy = corev1.RestartPolicyAlways
					p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "side"})
				}, deletedAt(t1.Add(25*time.Second), 30)),
			now: later,
			want: PodDecision{Stamps: []Stamp{{Kind: KindTerminalPhase, Reason: "Succeeded", Phase: corev1.PodSucceeded,
				Message: "phase Succeeded: the pod is being deleted and all its containers have stopped, but its phase is still Running"}}},
		},
		"deleted, a container waiting to restart after exit 0: Failed, as the kubelet counts it": {
			pod: pod(running(), func(p *corev1.Pod) {
				p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "main",
					State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
					LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, FinishedAt: metav1.NewTime(t1)}}}}
			}, deletedAt(t1.Add(25*time.Second), 30)),
			now: later,
			want: PodDecision{Stamps: []Stamp{{Kind: KindTerminalPhase, Reason: "Failed", Phase: corev1.PodFailed,
				Message: "phase Failed: the pod is being deleted and all its containers have stopped, but its phase is still Running"}}},
		},
		"deleted, a container still running: wait for its exit": {
			pod:  pod(running().RunningContainer("main"), deletedAt(t1.Add(25*time.Second), 30)),
			now:  later,
			want: PodDecision{Why: "container main is running"},
		},
		"deleted, the status says running but the runtime saw it exit: the runtime's word": {
			pod:      pod(running().RunningContainer("main"), deletedAt(t1.Add(25*time.Second), 30)),
			observed: []ContainerState{{Name: "main", State: StateExited, ExitCode: 143, FinishedAt: t1}},
			now:      later,
			want: PodDecision{Stamps: []Stamp{{Kind: KindTerminalPhase, Reason: "Failed", Phase: corev1.PodFailed,
				Message:    "phase Failed: the pod is being deleted and all its containers have stopped, but its phase is still Running",
				Terminated: []ContainerState{{Name: "main", State: StateExited, ExitCode: 143, FinishedAt: t1}}}}},
		},
		"deleted, the kubelet's status already says terminated: the phase carries no exit": {
			pod:      pod(exitedAt(running(), 143, t1), deletedAt(t1.Add(25*time.Second), 30)),
			observed: []ContainerState{{Name: "main", State: StateExited, ExitCode: 143, FinishedAt: t1, ContainerID: "abc"}},
			now:      later,
			want: PodDecision{Stamps: []Stamp{{Kind: KindTerminalPhase, Reason: "Failed", Phase: corev1.PodFailed,
				Message: "phase Failed: the pod is being deleted and all its containers have stopped, but its phase is still Running"}}},
		},
		"deleted while creating the container: unknown, wait": {
			pod:  pod(running().Phase(corev1.PodPending).WaitingContainer("main", "ContainerCreating"), deletedAt(t1.Add(25*time.Second), 30)),
			now:  later,
			want: PodDecision{Why: "container main has not been seen to exit"},
		},
		"deleted before its container was created, by the runtime's word: Failed after the grace from the deletion": {
			pod:      pod(running().Phase(corev1.PodPending).WaitingContainer("main", "ContainerCreating"), deletedAt(t1.Add(30*time.Second), 30)),
			observed: []ContainerState{{Name: "main", State: StateNotCreated}},
			now:      later,
			want: PodDecision{Stamps: []Stamp{{Kind: KindTerminalPhase, Reason: "Failed", Phase: corev1.PodFailed,
				Message: "phase Failed: the pod is being deleted and all its containers have stopped, but its phase is still Pending"}}},
		},
		"deleted during init: the init container failed, the app container never started": {
			pod: pod(running().Phase(corev1.PodPending).InitContainerExited("init", 1).FinishedAt(t1), func(p *corev1.Pod) {
				p.Spec.InitContainers = []corev1.Container{{Name: "init"}}
			}, deletedAt(t1.Add(20*time.Second), 30)),
			observed: []ContainerState{{Name: "main", State: StateNotCreated}},
			now:      later,
			want: PodDecision{Stamps: []Stamp{{Kind: KindTerminalPhase, Reason: "Failed", Phase: corev1.PodFailed,
				Message: "phase Failed: the pod is being deleted and all its containers have stopped, but its phase is still Pending"}}},
		},
		"deleted, a sidecar still running: wait": {
			pod: pod(exitedAt(running(), 0, t1), func(p *corev1.Pod) {
				p.Spec.InitContainers = []corev1.Container{{Name: "proxy", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways)}}
				p.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: "proxy", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
			}, deletedAt(t1.Add(25*time.Second), 30)),
			now:  later,
			want: PodDecision{Why: "init container proxy is running"},
		},
		"deleted, the last exit within the grace: recheck at exit plus grace": {
			pod:  pod(exitedAt(running(), 1, t1), deletedAt(t1.Add(25*time.Second), 30)),
			now:  soon,
			want: PodDecision{RecheckAt: t1.Add(grace), Why: "all containers stopped; the kubelet has until 2026-01-02T04:00:05Z to set a terminal phase"},
		},
		"deleted after its containers had exited: the grace runs from the deletion": {
			pod:  pod(exitedAt(running(), 1, t1.Add(-time.Hour)), deletedAt(t1.Add(30*time.Second), 30)),
			now:  soon,
			want: PodDecision{RecheckAt: t1.Add(grace), Why: "all containers stopped; the kubelet has until 2026-01-02T04:00:05Z to set a terminal phase"},
		},
		"deleted and already Failed: the kubelet's word": {
			pod:  pod(exitedAt(running().Phase(corev1.PodFailed), 1, t1), deletedAt(t1, 0)),
			now:  later,
			want: PodDecision{Why: "phase is already Failed"},
		},
		"deleted and already Succeeded: the kubelet's word": {
			pod:  pod(exitedAt(running().Phase(corev1.PodSucceeded), 0, t1), deletedAt(t1, 0)),
			now:  later,
			want: PodDecision{Why: "phase is already Succeeded"},
		},
		"not deleted, all containers exited (restarting in place): nothing": {
			pod:  pod(exitedAt(running(), 1, t1), func(p *corev1.Pod) { p.Spec.RestartPolicy = corev1.RestartPolicyOnFailure }),
			now:  later,
			want: PodDecision{Why: "not being deleted and not ended by the kubelet"},
		},
		"a static pod's mirror pod is the kubelet's": {
			pod: pod(exitedAt(running(), 1, t1).Annotation(corev1.MirrorPodAnnotationKey, "abc"),
				deletedAt(t1.Add(25*time.Second), 30)),
			now:  later,
			want: PodDecision{Why: "a static pod's phase is the kubelet's"},
		},
		"nil pod": {},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var before *corev1.Pod
			if tc.pod != nil {
				before = tc.pod.DeepCopy()
			}
			got := StampsForPod(tc.pod, tc.observed, tc.now, grace)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("StampsForPod() mismatch (-want +got):\n%s", diff)
			}
			if tc.pod != nil && !cmp.Equal(before, tc.pod) {
				t.Errorf("StampsForPod() modified the pod")
			}
		})
	}
}

func TestContainerStatesFromPod(t *testing.T) {
	p := wrappers.MakePod("p", "default").
		InitContainerExited("init", 0).FinishedAt(t1.Add(-time.Minute)).
		ExitedContainer("a", 3).FinishedAt(t1).
		RunningContainer("b").
		WaitingContainer("c", "ContainerCreating").Obj()
	p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{Name: "d",
		State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
		LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, FinishedAt: metav1.NewTime(t1)}}})
	want := []ContainerState{
		{Name: "init", State: StateExited, FinishedAt: t1.Add(-time.Minute)},
		{Name: "a", State: StateExited, ExitCode: 3, FinishedAt: t1},
		{Name: "b", State: StateRunning},
		{Name: "c", State: StateUnknown},
		{Name: "d", State: StateWaitingAfterExit, ExitCode: 137, FinishedAt: t1},
	}
	if diff := cmp.Diff(want, ContainerStatesFromPod(p)); diff != "" {
		t.Errorf("ContainerStatesFromPod() mismatch (-want +got):\n%s", diff)
	}
}
