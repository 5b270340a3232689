package kmsg

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestAssemblerNestedNodes reads kernel reports of nodes that run in a container:
// the paths carry the host's prefix, which the assembler keeps as printed.
func TestAssemblerNestedNodes(t *testing.T) {
	const (
		lxcPod = "/lxc.payload.ny2g2r5hh3-lxc/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-poda8697f49_441d_4d4f_90d2_6d8e1fa3bbe7.slice"
		lxcCtr = lxcPod + "/cri-containerd-3fc28fa1c647ceede9f6b340d0b16c9f1f663698972d22a52e296f291638e014.scope"
		nodeA  = "/system.slice/docker-b2b75b11f95220f9267e53d48df2d654d585405c36b4c752302ab39da59d74e6.scope"
		nodeB  = "/system.slice/docker-0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b.scope"
		podA   = nodeA + "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-pod68e0cbcc_0cf8_48fc_9a5c_bbb45350dd13.slice"
		podB   = nodeB + "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-podbbbbbbbb_bbbb_4bbb_8bbb_bbbbbbbbbbbb.slice"
		ctrA   = podA + "/cri-containerd-1111111111111111111111111111111111111111111111111111111111111111.scope"
		ctrB   = podB + "/cri-containerd-bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb.scope"
		ctrA2  = nodeA + "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-podaaaaaaaa_aaaa_4aaa_8aaa_aaaaaaaaaaaa.slice/cri-containerd-2222222222222222222222222222222222222222222222222222222222222222.scope"
	)
	cases := map[string]struct {
		file string
		want []OOMKill
	}{
		"LXC node (real, gpud)": {
			file: "dmesg-lxc-node-gpud.txt",
			want: []OOMKill{
				{Scope: ScopeMemcg, Constraint: ConstraintMemcg, OOMMemcg: lxcPod, TaskMemcg: lxcCtr, Task: "node", PID: 863987, UID: 0,
					AnonRSSKB: 41545760, FileRSSKB: 2836, Summary: true},
				{Scope: ScopeMemcg, Constraint: ConstraintMemcg, OOMMemcg: lxcPod, TaskMemcg: lxcCtr, Task: "pt_main_thread", PID: 1483257, UID: 0,
					AnonRSSKB: 23167252, FileRSSKB: 83700, ShmemRSSKB: 20, Summary: true},
			},
		},
		"two kind nodes on one kernel (constructed)": {
			file: "constructed-kind-two-nodes.txt",
			want: []OOMKill{
				{Monotonic: us(100000002), HasTime: true, Scope: ScopeMemcg, Constraint: ConstraintMemcg, OOMMemcg: podA, TaskMemcg: ctrA,
					Task: "memhog", PID: 31001, UID: 0, AnonRSSKB: 20480, FileRSSKB: 1000, Summary: true},
				{Monotonic: us(101000002), HasTime: true, Scope: ScopeMemcg, Constraint: ConstraintMemcg, OOMMemcg: podB, TaskMemcg: ctrB,
					Task: "memhog", PID: 4242, UID: 0, AnonRSSKB: 20480, FileRSSKB: 1000, Summary: true},
				{Monotonic: us(102000002), HasTime: true, Scope: ScopeMemcg, Constraint: ConstraintMemcg, OOMMemcg: nodeA, TaskMemcg: ctrA2,
					Task: "cache", PID: 31002, UID: 0, AnonRSSKB: 80000, FileRSSKB: 1000, Summary: true},
				{Monotonic: us(103000001), HasTime: true, Scope: ScopeMemcg, Task: "worker", PID: 4243, UID: 0, AnonRSSKB: 20480, FileRSSKB: 1000},
			},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, assemble(t, tc.file)); diff != "" {
				t.Errorf("kills mismatch (-want +got):\n%s", diff)
			}
		})
	}
}
