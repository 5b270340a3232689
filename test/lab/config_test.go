package lab

import (
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/coroner-dev/coroner/test/containerd"
)

func TestNodes(t *testing.T) {
	nodes := Nodes(3)
	want := []struct{ name, netns, veth, ip, cidr, gw, socket string }{
		{"lab-node-1", "coroner-lab-1", "crlab-1", "10.77.0.11", "10.77.1.0/24", "10.77.1.1", "/run/coroner-lab/lab-node-1/containerd.sock"},
		{"lab-node-2", "coroner-lab-2", "crlab-2", "10.77.0.12", "10.77.2.0/24", "10.77.2.1", "/run/coroner-lab/lab-node-2/containerd.sock"},
		{"lab-node-3", "coroner-lab-3", "crlab-3", "10.77.0.13", "10.77.3.0/24", "10.77.3.1", "/run/coroner-lab/lab-node-3/containerd.sock"},
	}
	for i, w := range want {
		n := nodes[i]
		got := []string{n.Name, n.Netns, n.HostVeth, n.IP.String(), n.PodCIDR.String(), n.gateway().String(), n.Socket()}
		exp := []string{w.name, w.netns, w.veth, w.ip, w.cidr, w.gw, w.socket}
		if strings.Join(got, " ") != strings.Join(exp, " ") {
			t.Errorf("node %d: %v, want %v", i+1, got, exp)
		}
		if wantRT := map[int]string{1: RuntimeContainerd2, 2: RuntimeContainerd16, 3: RuntimeContainerd17}[i+1]; n.Runtime != wantRT {
			t.Errorf("node %d runs %s, want %s", i+1, n.Runtime, wantRT)
		}
		if len(n.HostVeth) > 15 {
			t.Errorf("interface name %s longer than IFNAMSIZ-1", n.HostVeth)
		}
	}
}

func TestNodeConfigs(t *testing.T) {
	cfg := ConfigFor("/repo")
	n := cfg.Nodes[1]
	p := &clusterPKI{dir: "/repo/_output/lab/pki"}

	var kubelet map[string]any
	if err := yaml.Unmarshal([]byte(cfg.kubeletConfig(n, p)), &kubelet); err != nil {
		t.Fatalf("kubelet config: %v", err)
	}
	for key, want := range map[string]any{
		"kind":                        "KubeletConfiguration",
		"cgroupDriver":                "cgroupfs",
		"cgroupRoot":                  "/coroner-lab/lab-node-2",
		"failCgroupV1":                false,
		"failSwapOn":                  false,
		"containerRuntimeEndpoint":    "unix:///run/coroner-lab/lab-node-2/containerd.sock",
		"imageGCHighThresholdPercent": float64(100),
		"nodeStatusUpdateFrequency":   "5s",
		"podLogsDir":                  "/repo/_output/lab/nodes/lab-node-2/pod-logs",
	} {
		if kubelet[key] != want {
			t.Errorf("kubelet %s = %v, want %v", key, kubelet[key], want)
		}
	}

	var cni struct {
		Name    string
		Plugins []struct {
			Type string
			IPAM struct {
				Ranges [][]struct{ Subnet string }
			}
		}
	}
	if err := json.Unmarshal([]byte(cniConfig(n, "/x")), &cni); err != nil {
		t.Fatalf("CNI config: %v", err)
	}
	if cni.Name != "coroner-lab-node-2" || len(cni.Plugins) != 1 || cni.Plugins[0].Type != "bridge" ||
		cni.Plugins[0].IPAM.Ranges[0][0].Subnet != "10.77.2.0/24" {
		t.Errorf("CNI config %+v", cni)
	}

	for _, tc := range []struct {
		rt   containerd.Runtime
		want []string
	}{
		{containerd.Runtime{Major: 1, Runc: "/usr/sbin/runc"}, []string{
			`version = 2`,
			`sandbox_image = "registry.k8s.io/pause:coroner"`,
			`bin_dir = "/usr/lib/cni"`,
			`BinaryName = "/usr/sbin/runc"`,
		}},
		{containerd.Runtime{Major: 2, Shim: "/b/containerd-shim-runc-v2", Runc: "/b/runc"}, []string{
			`version = 3`,
			`[plugins."io.containerd.cri.v1.images".pinned_images]`,
			`sandbox = "registry.k8s.io/pause:coroner"`,
			`runtime_path = "/b/containerd-shim-runc-v2"`,
			`BinaryName = "/b/runc"`,
			`bin_dirs = ["/usr/lib/cni"]`,
			`"io.containerd.nri.v1.nri"`,
		}},
	} {
		ctrd := cfg.containerdConfig(n, tc.rt)
		for _, want := range append([]string{
			`address = "/run/coroner-lab/lab-node-2/containerd.sock"`,
			`restrict_oom_score_adj = true`,
			`SystemdCgroup = false`,
			`conf_dir = "/repo/_output/lab/nodes/lab-node-2/cni"`,
		}, tc.want...) {
			if !strings.Contains(ctrd, want) {
				t.Errorf("containerd %d.x config lacks %s", tc.rt.Major, want)
			}
		}
	}
}

func TestHexIP(t *testing.T) {
	for in, want := range map[string]string{
		"0100007F":                         "127.0.0.1",
		"00000000":                         "0.0.0.0",
		"01644D0A":                         "10.77.100.1",
		"00000000000000000000000000000000": "::",
		"00000000000000000000000001000000": "::1",
	} {
		if got := hexIP(in); got != want {
			t.Errorf("hexIP(%s) = %s, want %s", in, got, want)
		}
	}
}

func TestPodState(t *testing.T) {
	running := corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
	cases := []struct {
		name        string
		pod         corev1.Pod
		wantText    string
		wantSettled bool
	}{
		{
			name: "unscheduled",
			pod: corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{
				{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Message: "0/3 nodes are available"}}}},
			wantText: "Pending: 0/3 nodes are available",
		},
		{
			name: "ready",
			pod: corev1.Pod{Spec: corev1.PodSpec{NodeName: "n"}, Status: corev1.PodStatus{Phase: corev1.PodRunning,
				Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}},
			wantText: "Running, ready", wantSettled: true,
		},
		{
			name: "creating",
			pod: corev1.Pod{Spec: corev1.PodSpec{NodeName: "n"}, Status: corev1.PodStatus{Phase: corev1.PodPending,
				ContainerStatuses: []corev1.ContainerStatus{{Name: "agent", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}}}}},
			wantText: "Pending: agent: ContainerCreating",
		},
		{
			name: "crash looping",
			pod: corev1.Pod{Spec: corev1.PodSpec{NodeName: "n"}, Status: corev1.PodStatus{Phase: corev1.PodRunning,
				ContainerStatuses: []corev1.ContainerStatus{{
					Name: "agent", RestartCount: 2,
					State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "back-off 20s"}},
					LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error", Message: "not built yet\n"}},
				}}}},
			wantText:    "Running: agent: CrashLoopBackOff; restarted 2 times, last exit 1 Error; message: not built yet",
			wantSettled: true,
		},
		{
			name: "running, not ready",
			pod: corev1.Pod{Spec: corev1.PodSpec{NodeName: "n"}, Status: corev1.PodStatus{Phase: corev1.PodRunning,
				ContainerStatuses: []corev1.ContainerStatus{{Name: "shim", State: running}}}},
			wantText: "Running: shim: running, not ready",
		},
	}
	for _, tc := range cases {
		text, settled := podState(&tc.pod)
		if text != tc.wantText || settled != tc.wantSettled {
			t.Errorf("%s: podState = %q, %v; want %q, %v", tc.name, text, settled, tc.wantText, tc.wantSettled)
		}
	}
}

func TestShimRunning(t *testing.T) {
	shim := workloadStatus{workload: workload{Kind: "Deployment", Namespace: "coroner-system", Name: "coroner-shim"},
		Images: []string{"docker.io/coroner/coroner-shim:dev"}, Desired: 2}
	agent := workloadStatus{workload: workload{Kind: "DaemonSet", Namespace: "coroner-system", Name: "coroner-agent"},
		Images: []string{"docker.io/coroner/coroner-agent:dev"}, Desired: 3, Ready: 3}
	if ok, why := shimRunning([]workloadStatus{agent}); ok || !strings.Contains(why, "no workload") {
		t.Errorf("without the shim: %v %q", ok, why)
	}
	if ok, why := shimRunning([]workloadStatus{agent, shim}); ok || !strings.Contains(why, "0/2") {
		t.Errorf("shim not ready: %v %q", ok, why)
	}
	shim.Ready = 1
	if ok, _ := shimRunning([]workloadStatus{agent, shim}); !ok {
		t.Error("shim ready: not running")
	}
}

func TestDecodeObjects(t *testing.T) {
	objs, err := decodeObjects([]byte("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: a\n---\n---\napiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: b\n  namespace: a\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 2 || objs[1].GetKind() != "DaemonSet" || objs[1].GetNamespace() != "a" {
		t.Errorf("objects %v", objs)
	}
}

func TestDemoJob(t *testing.T) {
	j := DemoJobObject()
	if *j.Spec.ManagedBy != ManagedBy || *j.Spec.Completions != 3 || *j.Spec.BackoffLimitPerIndex != 1 ||
		len(j.Spec.PodFailurePolicy.Rules) != 2 || j.Spec.PodFailurePolicy.Rules[0].OnExitCodes.Values[0] != 42 {
		t.Errorf("demo Job %+v", j.Spec)
	}
}
