package agent

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/coroner-dev/coroner/agent/cgroup"
	"github.com/coroner-dev/coroner/agent/classify"
	"github.com/coroner-dev/coroner/agent/kmsg"
	"github.com/coroner-dev/coroner/cri"
)

const tablePod = "12121212-1212-4121-8121-121212121212"

// tableEvent is an event of the container of tablePod named "main" with ID containerID(n).
func tableEvent(kind cri.Kind, n int) cri.ContainerEvent {
	id := containerID(n)
	return cri.ContainerEvent{Kind: kind, PodNamespace: ns, PodName: "p", PodUID: tablePod, ContainerName: "main",
		ContainerID: id, StartedAt: t0.Add(-time.Minute), CgroupPath: podCgroup(tablePod) + "/" + id, MemoryLimit: 20 << 20}
}

// apply feeds an event through the transitions handleEvent uses, with r as the cgroups'
// reading, and returns whether it queued a work item.
func (tb *containerTable) apply(ev cri.ContainerEvent, now time.Time, r reading) bool {
	_, _, first := tb.see(ev, klog.Background())
	switch ev.Kind {
	case cri.Started:
		return tb.started(ev, now, r, first)
	case cri.OOM:
		return tb.oomEvent(ev, now, r)
	case cri.Exited:
		tb.exited(ev, r)
		return true
	}
	return false
}

func memWith(oomKill uint64, peak, limit int64) *cgroup.Memory {
	return &cgroup.Memory{Version: cgroup.V1, OOMKill: oomKill, HasOOMKill: true, Peak: peak, Limit: limit}
}

// TestTableEvents: which events queue work, and what is pending afterwards.
func TestTableEvents(t *testing.T) {
	counted := reading{mem: memWith(1, 20<<20, 20<<20), pod: memWith(1, 20<<20, 0), pids: []int{7}}
	fresh := reading{mem: memWith(0, 1<<20, 20<<20), pod: memWith(0, 1<<20, 0), pids: []int{7}}
	exit := tableEvent(cri.Exited, 1)
	exit.ExitCode, exit.FinishedAt = 137, t0
	for _, tc := range []struct {
		name       string
		events     []cri.ContainerEvent
		readings   []reading
		wantQueued []bool
		// after the events: the exit's and the OOM events' work pending
		wantExit, wantOOM bool
		wantOOMs          int
	}{
		{name: "fresh start", events: []cri.ContainerEvent{tableEvent(cri.Started, 1)}, readings: []reading{fresh},
			wantQueued: []bool{false}},
		{name: "first seen with an OOM kill counted", events: []cri.ContainerEvent{tableEvent(cri.Started, 1)},
			readings: []reading{counted}, wantQueued: []bool{true}, wantOOM: true, wantOOMs: 1},
		{name: "counted, but seen before", events: []cri.ContainerEvent{tableEvent(cri.OOM, 1), tableEvent(cri.Started, 1)},
			readings: []reading{{}, counted}, wantQueued: []bool{true, false}, wantOOM: true, wantOOMs: 1},
		{name: "start not read", events: []cri.ContainerEvent{tableEvent(cri.Started, 1)}, readings: []reading{{}},
			wantQueued: []bool{false}},
		{name: "OOM event", events: []cri.ContainerEvent{tableEvent(cri.Started, 1), tableEvent(cri.OOM, 1)},
			readings: []reading{fresh, counted}, wantQueued: []bool{false, true}, wantOOM: true, wantOOMs: 1},
		{name: "exit", events: []cri.ContainerEvent{tableEvent(cri.Started, 1), exit},
			readings: []reading{fresh, {}}, wantQueued: []bool{false, true}, wantExit: true},
		{name: "OOM event and exit", events: []cri.ContainerEvent{tableEvent(cri.OOM, 1), exit},
			readings: []reading{counted, {}}, wantQueued: []bool{true, true}, wantExit: true, wantOOM: true, wantOOMs: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb := newContainerTable(classify.PIDFacts{})
			for i, ev := range tc.events {
				if got := tb.apply(ev, t0, tc.readings[i]); got != tc.wantQueued[i] {
					t.Errorf("event %d (%s): queued %v, want %v", i, ev.Kind, got, tc.wantQueued[i])
				}
			}
			id := containerID(1)
			if _, ok := tb.pending(id, itemExit); ok != tc.wantExit {
				t.Errorf("exit pending %v, want %v", ok, tc.wantExit)
			}
			if _, ok := tb.pending(id, itemOOM); ok != tc.wantOOM {
				t.Errorf("OOM pending %v, want %v", ok, tc.wantOOM)
			}
			if n := len(tb.containers[id].ooms); n != tc.wantOOMs {
				t.Errorf("%d OOM events, want %d", n, tc.wantOOMs)
			}
		})
	}
}

// TestTableFinish: finishExit and finishOOM claim their work once, and say what to count.
func TestTableFinish(t *testing.T) {
	started := t0
	for _, tc := range []struct {
		name string
		// setup: "oom" an OOM event, "missed" a start whose cgroup counted a kill,
		// "exit" an exit after started, "replayed" one from before started
		setup   []string
		unknown bool
		finish  []itemKind
		wantOK  []bool
		// wantCount: whether each finish is to count an UnknownOOM
		wantCount []bool
	}{
		{name: "exit claimed once", setup: []string{"exit"}, finish: []itemKind{itemExit, itemExit},
			wantOK: []bool{true, false}, wantCount: []bool{false, false}},
		{name: "unknown exit counted once", setup: []string{"exit"}, unknown: true, finish: []itemKind{itemExit, itemExit},
			wantOK: []bool{true, false}, wantCount: []bool{true, false}},
		{name: "replayed unknown exit not counted", setup: []string{"replayed"}, unknown: true, finish: []itemKind{itemExit},
			wantOK: []bool{true}, wantCount: []bool{false}},
		{name: "the exit takes the OOM events", setup: []string{"oom", "exit"}, finish: []itemKind{itemExit, itemOOM},
			wantOK: []bool{true, false}, wantCount: []bool{false, false}},
		{name: "OOM events, then the exit", setup: []string{"oom", "exit"}, unknown: true, finish: []itemKind{itemOOM, itemExit},
			wantOK: []bool{true, true}, wantCount: []bool{true, false}},
		{name: "OOM events claimed once", setup: []string{"oom", "oom"}, finish: []itemKind{itemOOM, itemOOM},
			wantOK: []bool{true, false}, wantCount: []bool{false, false}},
		{name: "a missed OOM kill is not counted", setup: []string{"missed"}, unknown: true, finish: []itemKind{itemOOM},
			wantOK: []bool{true}, wantCount: []bool{false}},
		{name: "no exit", setup: []string{"oom"}, finish: []itemKind{itemExit}, wantOK: []bool{false}, wantCount: []bool{false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb := newContainerTable(classify.PIDFacts{})
			for _, s := range tc.setup {
				switch s {
				case "oom":
					tb.apply(tableEvent(cri.OOM, 1), t0, reading{})
				case "missed":
					tb.apply(tableEvent(cri.Started, 1), t0, reading{mem: memWith(1, 0, 0)})
				case "exit", "replayed":
					ev := tableEvent(cri.Exited, 1)
					ev.FinishedAt = started.Add(time.Second)
					if s == "replayed" {
						ev.FinishedAt = started.Add(-time.Second)
					}
					tb.apply(ev, t0, reading{})
				}
			}
			now := t0.Add(time.Minute)
			for i, kind := range tc.finish {
				var ok, count bool
				if kind == itemExit {
					var c exitClaim
					c, ok = tb.finishExit(containerID(1), now, started, tc.unknown)
					count = c.countUnknown
					if ok && c.replay != (tc.setup[len(tc.setup)-1] == "replayed") {
						t.Errorf("finish %d: replay %v", i, c.replay)
					}
				} else {
					var c oomClaim
					c, ok = tb.finishOOM(containerID(1), tc.unknown)
					count = c.countUnknown
				}
				if ok != tc.wantOK[i] || count != tc.wantCount[i] {
					t.Errorf("finish %d (%s): ok %v, count %v; want %v, %v", i, kind, ok, count, tc.wantOK[i], tc.wantCount[i])
				}
			}
			c := tb.containers[containerID(1)]
			if c.exitDone && !c.doneAt.Equal(now) {
				t.Errorf("done at %v, want %v", c.doneAt, now)
			}
			// An OOM event after the exit was classified is not classified on its own.
			if queued := tb.apply(tableEvent(cri.OOM, 1), now, reading{}); queued == c.exitDone {
				t.Errorf("OOM event after the finishes queued: %v (exit done %v)", queued, c.exitDone)
			}
		})
	}
}

// TestTableFinishOOMTimes: finishOOM hands the first and the last OOM event not
// classified before.
func TestTableFinishOOMTimes(t *testing.T) {
	tb := newContainerTable(classify.PIDFacts{})
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	oom := func(s int) {
		ev := tableEvent(cri.OOM, 1)
		ev.OOMAt = at(s)
		tb.apply(ev, t0, reading{})
	}
	oom(1)
	oom(2)
	if c, ok := tb.finishOOM(containerID(1), false); !ok || !c.first.Equal(at(1)) || !c.last.Equal(at(2)) {
		t.Errorf("first claim %+v, %v; want %v to %v", c, ok, at(1), at(2))
	}
	oom(3)
	if c, ok := tb.finishOOM(containerID(1), false); !ok || !c.first.Equal(at(3)) || !c.last.Equal(at(3)) {
		t.Errorf("second claim %+v, %v; want %v", c, ok, at(3))
	}
}

// TestTableWaits: the pod wait starts once per item and the API server's confirmation is
// kept; the kernel wait is per item.
func TestTableWaits(t *testing.T) {
	tb := newContainerTable(classify.PIDFacts{})
	id := containerID(1)
	tb.apply(tableEvent(cri.OOM, 1), t0, reading{})
	tb.apply(tableEvent(cri.Exited, 1), t0, reading{})
	for _, tc := range []struct {
		kind      itemKind
		now       time.Time
		confirm   bool
		wantFirst time.Time
		wantConf  bool
	}{
		{kind: itemExit, now: t0, wantFirst: t0},
		{kind: itemExit, now: t0.Add(time.Second), confirm: true, wantFirst: t0},
		{kind: itemExit, now: t0.Add(2 * time.Second), wantFirst: t0, wantConf: true},
		{kind: itemOOM, now: t0.Add(3 * time.Second), wantFirst: t0.Add(3 * time.Second), wantConf: true},
	} {
		first, conf := tb.awaitPod(id, tc.kind, tc.now)
		if !first.Equal(tc.wantFirst) || conf != tc.wantConf {
			t.Errorf("%s at +%v: waiting since %v, confirmed %v; want %v, %v", tc.kind, tc.now.Sub(t0), first, conf, tc.wantFirst, tc.wantConf)
		}
		if tc.confirm {
			tb.podConfirmed(id)
		}
	}
	tb.kernelWait(id, itemExit)
	for kind, want := range map[itemKind]bool{itemExit: true, itemOOM: false} {
		if s, ok := tb.snapshot(id, kind); !ok || s.kernelWaited != want {
			t.Errorf("%s: waited %v, %v; want %v", kind, s.kernelWaited, ok, want)
		}
	}
	// Nothing happens to a container the table does not know.
	other := containerID(2)
	tb.kernelWait(other, itemExit)
	tb.podConfirmed(other)
	tb.drop(other, itemExit, t0, true)
	if _, ok := tb.snapshot(other, itemExit); ok || len(tb.containers) != 1 {
		t.Errorf("a container appeared: %d", len(tb.containers))
	}
}

// TestTableDrop: a dropped exit is done (and collectable), dropped OOM events are
// handled, and a pod gone forgets its runtime states.
func TestTableDrop(t *testing.T) {
	for _, tc := range []struct {
		name      string
		kind      itemKind
		forgetPod bool
		wantDone  bool
	}{
		{name: "exit", kind: itemExit, wantDone: true},
		{name: "exit of a pod gone", kind: itemExit, forgetPod: true, wantDone: true},
		{name: "OOM", kind: itemOOM},
		{name: "OOM of a pod gone", kind: itemOOM, forgetPod: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb := newContainerTable(classify.PIDFacts{})
			id := containerID(1)
			tb.apply(tableEvent(cri.OOM, 1), t0, reading{})
			tb.apply(tableEvent(cri.Exited, 1), t0, reading{})
			now := t0.Add(time.Second)
			tb.drop(id, tc.kind, now, tc.forgetPod)
			_, exitPending := tb.pending(id, itemExit)
			_, oomPending := tb.pending(id, itemOOM)
			if exitPending == tc.wantDone || oomPending {
				t.Errorf("pending: exit %v, OOM %v", exitPending, oomPending)
			}
			if c := tb.containers[id]; c.doneAt.Equal(now) != tc.wantDone {
				t.Errorf("done at %v", c.doneAt)
			}
			if n := len(tb.observedStates(tablePod)); (n == 0) != tc.forgetPod {
				t.Errorf("%d runtime states kept", n)
			}
		})
	}
}

// TestTableSnapshot: the facts are ClassifyOOM's, copied from the table.
func TestTableSnapshot(t *testing.T) {
	tb := newContainerTable(classify.PIDFacts{InitNamespace: true})
	id := containerID(1)
	start := tableEvent(cri.Started, 1)
	start.PID, start.MemoryLimit = 42, 0
	tb.apply(start, t0, reading{mem: memWith(0, 1<<20, 20<<20), pod: memWith(0, 1<<20, 0), pids: []int{42, 43}})
	// Seen running again (a relist): the pod's counters still count from the first reading.
	tb.apply(start, t0, reading{mem: memWith(0, 1<<20, 20<<20), pod: memWith(1, 1<<20, 0), pids: []int{42, 43}})
	tb.apply(tableEvent(cri.OOM, 1), t0, reading{mem: memWith(1, 20<<20, 20<<20), pod: memWith(1, 20<<20, 0)})
	exit := tableEvent(cri.Exited, 1)
	exit.ExitCode, exit.Reason, exit.FinishedAt = 137, "OOMKilled", t0
	tb.apply(exit, t0, reading{})
	tb.addKill(oomKill(newPod("p", tablePod, corev1.RestartPolicyNever, "main"), id, 42), t0, klog.Background())

	for _, kind := range []itemKind{itemExit, itemOOM} {
		s, ok := tb.snapshot(id, kind)
		if !ok {
			t.Fatalf("%s: no snapshot", kind)
		}
		f := s.facts
		if f.ContainerID != id || f.PodUID != tablePod || !f.TaskOOM || len(f.PIDs) != 2 || len(f.Kernel) != 1 ||
			f.MemoryLimit != 20<<20 || f.PeakUsage != 20<<20 || f.Counters == nil || f.Counters.OOMKill != 1 ||
			f.PodCounters == nil || f.PodCounters.OOMKill != 1 || f.Pod == nil || !f.PrefixKnown {
			t.Errorf("%s: facts %+v", kind, f)
		}
		if wantCode := map[itemKind]int32{itemExit: 137}[kind]; f.ExitCode != wantCode || (kind == itemExit) != (f.Reason == "OOMKilled") {
			t.Errorf("%s: exit code %d, reason %q", kind, f.ExitCode, f.Reason)
		}
		if got := classify.ClassifyOOM(f).Kind; got != classify.LimitOOM {
			t.Errorf("%s: verdict %s", kind, got)
		}
		// A copy: changing it changes nothing in the table.
		f.Pod.OOMKill, f.PIDs[0], f.Kernel[0].PID = 9, 9, 9
	}
	c := tb.containers[id]
	if c.podLast.OOMKill != 1 || c.pids[0] != 42 || tb.kernel.kills[0].kill.PID != 42 {
		t.Error("the snapshot shares the table's memory")
	}
}

// TestTableObserved: the runtime's states of a pod's containers, the latest attempt's.
func TestTableObserved(t *testing.T) {
	tb := newContainerTable(classify.PIDFacts{})
	run := func(n int, attempt uint32, kind cri.Kind) {
		ev := tableEvent(kind, n)
		ev.Attempt = attempt
		tb.apply(ev, t0, reading{})
	}
	state := func() classify.ContainerState {
		s := tb.observedStates(tablePod)
		if len(s) != 1 {
			t.Fatalf("%d states, want 1", len(s))
		}
		return s[0]
	}
	run(1, 0, cri.Started)
	run(1, 0, cri.Exited)
	run(2, 1, cri.Started)
	if s := state(); s.State != classify.StateRunning || s.ContainerID != containerID(2) {
		t.Errorf("state %+v, want attempt 1 running", s)
	}
	run(1, 0, cri.Exited) // attempt 0 seen again (a relist)
	if s := state(); s.State != classify.StateRunning || s.ContainerID != containerID(2) {
		t.Errorf("state %+v, want attempt 1 running still", s)
	}
	tb.forget("other", tablePod)
	if s := tb.observedStates(tablePod); len(s) != 0 {
		t.Errorf("states %+v of a forgotten pod", s)
	}
}

// TestTableGC: what gc forgets.
func TestTableGC(t *testing.T) {
	tb := newContainerTable(classify.PIDFacts{})
	tb.apply(tableEvent(cri.Exited, 1), t0, reading{})
	tb.finishExit(containerID(1), t0, t0, false)
	tb.apply(tableEvent(cri.Exited, 2), t0, reading{})
	tb.finishExit(containerID(2), t0.Add(time.Minute), t0, false)
	tb.apply(tableEvent(cri.Started, 3), t0, reading{})
	other := tableEvent(cri.Exited, 4)
	other.PodUID = "cached"
	tb.apply(other, t0, reading{})
	tb.drop(containerID(4), itemExit, t0, false)
	gone := tableEvent(cri.Exited, 5)
	gone.PodUID = "gone"
	tb.apply(gone, t0, reading{})
	tb.drop(containerID(5), itemExit, t0, false)
	tb.addKill(kmsg.OOMKill{PID: 1}, t0, klog.Background())
	tb.addKill(kmsg.OOMKill{PID: 2}, t0.Add(2*time.Minute), klog.Background())

	cached := func(uid types.UID) bool { return uid == "cached" }
	now := t0.Add(containerTTL + 30*time.Second)
	tb.gc(now, cached)
	for n, want := range map[int]bool{1: false, 2: true, 3: true, 4: false, 5: false} {
		if _, ok := tb.containers[containerID(n)]; ok != want {
			t.Errorf("container %d kept: %v, want %v", n, ok, want)
		}
	}
	for uid, want := range map[types.UID]bool{tablePod: true, "cached": true, "gone": false} {
		if _, ok := tb.observed[uid]; ok != want {
			t.Errorf("runtime states of %s kept: %v, want %v", uid, ok, want)
		}
	}
	tb.gc(t0.Add(kernelTTL+time.Minute), cached)
	if len(tb.kernel.kills) != 1 || tb.kernel.kills[0].kill.PID != 2 {
		t.Errorf("kernel kills kept %+v, want the newer one", tb.kernel.kills)
	}
}

// TestTableLearn: the host prefix is learned from a kill that names one of the node's
// containers, whether the kill or the container's cgroup came first; a second prefix is
// not taken; a single-process container killed under another PID than the runtime's
// shows the runtime's PIDs are not the kernel's.
func TestTableLearn(t *testing.T) {
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
			tb := newContainerTable(classify.PIDFacts{})
			if tc.killFirst {
				for _, k := range tc.kills {
					tb.addKill(k, t0, log)
				}
			}
			start := tableEvent(cri.Started, 1)
			start.PID = 42
			tb.apply(start, t0, reading{mem: memWith(0, 0, 0), pids: []int{7}})
			if !tc.killFirst {
				for _, k := range tc.kills {
					tb.addKill(k, t0, log)
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
