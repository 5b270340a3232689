package cri

import (
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func ctrStatus(id string, state runtimeapi.ContainerState, code int32) *runtimeapi.ContainerStatus {
	return &runtimeapi.ContainerStatus{
		Id: id, State: state, ExitCode: code, Labels: labels("ns", "pod", "app"),
		Metadata:  &runtimeapi.ContainerMetadata{Name: "app", Attempt: 2},
		StartedAt: time.Unix(10, 0).UnixNano(), FinishedAt: time.Unix(20, 0).UnixNano(),
	}
}

func TestTrackerObserve(t *testing.T) {
	now := time.Unix(1000, 0)
	for _, tc := range []struct {
		name     string
		statuses []*runtimeapi.ContainerStatus
		want     []Kind
	}{
		{
			name:     "running then exited: Started then Exited",
			statuses: []*runtimeapi.ContainerStatus{ctrStatus("c", running, 0), ctrStatus("c", exited, 1)},
			want:     []Kind{Started, Exited},
		},
		{
			name:     "first seen exited: Exited only",
			statuses: []*runtimeapi.ContainerStatus{ctrStatus("c", exited, 1)},
			want:     []Kind{Exited},
		},
		{
			name:     "the same exit from two sources: once",
			statuses: []*runtimeapi.ContainerStatus{ctrStatus("c", running, 0), ctrStatus("c", exited, 1), ctrStatus("c", exited, 1)},
			want:     []Kind{Started, Exited},
		},
		{
			name:     "a stale running status after the exit: nothing",
			statuses: []*runtimeapi.ContainerStatus{ctrStatus("c", exited, 1), ctrStatus("c", running, 0)},
			want:     []Kind{Exited},
		},
		{
			name:     "created and unknown states: nothing",
			statuses: []*runtimeapi.ContainerStatus{ctrStatus("c", created, 0), ctrStatus("c", runtimeapi.ContainerState_CONTAINER_UNKNOWN, 0)},
		},
		{
			name:     "running twice: one Started",
			statuses: []*runtimeapi.ContainerStatus{ctrStatus("c", running, 0), ctrStatus("c", running, 0)},
			want:     []Kind{Started},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := newTracker()
			var got []Kind
			for _, st := range tc.statuses {
				if ev, ok := tr.observe(st, nil, "s", SourceRelist, now); ok {
					got = append(got, ev.Kind)
					if ev.PodName != "pod" || ev.ContainerName != "app" || ev.Attempt != 2 || ev.SandboxID != "s" {
						t.Errorf("identity %+v", ev)
					}
				}
			}
			if len(got) != len(tc.want) {
				t.Fatalf("events %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("events %v, want %v", got, tc.want)
				}
			}
		})
	}
}

func TestTrackerListAndForget(t *testing.T) {
	tr := newTracker()
	now := time.Unix(1000, 0)
	c := func(id string, state runtimeapi.ContainerState) *runtimeapi.Container {
		return &runtimeapi.Container{Id: id, State: state, Labels: labels("ns", "pod", "app"), PodSandboxId: "s"}
	}

	begin := tr.beginList()
	if !tr.listed(c("a", running)) {
		t.Error("a new running container needs its status")
	}
	tr.observe(ctrStatus("a", running, 0), nil, "s", SourceRelist, now)
	tr.observe(ctrStatus("b", exited, 1), nil, "s", SourceRelist, now)
	tr.endList(begin)

	begin = tr.beginList()
	if tr.listed(c("a", running)) {
		t.Error("a running container already reported needs no status")
	}
	if !tr.listed(c("a", exited)) {
		t.Error("a container that exited since needs its status")
	}
	if tr.listed(c("b", exited)) {
		t.Error("an exit already emitted needs no status")
	}
	if tr.listed(&runtimeapi.Container{Id: "x", State: exited}) {
		t.Error("an unlabelled container needs no status")
	}
	// c is reported by another source while the list is under way: not in this list, but
	// it must not be forgotten.
	tr.observe(ctrStatus("c", running, 0), nil, "s", SourceContainerd, now)
	tr.endList(begin)
	if !tr.known("a") || !tr.known("b") || !tr.known("c") {
		t.Errorf("forgot a container: a=%v b=%v c=%v", tr.known("a"), tr.known("b"), tr.known("c"))
	}

	// b is removed from the runtime: the next list forgets it; x is counted once.
	begin = tr.beginList()
	tr.listed(c("a", exited))
	tr.listed(c("c", running))
	tr.listed(&runtimeapi.Container{Id: "x", State: exited})
	tr.endList(begin)
	if tr.known("b") {
		t.Error("b not forgotten after it was removed")
	}
	if tr.ignoredTotal != 1 {
		t.Errorf("ignoredTotal = %d, want 1", tr.ignoredTotal)
	}
	begin = tr.beginList()
	tr.endList(begin)
	if len(tr.ignored) != 0 || len(tr.containers) != 0 {
		t.Errorf("an empty list keeps %v and %v", tr.ignored, tr.containers)
	}
}

func TestTrackerOOM(t *testing.T) {
	tr := newTracker()
	now := time.Unix(1000, 0)
	if _, ok := tr.oom("c", now, now); ok {
		t.Error("OOM for an unknown container")
	}
	tr.observe(ctrStatus("c", running, 0), nil, "s", SourceRelist, now)
	ev, ok := tr.oom("c", time.Unix(5, 0), now)
	if !ok || ev.Kind != OOM || ev.PodName != "pod" || !ev.OOMAt.Equal(time.Unix(5, 0)) || ev.Source != SourceContainerd {
		t.Errorf("OOM event %+v, %v", ev, ok)
	}
}

func TestParseInfoAndLimits(t *testing.T) {
	for _, tc := range []struct {
		name      string
		info      map[string]string
		resources *runtimeapi.ContainerResources
		wantPath  string
		wantLimit int64
		wantPID   int
	}{
		{
			name:     "containerd 1.6 verbose info",
			info:     map[string]string{"info": `{"sandboxID":"s","pid":7,"runtimeSpec":{"ociVersion":"1.0.2-dev","linux":{"resources":{"memory":{"limit":20971520,"swap":20971520}},"cgroupsPath":"/coroner/pod1/c"}}}`},
			wantPath: "/coroner/pod1/c", wantLimit: 20 << 20, wantPID: 7,
		},
		{
			// containerd v1.7.34 pkg/cri/server/container_status.go and v2.3.4
			// internal/cri/server/container_status.go: ContainerInfo, Pid uint32 `json:"pid"`.
			name:     "containerd 2.x verbose info",
			info:     map[string]string{"info": `{"sandboxID":"s","pid":4242,"removing":false,"snapshotKey":"c","snapshotter":"overlayfs","runtimeType":"io.containerd.runc.v2","runtimeOptions":{"systemd_cgroup":true},"config":{"metadata":{"name":"app"}},"runtimeSpec":{"linux":{"resources":{"memory":{"limit":1048576}},"cgroupsPath":"kubepods-pod1.slice:cri-containerd:c"}}}`},
			wantPath: "kubepods-pod1.slice:cri-containerd:c", wantLimit: 1 << 20, wantPID: 4242,
		},
		{
			// CRI-O v1.36 server/container_status.go: containerInfo{SandboxID, Pid int
			// `json:"pid"`, RuntimeSpec, Privileged}, returned as {"info": <json>}.
			name:     "CRI-O verbose info",
			info:     map[string]string{"info": `{"sandboxID":"s","pid":31337,"runtimeSpec":{"ociVersion":"1.2.0","linux":{"resources":{"memory":{"limit":2097152}},"cgroupsPath":"kubepods-burstable-pod1.slice:crio:c"}},"privileged":false}`},
			wantPath: "kubepods-burstable-pod1.slice:crio:c", wantLimit: 2 << 20, wantPID: 31337,
		},
		{
			// CRI-O with checkpoint/restore on embeds two structs: still top-level "pid".
			name:    "CRI-O verbose info with checkpoint fields",
			info:    map[string]string{"info": `{"sandboxID":"s","pid":9,"runtimeSpec":{},"privileged":true,"checkpointedAt":"0001-01-01T00:00:00Z","restored":false}`},
			wantPID: 9,
		},
		{
			name: "an exited container: pid 0 is unknown",
			info: map[string]string{"info": `{"sandboxID":"s","pid":0,"runtimeSpec":{}}`},
		},
		{
			name:     "systemd driver: the path as reported",
			info:     map[string]string{"info": `{"runtimeSpec":{"linux":{"cgroupsPath":"kubepods-burstable-pod1.slice:cri-containerd:c"}}}`},
			wantPath: "kubepods-burstable-pod1.slice:cri-containerd:c",
		},
		{
			name:      "the status's resources win over the spec",
			info:      map[string]string{"info": `{"runtimeSpec":{"linux":{"resources":{"memory":{"limit":1}}}}}`},
			resources: &runtimeapi.ContainerResources{Linux: &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 64 << 20}},
			wantLimit: 64 << 20,
		},
		{name: "no info"},
		{name: "not JSON", info: map[string]string{"info": "{"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := ctrStatus("c", running, 0)
			st.Resources = tc.resources
			var ev ContainerEvent
			mergeIdentity(&ev, st, tc.info)
			if ev.CgroupPath != tc.wantPath || ev.MemoryLimit != tc.wantLimit || ev.PID != tc.wantPID {
				t.Errorf("cgroup %q limit %d pid %d, want %q %d %d", ev.CgroupPath, ev.MemoryLimit, ev.PID, tc.wantPath, tc.wantLimit, tc.wantPID)
			}
		})
	}
}

// TestTrackerKeepsLastKnownPID: a stop event of the CRI stream carries statuses without
// verbose info, and a verbose status of an exited container may say pid 0; the exit still
// names the PID the container ran as.
func TestTrackerKeepsLastKnownPID(t *testing.T) {
	tr := newTracker()
	now := time.Unix(1000, 0)
	ev, ok := tr.observe(ctrStatus("c", running, 0), map[string]string{"info": `{"pid":77}`}, "s", SourceRelist, now)
	if !ok || ev.PID != 77 {
		t.Fatalf("Started %+v, want pid 77", ev)
	}
	ev, ok = tr.observe(ctrStatus("c", exited, 1), nil, "s", SourceCRIEvents, now)
	if !ok || ev.Kind != Exited || ev.PID != 77 {
		t.Errorf("Exited from a stream event %+v, want the last known pid 77", ev)
	}
	tr2 := newTracker()
	tr2.observe(ctrStatus("d", running, 0), map[string]string{"info": `{"pid":78}`}, "s", SourceRelist, now)
	if ev, _ := tr2.observe(ctrStatus("d", exited, 1), map[string]string{"info": `{"pid":0}`}, "s", SourceRelist, now); ev.PID != 78 {
		t.Errorf("Exited with verbose pid 0: pid %d, want 78", ev.PID)
	}
	if ev, _ := tr2.oom("d", now, now); ev.PID != 78 {
		t.Errorf("OOM pid %d, want 78", ev.PID)
	}
}
