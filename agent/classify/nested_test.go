package classify

import (
	"os"
	"strings"
	"testing"

	"github.com/coroner-dev/coroner/agent/cgroup"
	"github.com/coroner-dev/coroner/agent/kmsg"
)

// kernelFile reads the OOM kills of a kmsg test data file.
func kernelFile(t *testing.T, name string) []kmsg.OOMKill {
	t.Helper()
	f, err := os.Open("../kmsg/testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	kills, err := kmsg.ParseText(f)
	if err != nil {
		t.Fatal(err)
	}
	return kills
}

// TestClassifyNestedNodes classifies exits on nodes whose kernel paths carry a host
// prefix, with what the agent knows: the runtime's paths (without the prefix), the
// container ID and pod UID, the trusted PIDs, and the prefix once learned.
func TestClassifyNestedNodes(t *testing.T) {
	lxc := kernelFile(t, "dmesg-lxc-node-gpud.txt")         // real
	kind := kernelFile(t, "constructed-kind-two-nodes.txt") // constructed, see its header
	const (
		lxcPrefix = "/lxc.payload.ny2g2r5hh3-lxc"
		lxcPod    = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-poda8697f49_441d_4d4f_90d2_6d8e1fa3bbe7.slice"
		lxcCID    = "3fc28fa1c647ceede9f6b340d0b16c9f1f663698972d22a52e296f291638e014"
		kindA     = "/system.slice/docker-b2b75b11f95220f9267e53d48df2d654d585405c36b4c752302ab39da59d74e6.scope"
		kindPodA  = "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-pod68e0cbcc_0cf8_48fc_9a5c_bbb45350dd13.slice"
		kindCID1  = "1111111111111111111111111111111111111111111111111111111111111111"
		kindPodA2 = "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-podaaaaaaaa_aaaa_4aaa_8aaa_aaaaaaaaaaaa.slice"
		kindCID2  = "2222222222222222222222222222222222222222222222222222222222222222"
		kindPodA3 = "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-podcccccccc_cccc_4ccc_8ccc_cccccccccccc.slice"
		kindCID3  = "3333333333333333333333333333333333333333333333333333333333333333"
	)
	cases := map[string]struct {
		pod, cid     string
		scope        string // the container's scope element, "cri-containerd-<cid>.scope" when empty
		exit         int32
		reason       string
		pids         []int
		prefix       string
		prefixKnown  bool
		kernel       []kmsg.OOMKill
		want         OOMKind
		wantLevel    cgroup.Level
		wantKillerIn string
	}{
		"LXC node, pod over its limit, prefix not learned yet (real lines)": {
			pod: lxcPod, cid: lxcCID, exit: 137, kernel: lxc, want: LimitOOM, wantLevel: cgroup.LevelPod, wantKillerIn: lxcPrefix,
		},
		"LXC node, pod over its limit, prefix learned (real lines)": {
			pod: lxcPod, cid: lxcCID, exit: 137, kernel: lxc, prefix: lxcPrefix, prefixKnown: true, want: LimitOOM, wantLevel: cgroup.LevelPod,
		},
		"kind node A, pod over its limit (kind#3169's oom_memcg)": {
			pod: kindPodA, cid: kindCID1, exit: 137, kernel: kind, want: LimitOOM, wantLevel: cgroup.LevelPod,
		},
		"kind node A, node OOM: oom_memcg is the node container, above kubepods": {
			pod: kindPodA2, cid: kindCID2, exit: 137, kernel: kind, prefix: kindA, prefixKnown: true, want: NodeOOM, wantLevel: cgroup.LevelOther,
		},
		"kind node A, node B's kill of PID 4242 is not ours though 4242 is our runtime PID": {
			pod: kindPodA3, cid: kindCID3, exit: 137, reason: "Error", pids: []int{4242}, kernel: kind, want: NotOOM,
		},
		"kind node A, a lone kill line of PID 4243 when PIDs are not trusted (nested): not attributed": {
			pod: kindPodA3, cid: kindCID3, exit: 137, reason: "Error", kernel: kind, prefix: kindA, prefixKnown: true, want: NotOOM,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			scope := tc.scope
			if scope == "" {
				scope = "cri-containerd-" + tc.cid + ".scope"
			}
			v := ClassifyOOM(OOMFacts{
				Container: "main", ContainerID: tc.cid, ExitCode: tc.exit, Reason: tc.reason, PIDs: tc.pids,
				PodCgroup: tc.pod, ContainerCgroup: tc.pod + "/" + scope, KernelPrefix: tc.prefix, PrefixKnown: tc.prefixKnown,
				Kernel: tc.kernel,
			})
			if v.Kind != tc.want || (tc.want != NotOOM && v.KillerLevel != tc.wantLevel) {
				t.Fatalf("verdict = %s at %v (%s; %q), want %s at %v", v.Kind, v.KillerLevel, v.Basis, v.Evidence, tc.want, tc.wantLevel)
			}
			if tc.wantKillerIn != "" && !strings.HasPrefix(v.Killer, tc.wantKillerIn) {
				t.Errorf("Killer = %q, want the kernel's path under %s", v.Killer, tc.wantKillerIn)
			}
		})
	}
}

// TestClassifyPIDOnlyKills: a kill line that names only a PID (the kernel rate limited
// its report) is attributed by the trusted PIDs only, and never against what the
// kill's own paths say.
func TestClassifyPIDOnlyKills(t *testing.T) {
	const pod = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f4d5a5e_7c2b_4a8e_9d3a_2b1c9f6e8a11.slice"
	const cid = "3e5e5eab87df615f4777e6f7f261a7fb62f4a7ee5bc3e25e3a5b5223ccd368fe"
	lone := kmsg.OOMKill{Scope: kmsg.ScopeMemcg, Task: "worker", PID: 5101, UID: 0}
	otherPod := kmsg.OOMKill{Scope: kmsg.ScopeMemcg, Constraint: kmsg.ConstraintMemcg, PID: 5101,
		OOMMemcg:   "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod7d1c7b1e_2a64_4c3e_8f0e_5b9a3c2d1e0f.slice",
		GroupMemcg: "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod7d1c7b1e_2a64_4c3e_8f0e_5b9a3c2d1e0f.slice/cri-containerd-9b1f0c2a7d3e4f5a6b7c8d9e0f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c.scope"}
	otherNode := kmsg.OOMKill{Scope: kmsg.ScopeMemcg, Constraint: kmsg.ConstraintMemcg, PID: 5101,
		OOMMemcg: "/system.slice/docker-0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b.scope/kubelet.slice/kubelet-kubepods.slice"}
	cases := map[string]struct {
		pids        []int
		kill        kmsg.OOMKill
		prefixKnown bool
		want        OOMKind
	}{
		"ordinary node: the runtime's PID matches a rate-limited kill; peak at the limit decides": {
			pids: []int{5101}, kill: lone, want: LimitOOM},
		"no trusted PIDs (nested node): not attributed":                           {kill: lone, want: NotOOM},
		"a group kill of another pod's container is never matched by PID":         {pids: []int{5101}, kill: otherPod, want: NotOOM},
		"an oom_memcg that is not above our container (prefix known) is not ours": {pids: []int{5101}, kill: otherNode, prefixKnown: true, want: NotOOM},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			v := ClassifyOOM(OOMFacts{
				Container: "main", ContainerID: cid, ExitCode: 137, Reason: "Error", PIDs: tc.pids,
				PodCgroup: pod, ContainerCgroup: pod + "/cri-containerd-" + cid + ".scope", PrefixKnown: tc.prefixKnown,
				MemoryLimit: 20 << 20, PeakUsage: 20 << 20, Kernel: []kmsg.OOMKill{tc.kill},
			})
			if v.Kind != tc.want {
				t.Errorf("verdict = %s (%s; %q), want %s", v.Kind, v.Basis, v.Evidence, tc.want)
			}
		})
	}
}

func TestTrustedPIDs(t *testing.T) {
	cases := map[string]struct {
		facts      PIDFacts
		runtimePID int
		cgroupPIDs []int
		want       []int
	}{
		"ordinary node, agent without hostPID: the runtime's PID only": {runtimePID: 7, cgroupPIDs: []int{0, 0}, want: []int{7}},
		"ordinary node, agent in the init PID namespace: both":         {facts: PIDFacts{InitNamespace: true}, runtimePID: 7, cgroupPIDs: []int{7, 9, 0}, want: []int{7, 9}},
		"learned empty prefix is an ordinary node":                     {facts: PIDFacts{PrefixKnown: true}, runtimePID: 7, want: []int{7}},
		"nested by prefix: none":                                       {facts: PIDFacts{InitNamespace: true, PrefixKnown: true, HostPrefix: "/docker/x"}, runtimePID: 7, cgroupPIDs: []int{9}},
		"nested by a PID mismatch: none":                               {facts: PIDFacts{PIDMismatch: true}, runtimePID: 7},
		"nothing known: nothing":                                       {},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := TrustedPIDs(tc.facts, tc.runtimePID, tc.cgroupPIDs)
			if len(got) != len(tc.want) {
				t.Fatalf("TrustedPIDs = %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("TrustedPIDs = %v, want %v", got, tc.want)
				}
			}
		})
	}
}
