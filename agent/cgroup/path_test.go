package cgroup

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

const (
	uid       = "0f4d5a5e-7c2b-4a8e-9d3a-2b1c9f6e8a11"
	uidSysd   = "0f4d5a5e_7c2b_4a8e_9d3a_2b1c9f6e8a11"
	staticUID = "5b6f2f1f8d7c6e4d3b2a19081726354a"
	cid       = "3e5e5eab87df615f4777e6f7f261a7fb62f4a7ee5bc3e25e3a5b5223ccd368fe"
)

func TestParsePath(t *testing.T) {
	cases := map[string]struct {
		path string
		want Path
	}{
		"root": {
			path: "/",
			want: Path{Path: "/", Level: LevelRoot},
		},
		"empty is the root": {
			path: "",
			want: Path{Path: "/", Level: LevelRoot},
		},
		"kubelet cgroup root of a lab node is other": {
			path: "/node-a",
			want: Path{Path: "/node-a", Level: LevelOther},
		},
		"system.slice is other": {
			path: "/system.slice/containerd.service",
			want: Path{Path: "/system.slice/containerd.service", Level: LevelOther},
		},
		"cgroupfs kubepods": {
			path: "/kubepods",
			want: Path{Path: "/kubepods", Level: LevelKubepods, Kubepods: "/kubepods"},
		},
		"cgroupfs kubepods under a per-node cgroup root": {
			path: "/node-a/kubepods",
			want: Path{Path: "/node-a/kubepods", Level: LevelKubepods, Kubepods: "/node-a/kubepods"},
		},
		"cgroupfs burstable QoS cgroup": {
			path: "/node-a/kubepods/burstable",
			want: Path{Path: "/node-a/kubepods/burstable", Level: LevelQoS, Kubepods: "/node-a/kubepods",
				QoS: "burstable", QoSPath: "/node-a/kubepods/burstable"},
		},
		"cgroupfs besteffort QoS cgroup, trailing slash": {
			path: "/kubepods/besteffort/",
			want: Path{Path: "/kubepods/besteffort", Level: LevelQoS, Kubepods: "/kubepods",
				QoS: "besteffort", QoSPath: "/kubepods/besteffort"},
		},
		"cgroupfs burstable pod under a cgroup root (the lab's oom_memcg)": {
			path: "/node-a/kubepods/burstable/pod" + uid,
			want: Path{Path: "/node-a/kubepods/burstable/pod" + uid, Level: LevelPod, Kubepods: "/node-a/kubepods",
				QoS: "burstable", QoSPath: "/node-a/kubepods/burstable",
				Pod: "/node-a/kubepods/burstable/pod" + uid, PodUID: uid},
		},
		"cgroupfs container of a burstable pod (task_memcg)": {
			path: "/kubepods/burstable/pod" + uid + "/" + cid,
			want: Path{Path: "/kubepods/burstable/pod" + uid + "/" + cid, Level: LevelContainer, Kubepods: "/kubepods",
				QoS: "burstable", QoSPath: "/kubepods/burstable",
				Pod: "/kubepods/burstable/pod" + uid, PodUID: uid,
				Container: "/kubepods/burstable/pod" + uid + "/" + cid, ContainerID: cid},
		},
		"cgroupfs guaranteed pod has no QoS cgroup": {
			path: "/kubepods/pod" + uid + "/" + cid,
			want: Path{Path: "/kubepods/pod" + uid + "/" + cid, Level: LevelContainer, Kubepods: "/kubepods",
				Pod: "/kubepods/pod" + uid, PodUID: uid,
				Container: "/kubepods/pod" + uid + "/" + cid, ContainerID: cid},
		},
		"cgroupfs static pod with a hash UID": {
			path: "/kubepods/burstable/pod" + staticUID,
			want: Path{Path: "/kubepods/burstable/pod" + staticUID, Level: LevelPod, Kubepods: "/kubepods",
				QoS: "burstable", QoSPath: "/kubepods/burstable",
				Pod: "/kubepods/burstable/pod" + staticUID, PodUID: staticUID},
		},
		"below a container's cgroup is the container level": {
			path: "/kubepods/besteffort/pod" + uid + "/" + cid + "/nested",
			want: Path{Path: "/kubepods/besteffort/pod" + uid + "/" + cid + "/nested", Level: LevelContainer, Kubepods: "/kubepods",
				QoS: "besteffort", QoSPath: "/kubepods/besteffort",
				Pod: "/kubepods/besteffort/pod" + uid, PodUID: uid,
				Container: "/kubepods/besteffort/pod" + uid + "/" + cid, ContainerID: cid},
		},
		"systemd kubepods slice": {
			path: "/kubepods.slice",
			want: Path{Path: "/kubepods.slice", Level: LevelKubepods, Kubepods: "/kubepods.slice", Systemd: true},
		},
		"systemd burstable slice": {
			path: "/kubepods.slice/kubepods-burstable.slice",
			want: Path{Path: "/kubepods.slice/kubepods-burstable.slice", Level: LevelQoS, Kubepods: "/kubepods.slice",
				QoS: "burstable", QoSPath: "/kubepods.slice/kubepods-burstable.slice", Systemd: true},
		},
		"systemd burstable pod with underscores in the UID": {
			path: "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uidSysd + ".slice",
			want: Path{Path: "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uidSysd + ".slice", Level: LevelPod,
				Kubepods: "/kubepods.slice", QoS: "burstable", QoSPath: "/kubepods.slice/kubepods-burstable.slice",
				Pod: "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uidSysd + ".slice", PodUID: uid, Systemd: true},
		},
		"systemd containerd scope": {
			path: "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + uidSysd + ".slice/cri-containerd-" + cid + ".scope",
			want: Path{Path: "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + uidSysd + ".slice/cri-containerd-" + cid + ".scope",
				Level: LevelContainer, Kubepods: "/kubepods.slice", QoS: "besteffort", QoSPath: "/kubepods.slice/kubepods-besteffort.slice",
				Pod: "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + uidSysd + ".slice", PodUID: uid,
				Container:   "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + uidSysd + ".slice/cri-containerd-" + cid + ".scope",
				ContainerID: cid, Systemd: true},
		},
		"systemd guaranteed pod with a crio scope": {
			path: "/kubepods.slice/kubepods-pod" + uidSysd + ".slice/crio-" + cid + ".scope",
			want: Path{Path: "/kubepods.slice/kubepods-pod" + uidSysd + ".slice/crio-" + cid + ".scope", Level: LevelContainer,
				Kubepods: "/kubepods.slice", Pod: "/kubepods.slice/kubepods-pod" + uidSysd + ".slice", PodUID: uid,
				Container: "/kubepods.slice/kubepods-pod" + uidSysd + ".slice/crio-" + cid + ".scope", ContainerID: cid, Systemd: true},
		},
		"container element that is not an ID is kept as is": {
			path: "/kubepods/pod" + uid + "/sandbox",
			want: Path{Path: "/kubepods/pod" + uid + "/sandbox", Level: LevelContainer, Kubepods: "/kubepods",
				Pod: "/kubepods/pod" + uid, PodUID: uid, Container: "/kubepods/pod" + uid + "/sandbox", ContainerID: "sandbox"},
		},
		"podman is not a pod": {
			path: "/machine.slice/libpod-" + cid + ".scope/container",
			want: Path{Path: "/machine.slice/libpod-" + cid + ".scope/container", Level: LevelOther},
		},
		"a short pod-looking element is not a pod": {
			path: "/kubepods/burstable/podcast",
			want: Path{Path: "/kubepods/burstable/podcast", Level: LevelOther, Kubepods: "/kubepods",
				QoS: "burstable", QoSPath: "/kubepods/burstable"},
		},
		"relative path reads as absolute": {
			path: "kubepods/burstable",
			want: Path{Path: "/kubepods/burstable", Level: LevelQoS, Kubepods: "/kubepods",
				QoS: "burstable", QoSPath: "/kubepods/burstable"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, ParsePath(tc.path)); diff != "" {
				t.Errorf("ParsePath(%q) mismatch (-want +got):\n%s", tc.path, diff)
			}
		})
	}
}

func TestPodUIDAndContainerIDFromPath(t *testing.T) {
	cases := map[string]struct {
		path    string
		wantUID string
		wantCID string
	}{
		"cgroupfs container":      {path: "/kubepods/burstable/pod" + uid + "/" + cid, wantUID: uid, wantCID: cid},
		"systemd containerd":      {path: "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uidSysd + ".slice/cri-containerd-" + cid + ".scope", wantUID: uid, wantCID: cid},
		"systemd docker":          {path: "/kubepods.slice/kubepods-pod" + uidSysd + ".slice/docker-" + cid + ".scope", wantUID: uid, wantCID: cid},
		"pod only":                {path: "/kubepods/besteffort/pod" + uid, wantUID: uid},
		"QoS only":                {path: "/kubepods/besteffort"},
		"not kubernetes":          {path: "/user.slice/user-0.slice/session-1.scope"},
		"sysfs prefix is allowed": {path: "/sys/fs/cgroup/memory/kubepods/pod" + uid + "/" + cid, wantUID: uid, wantCID: cid},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			gotUID, ok := PodUIDFromPath(tc.path)
			if gotUID != tc.wantUID || ok != (tc.wantUID != "") {
				t.Errorf("PodUIDFromPath(%q) = %q, %v; want %q", tc.path, gotUID, ok, tc.wantUID)
			}
			gotCID, ok := ContainerIDFromPath(tc.path)
			if gotCID != tc.wantCID || ok != (tc.wantCID != "") {
				t.Errorf("ContainerIDFromPath(%q) = %q, %v; want %q", tc.path, gotCID, ok, tc.wantCID)
			}
		})
	}
}

func TestWithin(t *testing.T) {
	cases := map[string]struct {
		path, ancestor string
		want           bool
	}{
		"equal":                        {"/kubepods/pod1", "/kubepods/pod1", true},
		"child":                        {"/kubepods/pod1/c", "/kubepods/pod1", true},
		"sibling with a common prefix": {"/kubepods/pod12", "/kubepods/pod1", false},
		"parent is not within child":   {"/kubepods", "/kubepods/pod1", false},
		"root contains everything":     {"/kubepods/pod1", "/", true},
		"trailing slashes":             {"/kubepods/pod1/", "/kubepods/", true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := Within(tc.path, tc.ancestor); got != tc.want {
				t.Errorf("Within(%q, %q) = %v, want %v", tc.path, tc.ancestor, got, tc.want)
			}
		})
	}
}

func TestSameUID(t *testing.T) {
	if !SameUID(uid, uidSysd) {
		t.Errorf("SameUID(dashes, underscores) = false")
	}
	if SameUID("", "") {
		t.Errorf("SameUID of two empty UIDs = true")
	}
	if SameUID(uid, staticUID) {
		t.Errorf("SameUID of different UIDs = true")
	}
}

func TestFromSystemd(t *testing.T) {
	cases := map[string]struct {
		in      string
		want    string
		wantErr bool
	}{
		"containerd burstable": {
			in:   "kubepods-burstable-pod" + uidSysd + ".slice:cri-containerd:" + cid,
			want: "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uidSysd + ".slice/cri-containerd-" + cid + ".scope",
		},
		"crio guaranteed": {
			in:   "kubepods-pod" + uidSysd + ".slice:crio:" + cid,
			want: "/kubepods.slice/kubepods-pod" + uidSysd + ".slice/crio-" + cid + ".scope",
		},
		"no prefix":                  {in: "system.slice::foo", want: "/system.slice/foo.scope"},
		"name is a slice":            {in: "kubepods.slice::kubepods-besteffort.slice", want: "/kubepods.slice/kubepods-besteffort.slice"},
		"root slice":                 {in: "-.slice:p:n", want: "/p-n.scope"},
		"already a path":             {in: "/kubepods/burstable/pod" + uid + "/" + cid + "/", want: "/kubepods/burstable/pod" + uid + "/" + cid},
		"two parts is an error":      {in: "kubepods.slice:cri-containerd", wantErr: true},
		"no .slice is an error":      {in: "kubepods:cri-containerd:x", wantErr: true},
		"empty component is error":   {in: "kubepods--x.slice:p:n", wantErr: true},
		"empty name is an error":     {in: "kubepods.slice:p:", wantErr: true},
		"slash in slice is an error": {in: "a/b.slice:p:n", wantErr: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := FromSystemd(tc.in)
			if (err != nil) != tc.wantErr {
				t.Fatalf("FromSystemd(%q) error = %v, want error %v", tc.in, err, tc.wantErr)
			}
			if got != tc.want {
				t.Errorf("FromSystemd(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}
