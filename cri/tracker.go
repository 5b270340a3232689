package cri

import (
	"encoding/json"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// tracker remembers what has been emitted for each container, so that every exit is
// emitted once whichever source reports it and however often. It does no I/O; the
// Watcher calls it under its lock.
//
// A relist forgets the containers the runtime no longer lists (removed containers never
// come back: a restart is a new container with a new id). Every observation gets a
// sequence number, so that a relist only forgets what was last observed before its
// ListContainers call started, not a container that another source reported meanwhile.
type tracker struct {
	containers map[string]*tracked
	// ignored holds the ids of containers without the kubelet's labels (with the sequence
	// number of their last observation), so that each is counted once.
	ignored      map[string]uint64
	ignoredTotal uint64
	seq          uint64
}

// tracked is one labelled container.
type tracked struct {
	identity ContainerEvent // identity, cgroup path and limit, as last seen
	started  bool           // Started emitted (or skipped because first seen exited)
	exited   bool           // Exited emitted
	lastSeq  uint64         // sequence number of the last observation
}

func newTracker() *tracker {
	return &tracker{containers: map[string]*tracked{}, ignored: map[string]uint64{}}
}

// hasKubeletLabels reports whether labels name a pod and a container.
func hasKubeletLabels(labels map[string]string) bool {
	for _, k := range []string{LabelPodNamespace, LabelPodName, LabelPodUID, LabelContainerName} {
		if labels[k] == "" {
			return false
		}
	}
	return true
}

// next returns a new sequence number.
func (t *tracker) next() uint64 {
	t.seq++
	return t.seq
}

// ignore counts a container without the kubelet's labels, once.
func (t *tracker) ignore(id string) {
	if _, ok := t.ignored[id]; !ok {
		t.ignoredTotal++
	}
	t.ignored[id] = t.next()
}

// beginList is called before ListContainers; its result goes to endList.
func (t *tracker) beginList() uint64 { return t.next() }

// listed records a container from ListContainers and reports whether its status must be
// fetched because something may have to be emitted.
func (t *tracker) listed(c *runtimeapi.Container) bool {
	if !hasKubeletLabels(c.GetLabels()) {
		t.ignore(c.GetId())
		return false
	}
	tr := t.containers[c.GetId()]
	if tr != nil {
		tr.lastSeq = t.next()
		if tr.identity.SandboxID == "" {
			tr.identity.SandboxID = c.GetPodSandboxId()
		}
	}
	return needsStatus(tr, c.GetState())
}

// endList forgets the containers and ignored ids that were last observed before the list
// began and are not in it.
func (t *tracker) endList(begin uint64) {
	for id, c := range t.containers {
		if c.lastSeq <= begin {
			delete(t.containers, id)
		}
	}
	for id, seq := range t.ignored {
		if seq <= begin {
			delete(t.ignored, id)
		}
	}
}

func needsStatus(tr *tracked, state runtimeapi.ContainerState) bool {
	switch state {
	case runtimeapi.ContainerState_CONTAINER_RUNNING:
		return tr == nil || !tr.started && !tr.exited
	case runtimeapi.ContainerState_CONTAINER_EXITED:
		return tr == nil || !tr.exited
	}
	return false
}

// forget drops a container the runtime deleted.
func (t *tracker) forget(id string) {
	delete(t.containers, id)
	delete(t.ignored, id)
}

// observe applies a container status (with the verbose info, if fetched) and returns the
// event to emit, if any.
// sandboxID is the pod sandbox's id when the caller knows it (the CRI status does not say).
func (t *tracker) observe(st *runtimeapi.ContainerStatus, info map[string]string, sandboxID, source string, now time.Time) (ContainerEvent, bool) {
	if st == nil {
		return ContainerEvent{}, false
	}
	if !hasKubeletLabels(st.GetLabels()) {
		t.ignore(st.GetId())
		return ContainerEvent{}, false
	}
	tr := t.containers[st.GetId()]
	if tr == nil {
		tr = &tracked{}
		t.containers[st.GetId()] = tr
	}
	tr.lastSeq = t.next()
	if sandboxID != "" {
		tr.identity.SandboxID = sandboxID
	}
	mergeIdentity(&tr.identity, st, info)
	ev := tr.identity
	ev.Source, ev.ObservedAt = source, now
	switch st.GetState() {
	case runtimeapi.ContainerState_CONTAINER_RUNNING:
		if tr.started || tr.exited {
			return ContainerEvent{}, false
		}
		tr.started = true
		ev.Kind = Started
		return ev, true
	case runtimeapi.ContainerState_CONTAINER_EXITED:
		if tr.exited {
			return ContainerEvent{}, false
		}
		tr.started, tr.exited = true, true
		ev.Kind = Exited
		ev.ExitCode = st.GetExitCode()
		ev.Reason = st.GetReason()
		ev.Message = st.GetMessage()
		ev.FinishedAt = nanos(st.GetFinishedAt())
		return ev, true
	}
	return ContainerEvent{}, false
}

// oom returns the OOM event for a container the tracker knows, if it does.
func (t *tracker) oom(id string, at, now time.Time) (ContainerEvent, bool) {
	tr := t.containers[id]
	if tr == nil {
		return ContainerEvent{}, false
	}
	ev := tr.identity
	ev.Kind, ev.OOMAt, ev.Source, ev.ObservedAt = OOM, at, SourceContainerd, now
	return ev, true
}

// exitEmitted reports whether the container's exit has been emitted.
func (t *tracker) exitEmitted(id string) bool {
	tr := t.containers[id]
	return tr != nil && tr.exited
}

// known reports whether the tracker has the container's identity.
func (t *tracker) known(id string) bool { return t.containers[id] != nil }

// mergeIdentity copies what a status says about who the container is into ev, keeping
// the cgroup path, limit and PID already known when this status does not have them
// (stream events carry no verbose info; a verbose status may say pid 0 once the task is
// gone).
func mergeIdentity(ev *ContainerEvent, st *runtimeapi.ContainerStatus, info map[string]string) {
	l := st.GetLabels()
	ev.PodNamespace, ev.PodName, ev.PodUID = l[LabelPodNamespace], l[LabelPodName], l[LabelPodUID]
	ev.ContainerName = l[LabelContainerName]
	ev.ContainerID = st.GetId()
	ev.Attempt = st.GetMetadata().GetAttempt()
	if t := nanos(st.GetStartedAt()); !t.IsZero() {
		ev.StartedAt = t
	}
	spec := parseInfo(info)
	if spec.cgroupPath != "" {
		ev.CgroupPath = spec.cgroupPath
	}
	if ev.SandboxID == "" {
		ev.SandboxID = spec.sandboxID
	}
	if spec.pid > 0 {
		ev.PID = spec.pid
	}
	if m := st.GetResources().GetLinux().GetMemoryLimitInBytes(); m > 0 {
		ev.MemoryLimit = m
	} else if spec.memoryLimit > 0 {
		ev.MemoryLimit = spec.memoryLimit
	}
}

// verboseInfo is what the watcher reads from a verbose ContainerStatus.
type verboseInfo struct {
	cgroupPath  string
	memoryLimit int64
	sandboxID   string
	pid         int
}

// parseInfo reads the "info" entry of a verbose ContainerStatus: a JSON object with the
// container's OCI runtime spec in containerd (1.6 and later) and CRI-O alike, and the
// container's init PID under the same key "pid" in both:
//   - containerd: ContainerInfo{SandboxID `json:"sandboxID"`, Pid uint32 `json:"pid"`,
//     ..., RuntimeSpec `json:"runtimeSpec"`} in pkg/cri/server/container_status.go
//     (v1.6, v1.7.34) and internal/cri/server/container_status.go (v2.3.4);
//   - CRI-O: containerInfo{SandboxID `json:"sandboxID"`, Pid int `json:"pid"`,
//     RuntimeSpec `json:"runtimeSpec"`, Privileged `json:"privileged"`} in
//     server/container_status.go (v1.36), marshalled into info["info"] as well.
func parseInfo(info map[string]string) verboseInfo {
	raw := info["info"]
	if raw == "" {
		return verboseInfo{}
	}
	var v struct {
		SandboxID   string `json:"sandboxID"`
		PID         int64  `json:"pid"`
		RuntimeSpec struct {
			Linux struct {
				CgroupsPath string `json:"cgroupsPath"`
				Resources   struct {
					Memory struct {
						Limit int64 `json:"limit"`
					} `json:"memory"`
				} `json:"resources"`
			} `json:"linux"`
		} `json:"runtimeSpec"`
	}
	if err := json.Unmarshal([]byte(raw), &v); err != nil {
		return verboseInfo{}
	}
	return verboseInfo{
		cgroupPath:  v.RuntimeSpec.Linux.CgroupsPath,
		memoryLimit: v.RuntimeSpec.Linux.Resources.Memory.Limit,
		sandboxID:   v.SandboxID,
		pid:         int(max(v.PID, 0)),
	}
}

// nanos converts CRI's nanoseconds since the epoch; 0 means unknown.
func nanos(ns int64) time.Time {
	if ns <= 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}
