package ledger

// Tests of the evidence: what the kernel's kills teach when joined to the containers, and
// how long they are kept.

import (
	"testing"
	"time"

	"k8s.io/klog/v2"

	"github.com/coroner-dev/coroner/agent/classify"
	"github.com/coroner-dev/coroner/agent/kmsg"
	"github.com/coroner-dev/coroner/cri"
)

// TestLearnKill: the host prefix is learned from a kill that names one of the node's
// containers, whether the kill or the container's cgroup came first; a second prefix is
// not taken; a single-process container killed under another PID than the runtime's
// shows the runtime's PIDs are not the kernel's.
func TestLearnKill(t *testing.T) {
	const prefix = "/system.slice/docker-node.scope"
	kill := func(n, pid int, pfx string) kmsg.OOMKill {
		cg := pfx + podCgroup(tablePod) + "/" + containerID(n)
		return kmsg.OOMKill{Scope: kmsg.ScopeMemcg, OOMMemcg: cg, TaskMemcg: cg, PID: pid}
	}
	log := klog.Background()
	for _, tc := range []struct {
		name         string
		killFirst    bool
		kills        []kmsg.OOMKill
		wantPrefix   string
		wantKnown    bool
		wantConflict bool
		wantMismatch bool
	}{
		{name: "ordinary node", kills: []kmsg.OOMKill{kill(1, 42, "")}, wantKnown: true},
		{name: "nested node", kills: []kmsg.OOMKill{kill(1, 42, prefix)}, wantPrefix: prefix, wantKnown: true},
		{name: "kill read first", killFirst: true, kills: []kmsg.OOMKill{kill(1, 42, prefix)}, wantPrefix: prefix, wantKnown: true},
		{name: "another node's container", kills: []kmsg.OOMKill{kill(9, 42, prefix)}},
		{name: "first prefix stays", kills: []kmsg.OOMKill{kill(1, 42, prefix), kill(1, 42, "")}, wantPrefix: prefix, wantKnown: true,
			wantConflict: true},
		{name: "another PID", kills: []kmsg.OOMKill{kill(1, 4242, prefix)}, wantPrefix: prefix, wantKnown: true, wantMismatch: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb := New(classify.PIDFacts{})
			if tc.killFirst {
				for _, k := range tc.kills {
					tb.LearnKill(k, t0, log)
				}
			}
			start := tableEvent(cri.Started, 1)
			start.PID = 42
			tb.apply(start, t0, Reading{Mem: memWith(0, 0, 0), PIDs: []int{7}})
			if !tc.killFirst {
				for _, k := range tc.kills {
					tb.LearnKill(k, t0, log)
				}
			}
			p := tb.pids
			if p.HostPrefix != tc.wantPrefix || p.PrefixKnown != tc.wantKnown || tb.prefixConflict != tc.wantConflict ||
				p.PIDMismatch != tc.wantMismatch {
				t.Errorf("learned %+v, conflict %v", p, tb.prefixConflict)
			}
		})
	}
}

// TestKernelKept: the kernel's kills are kept for KernelTTL after they were read, and at
// most KernelMax of them, the newest; a snapshot gets them in the order read.
func TestKernelKept(t *testing.T) {
	tb := New(classify.PIDFacts{})
	for i := range KernelMax + 2 {
		tb.LearnKill(kmsg.OOMKill{PID: i}, t0.Add(time.Duration(i)*time.Millisecond), klog.Background())
	}
	if st := tb.Kernel(); st.Kills != KernelMax {
		t.Fatalf("%d kills kept, want %d", st.Kills, KernelMax)
	}
	if first := tb.evidence.kernel.recs[0].rec.PID; first != 2 {
		t.Errorf("oldest kill kept is PID %d, want 2", first)
	}
	tb.apply(tableEvent(cri.Exited, 1), t0, Reading{})
	s, ok := tb.Snapshot(containerID(1), Exit)
	if !ok || len(s.Facts.Kernel) != KernelMax || s.Facts.Kernel[0].PID != 2 || s.Facts.Kernel[KernelMax-1].PID != KernelMax+1 {
		t.Errorf("snapshot's kernel kills: %d, ok %v", len(s.Facts.Kernel), ok)
	}
	// Read at t0+2ms to t0+4097ms: at KernelTTL+3s after t0, those read before t0+3s are gone.
	tb.Expire(t0.Add(KernelTTL+3*time.Second), nil)
	if st := tb.Kernel(); st.Kills != KernelMax+2-3000 {
		t.Errorf("%d kills kept after the TTL, want %d", st.Kills, KernelMax+2-3000)
	}
	tb.Expire(t0.Add(KernelTTL+time.Hour), nil)
	if st := tb.Kernel(); st.Kills != 0 {
		t.Errorf("%d kills kept after all TTLs, want 0", st.Kills)
	}
}
