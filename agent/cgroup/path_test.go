package cgroup

import (
	"os"
	"path/filepath"
	"strings"
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

// realPaths loads testdata/paths.txt: cgroup paths of real nodes, by name.
func realPaths(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "paths.txt"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, p, ok := strings.Cut(line, "\t")
		if !ok {
			t.Fatalf("testdata/paths.txt: %q has no tab", line)
		}
		out[name] = p
	}
	return out
}

// TestParsePathRealNodes reads the Kubernetes levels of the cgroup paths real nodes
// printed (sources in testdata/paths.txt): the systemd driver's slices, kind's
// kubelet- cgroup root, host prefixes of nested nodes, static pods' hash UIDs.
func TestParsePathRealNodes(t *testing.T) {
	paths := realPaths(t)
	cases := map[string]struct {
		wantLevel    Level
		wantKubepods string // the kubepods element's path
		wantQoS      string
		wantUID      string
		wantCID      string
	}{
		"kind-3169-oom-memcg": {wantLevel: LevelPod,
			wantKubepods: "/system.slice/docker-b2b75b11f95220f9267e53d48df2d654d585405c36b4c752302ab39da59d74e6.scope/kubelet.slice/kubelet-kubepods.slice",
			wantQoS:      "burstable", wantUID: "68e0cbcc-0cf8-48fc-9a5c-bbb45350dd13"},
		"nri-227-kind-container": {wantLevel: LevelContainer, wantKubepods: "/kubelet.slice/kubelet-kubepods.slice", wantQoS: "besteffort",
			wantUID: "1e597579-417e-482f-bf65-5fe170c3aebd", wantCID: "a09bc17f5aa29b0dbdec9ede5f46cf1396d2405917ab02e6f1eb1019f388396e"},
		"gpud-lxc-task-memcg": {wantLevel: LevelContainer, wantKubepods: "/lxc.payload.ny2g2r5hh3-lxc/kubepods.slice", wantQoS: "burstable",
			wantUID: "a8697f49-441d-4d4f-90d2-6d8e1fa3bbe7", wantCID: "3fc28fa1c647ceede9f6b340d0b16c9f1f663698972d22a52e296f291638e014"},
		"gpud-lxc-oom-memcg": {wantLevel: LevelPod, wantKubepods: "/lxc.payload.ny2g2r5hh3-lxc/kubepods.slice", wantQoS: "burstable",
			wantUID: "a8697f49-441d-4d4f-90d2-6d8e1fa3bbe7"},
		"minikube-11280-crio": {wantLevel: LevelContainer,
			wantKubepods: "/docker/d6701ec289c56e4391acb11d07474b3139466857a305490575508a8b7a9fcf22/kubepods.slice", wantQoS: "besteffort",
			wantUID: "2ca4a155-3599-498d-bb9d-4446693fa3ea", wantCID: "358607a37e7ada357032e7f5729c9ae6a3efdb7962acbcbe47ff6a3c5506cb1c"},
		"istio-42734-docker-scope": {wantLevel: LevelContainer, wantKubepods: "/kubepods.slice", wantQoS: "burstable",
			wantUID: "0330b2c1-a15b-4cdd-b5e5-72d4a90bee82", wantCID: "b27201334a41cd0749d053b18378d7ea65617b8e26277197ea25c974da1a5a8a"},
		"efs-1218-containerd-scope": {wantLevel: LevelContainer, wantKubepods: "/kubepods.slice", wantQoS: "burstable",
			wantUID: "06d44939-d15e-491f-84a3-2dbba9fc0440", wantCID: "f6b09caae6cfa22cd45491888e0e7001c0b690f8b3c9b47e1bc20d69315e722c"},
		"pharos-440-besteffort": {wantLevel: LevelContainer, wantKubepods: "/kubepods.slice", wantQoS: "besteffort",
			wantUID: "9692aa0e-748e-11e8-8dfa-76d458035df6", wantCID: "abddff03dfd7710c79a750ce3e730365cbb2c8247a974170c1062683bc3e9152"},
		"datadog-kind-static-pod": {wantLevel: LevelContainer, wantKubepods: "/kubelet.slice/kubelet-kubepods.slice", wantQoS: "burstable",
			wantUID: "99dcb84d2a34f7e338778606703258c4", wantCID: "022c4ffba65e5031285fd427553e56c3fd6cc85a3a49f3fa2825d0a258d8a5d6"},
		"eks-419-podruntime": {wantLevel: LevelOther},
		"eks-419-kubelet":    {wantLevel: LevelOther},
		"docker-14-global":   {wantLevel: LevelOther},
	}
	for name := range paths {
		if _, ok := cases[name]; !ok {
			t.Errorf("sample %s has no case", name)
		}
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			p, ok := paths[name]
			if !ok {
				t.Fatalf("no sample %s in testdata/paths.txt", name)
			}
			got := ParsePath(p)
			if got.Level != tc.wantLevel || got.Kubepods != tc.wantKubepods || got.QoS != tc.wantQoS ||
				got.PodUID != tc.wantUID || got.ContainerID != tc.wantCID {
				t.Errorf("ParsePath(%q) = level %v kubepods %q qos %q uid %q cid %q; want %v %q %q %q %q", p,
					got.Level, got.Kubepods, got.QoS, got.PodUID, got.ContainerID,
					tc.wantLevel, tc.wantKubepods, tc.wantQoS, tc.wantUID, tc.wantCID)
			}
			if tc.wantKubepods != "" && !got.Systemd {
				t.Errorf("ParsePath(%q).Systemd = false for a slice path", p)
			}
		})
	}
}

// TestFromSystemdRealNodes expands runtimes' systemd cgroupsPaths of real nodes into
// the paths their cgroup file systems showed.
func TestFromSystemdRealNodes(t *testing.T) {
	paths := realPaths(t)
	cases := map[string]struct {
		in   string
		want string
	}{
		// https://github.com/containerd/nri/pull/227: the relativePath containerd gave
		// an NRI plugin on a kind worker (cgroupRoot /kubelet), and its absolutePath.
		"kind cgroup root": {
			in:   "kubelet-kubepods-besteffort-pod1e597579_417e_482f_bf65_5fe170c3aebd.slice:cri-containerd:a09bc17f5aa29b0dbdec9ede5f46cf1396d2405917ab02e6f1eb1019f388396e",
			want: paths["nri-227-kind-container"],
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := FromSystemd(tc.in)
			if err != nil || got != tc.want {
				t.Errorf("FromSystemd(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
			}
		})
	}
}

// TestParsePathConstructed covers shapes no public sample was found for. Every path
// here is constructed by rule from the layouts the kubelet and runtimes document.
func TestParsePathConstructed(t *testing.T) {
	cases := map[string]struct {
		path    string
		want    Level
		wantUID string
		wantCID string
	}{
		"kind guaranteed pod under the kubelet- cgroup root (constructed)": {
			path: "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod" + uidSysd + ".slice/cri-containerd-" + cid + ".scope",
			want: LevelContainer, wantUID: uid, wantCID: cid},
		"kind QoS slice (constructed)":                     {path: "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice", want: LevelQoS},
		"kind kubepods slice (constructed)":                {path: "/kubelet.slice/kubelet-kubepods.slice", want: LevelKubepods},
		"kind's cgroup root itself is other (constructed)": {path: "/kubelet.slice", want: LevelOther},
		"kind node container under Docker's cgroupfs driver on cgroup v1 (constructed)": {
			path: "/docker/" + cid + "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-pod" + uidSysd + ".slice/cri-containerd-" + cid + ".scope",
			want: LevelContainer, wantUID: uid, wantCID: cid},
		"the node container itself is other (constructed)": {path: "/docker/" + cid, want: LevelOther},
		"kind in a CI pod: the inner kubepods decides (constructed)": {
			path: "/kubepods/burstable/pod" + staticUID + "/" + cid + "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod" + uidSysd + ".slice",
			want: LevelPod, wantUID: uid},
		"kind in a CI pod: the inner kubepods slice is kubepods (constructed)": {
			path: "/kubepods/burstable/pod" + staticUID + "/" + cid + "/kubelet.slice/kubelet-kubepods.slice",
			want: LevelKubepods},
		"a slice merely ending in kubepods-ish text is not kubepods (constructed)": {path: "/notkubepods.slice/x", want: LevelOther},
		"-kubepods.slice alone is not kubepods (constructed)":                      {path: "/-kubepods.slice", want: LevelOther},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := ParsePath(tc.path)
			if got.Level != tc.want || got.PodUID != tc.wantUID || got.ContainerID != tc.wantCID {
				t.Errorf("ParsePath(%q) = %v uid %q cid %q; want %v %q %q", tc.path, got.Level, got.PodUID, got.ContainerID, tc.want, tc.wantUID, tc.wantCID)
			}
		})
	}
}

func TestHostPrefix(t *testing.T) {
	paths := realPaths(t)
	kindRuntime := "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-pod68e0cbcc_0cf8_48fc_9a5c_bbb45350dd13.slice"
	lxcRuntime := "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-poda8697f49_441d_4d4f_90d2_6d8e1fa3bbe7.slice/cri-containerd-3fc28fa1c647ceede9f6b340d0b16c9f1f663698972d22a52e296f291638e014.scope"
	cases := map[string]struct {
		kernel, runtime string
		want            string
		wantOK          bool
	}{
		"kind under Docker (kind#3169's oom_memcg, the runtime's path of the same slice)": {
			kernel: paths["kind-3169-oom-memcg"], runtime: kindRuntime,
			want: "/system.slice/docker-b2b75b11f95220f9267e53d48df2d654d585405c36b4c752302ab39da59d74e6.scope", wantOK: true},
		"LXC (gpud's task_memcg)":       {kernel: paths["gpud-lxc-task-memcg"], runtime: lxcRuntime, want: "/lxc.payload.ny2g2r5hh3-lxc", wantOK: true},
		"ordinary node: the same path":  {kernel: paths["efs-1218-containerd-scope"], runtime: paths["efs-1218-containerd-scope"], want: "", wantOK: true},
		"another cgroup":                {kernel: paths["efs-1218-containerd-scope"], runtime: lxcRuntime},
		"not on an element boundary":    {kernel: "/a/xkubepods/pod1", runtime: "/kubepods/pod1"},
		"the root says nothing":         {kernel: "/a/b", runtime: "/"},
		"a runtime path longer than it": {kernel: "/kubepods", runtime: "/x/kubepods"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, ok := HostPrefix(tc.kernel, tc.runtime)
			if got != tc.want || ok != tc.wantOK {
				t.Errorf("HostPrefix(%q, %q) = %q, %v; want %q, %v", tc.kernel, tc.runtime, got, ok, tc.want, tc.wantOK)
			}
			if ok && WithPrefix(got, tc.runtime) != ParsePath(tc.kernel).Path {
				t.Errorf("WithPrefix(%q, %q) = %q, want %q", got, tc.runtime, WithPrefix(got, tc.runtime), tc.kernel)
			}
		})
	}
}
