package classify

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DefaultRuntimeScheme is the scheme of a container ID URI when neither the
// runtime nor the pod's statuses say another ("containerd://<id>", as the
// kubelet writes it).
const DefaultRuntimeScheme = "containerd"

// exitsToWrite returns the runtime's exits (observed, StateExited) of the
// pod's spec containers that the pod's status does not carry yet: its status
// is missing, running or waiting. A status that says terminated is the
// kubelet's word and is kept, as is one that is about a later instance than
// the exit (a higher restart count, another container ID).
func exitsToWrite(pod *corev1.Pod, observed []ContainerState) []ContainerState {
	var out []ContainerState
	for _, s := range observed {
		if s.State != StateExited {
			continue
		}
		if _, _, ok := findContainer(pod, s.Name); !ok {
			continue
		}
		if cur := findStatus(pod, s.Name); cur != nil && !needsTerminated(*cur, s) {
			continue
		}
		out = append(out, s)
	}
	return out
}

// needsTerminated reports whether the kubelet's status of a container lacks
// the exit e: it does not say terminated, and it is not about a later
// instance of the container than e.
func needsTerminated(cur corev1.ContainerStatus, e ContainerState) bool {
	if cur.State.Terminated != nil {
		return false
	}
	if cur.ContainerID != "" && e.ContainerID != "" && bareID(cur.ContainerID) != bareID(e.ContainerID) && cur.RestartCount > e.Attempt {
		return false
	}
	return true
}

// TerminatedStatuses returns the pod's init and app container statuses with
// the runtime's exits (StateExited) written in as terminated states (exit
// code, reason, startedAt, finishedAt, containerID as scheme://id): for the
// containers whose status is missing, running or waiting, never over a
// terminated state the kubelet wrote (see exitsToWrite). It is what goes with
// a terminal phase the agent writes (A4) so that a Job's onExitCodes rule can
// match the exit code of a pod whose kubelet could not report it. changed
// reports whether anything was written; the pod is not modified. scheme is
// the runtime's name ("containerd", "cri-o"); empty means the scheme of the
// container's status replaced, else of the pod's other container IDs, else
// DefaultRuntimeScheme.
func TerminatedStatuses(pod *corev1.Pod, exits []ContainerState, scheme string) (init, app []corev1.ContainerStatus, changed bool) {
	init = deepCopyStatuses(pod.Status.InitContainerStatuses)
	app = deepCopyStatuses(pod.Status.ContainerStatuses)
	todo := exitsToWrite(pod, exits)
	if len(todo) == 0 {
		return init, app, false
	}
	podScheme := schemeOf(pod)
	for _, e := range todo {
		c, isInit, _ := findContainer(pod, e.Name)
		list := &app
		if isInit {
			list = &init
		}
		i := statusIndex(*list, e.Name)
		if i < 0 {
			*list = append(*list, corev1.ContainerStatus{Name: e.Name, Image: c.Image, RestartCount: max(e.Attempt, 0)})
			i = len(*list) - 1
		}
		st := &(*list)[i]
		id := ""
		if e.ContainerID != "" {
			sch := scheme
			if sch == "" {
				// The scheme of the status replaced, else of the pod's others.
				if s, _, ok := strings.Cut(st.ContainerID, "://"); ok && s != "" {
					sch = s
				} else {
					sch = podScheme
				}
			}
			id = sch + "://" + bareID(e.ContainerID)
		}
		st.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode:    e.ExitCode,
			Reason:      terminatedReason(e),
			StartedAt:   metav1.NewTime(e.StartedAt),
			FinishedAt:  metav1.NewTime(e.FinishedAt),
			ContainerID: id,
		}}
		if id != "" {
			st.ContainerID = id
		}
		st.Ready = false
		started := false
		st.Started = &started
		changed = true
	}
	return init, app, changed
}

// terminatedReason is the runtime's reason, else what the kubelet writes for
// an exit without one (kubelet's toContainerStatus: "Completed" for 0, "Error"
// otherwise).
func terminatedReason(e ContainerState) string {
	switch {
	case e.Reason != "":
		return e.Reason
	case e.ExitCode == 0:
		return "Completed"
	}
	return "Error"
}

func findStatus(pod *corev1.Pod, name string) *corev1.ContainerStatus {
	for _, list := range [][]corev1.ContainerStatus{pod.Status.ContainerStatuses, pod.Status.InitContainerStatuses} {
		if i := statusIndex(list, name); i >= 0 {
			return &list[i]
		}
	}
	return nil
}

func statusIndex(list []corev1.ContainerStatus, name string) int {
	for i := range list {
		if list[i].Name == name {
			return i
		}
	}
	return -1
}

func deepCopyStatuses(in []corev1.ContainerStatus) []corev1.ContainerStatus {
	if in == nil {
		return nil
	}
	out := make([]corev1.ContainerStatus, len(in))
	for i := range in {
		in[i].DeepCopyInto(&out[i])
	}
	return out
}

// schemeOf is the scheme of the pod's container IDs, DefaultRuntimeScheme when
// none has one.
func schemeOf(pod *corev1.Pod) string {
	for _, list := range [][]corev1.ContainerStatus{pod.Status.ContainerStatuses, pod.Status.InitContainerStatuses} {
		for _, st := range list {
			if scheme, _, ok := strings.Cut(st.ContainerID, "://"); ok && scheme != "" {
				return scheme
			}
		}
	}
	return DefaultRuntimeScheme
}

// bareID strips a scheme:// prefix.
func bareID(id string) string {
	if _, rest, ok := strings.Cut(id, "://"); ok {
		return rest
	}
	return id
}
