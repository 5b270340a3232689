package classify

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func TestTerminatedStatuses(t *testing.T) {
	started, finished := t1.Add(-time.Minute), t1
	spec := corev1.PodSpec{
		RestartPolicy:  corev1.RestartPolicyNever,
		InitContainers: []corev1.Container{{Name: "proxy", Image: "envoy", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways)}},
		Containers:     []corev1.Container{{Name: "main", Image: "busybox"}, {Name: "side", Image: "busybox"}},
	}
	podWith := func(init, app []corev1.ContainerStatus) *corev1.Pod {
		p := &corev1.Pod{Spec: *spec.DeepCopy(), Status: corev1.PodStatus{Phase: corev1.PodRunning, InitContainerStatuses: init, ContainerStatuses: app}}
		return p
	}
	runningStatus := func(name, id string, restarts int32) corev1.ContainerStatus {
		return corev1.ContainerStatus{Name: name, Image: "busybox", ImageID: "sha256:1", ContainerID: id, RestartCount: restarts, Ready: true, Started: ptr.To(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(started)}}}
	}
	exit := func(name, id string, code int32, reason string, attempt int32) ContainerState {
		return ContainerState{Name: name, State: StateExited, ExitCode: code, Reason: reason, FinishedAt: finished, StartedAt: started, ContainerID: id, Attempt: attempt}
	}
	terminated := func(st corev1.ContainerStatus, id string, code int32, reason string) corev1.ContainerStatus {
		st.ContainerID = id
		st.Ready, st.Started = false, ptr.To(false)
		st.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Reason: reason,
			StartedAt: metav1.NewTime(started), FinishedAt: metav1.NewTime(finished), ContainerID: id}}
		return st
	}
	kubeletTerminated := func(name string, code int32) corev1.ContainerStatus {
		return corev1.ContainerStatus{Name: name, Image: "busybox", ContainerID: "containerd://k",
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Reason: "Error", ContainerID: "containerd://k"}}}
	}
	waitingStatus := corev1.ContainerStatus{Name: "main", Image: "busybox", ContainerID: "containerd://a", RestartCount: 1,
		State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
		LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, ContainerID: "containerd://a"}}}

	cases := map[string]struct {
		pod         *corev1.Pod
		exits       []ContainerState
		scheme      string
		wantInit    []corev1.ContainerStatus
		wantApp     []corev1.ContainerStatus
		wantChanged bool
	}{
		"running in the status: the runtime's exit is written, the rest of the status kept": {
			pod:         podWith(nil, []corev1.ContainerStatus{runningStatus("main", "containerd://a", 0)}),
			exits:       []ContainerState{exit("main", "a", 42, "Error", 0)},
			wantApp:     []corev1.ContainerStatus{terminated(runningStatus("main", "containerd://a", 0), "containerd://a", 42, "Error")},
			wantChanged: true,
		},
		"no status at all: one is added, with the spec's image and the attempt as restart count": {
			pod:   podWith(nil, nil),
			exits: []ContainerState{exit("main", "b", 3, "", 2)},
			wantApp: []corev1.ContainerStatus{terminated(corev1.ContainerStatus{Name: "main", Image: "busybox", RestartCount: 2},
				"containerd://b", 3, "Error")},
			wantChanged: true,
		},
		"exit 0 without a reason: Completed, as the kubelet says it": {
			pod:         podWith(nil, []corev1.ContainerStatus{runningStatus("main", "containerd://a", 0)}),
			exits:       []ContainerState{exit("main", "a", 0, "", 0)},
			wantApp:     []corev1.ContainerStatus{terminated(runningStatus("main", "containerd://a", 0), "containerd://a", 0, "Completed")},
			wantChanged: true,
		},
		"the kubelet wrote terminated: never over it": {
			pod:     podWith(nil, []corev1.ContainerStatus{kubeletTerminated("main", 7)}),
			exits:   []ContainerState{exit("main", "a", 42, "Error", 0)},
			wantApp: []corev1.ContainerStatus{kubeletTerminated("main", 7)},
		},
		"waiting after an earlier exit: the last exit is written, lastState kept": {
			pod:         podWith(nil, []corev1.ContainerStatus{waitingStatus}),
			exits:       []ContainerState{exit("main", "c", 1, "Error", 1)},
			wantApp:     []corev1.ContainerStatus{terminated(waitingStatus, "containerd://c", 1, "Error")},
			wantChanged: true,
		},
		"the status is about a later instance than the exit: kept": {
			pod:     podWith(nil, []corev1.ContainerStatus{runningStatus("main", "containerd://new", 3)}),
			exits:   []ContainerState{exit("main", "old", 1, "Error", 2)},
			wantApp: []corev1.ContainerStatus{runningStatus("main", "containerd://new", 3)},
		},
		"a native sidecar's exit goes into the init container statuses; the scheme is the pod's": {
			pod: podWith([]corev1.ContainerStatus{runningStatus("proxy", "cri-o://p", 0)},
				[]corev1.ContainerStatus{kubeletTerminated("main", 0)}),
			exits:       []ContainerState{exit("proxy", "p", 137, "Error", 0), exit("main", "m", 0, "Completed", 0)},
			wantInit:    []corev1.ContainerStatus{terminated(runningStatus("proxy", "cri-o://p", 0), "cri-o://p", 137, "Error")},
			wantApp:     []corev1.ContainerStatus{kubeletTerminated("main", 0)},
			wantChanged: true,
		},
		"the runtime's scheme wins over the default": {
			pod:         podWith(nil, []corev1.ContainerStatus{runningStatus("main", "", 0)}),
			exits:       []ContainerState{exit("main", "a", 42, "Error", 0)},
			scheme:      "cri-o",
			wantApp:     []corev1.ContainerStatus{terminated(runningStatus("main", "", 0), "cri-o://a", 42, "Error")},
			wantChanged: true,
		},
		"only exits: running and unknown states and containers not in the spec are ignored": {
			pod: podWith(nil, []corev1.ContainerStatus{runningStatus("main", "containerd://a", 0)}),
			exits: []ContainerState{{Name: "main", State: StateRunning}, {Name: "side", State: StateNotCreated},
				exit("debugger", "d", 1, "Error", 0)},
			wantApp: []corev1.ContainerStatus{runningStatus("main", "containerd://a", 0)},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			before := tc.pod.DeepCopy()
			init, app, changed := TerminatedStatuses(tc.pod, tc.exits, tc.scheme)
			if changed != tc.wantChanged {
				t.Errorf("changed = %v, want %v", changed, tc.wantChanged)
			}
			if diff := cmp.Diff(tc.wantInit, init); diff != "" {
				t.Errorf("init container statuses (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantApp, app); diff != "" {
				t.Errorf("container statuses (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(before, tc.pod); diff != "" {
				t.Errorf("the pod was modified:\n%s", diff)
			}
		})
	}
}
