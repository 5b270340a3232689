package ledger

// Tests of the ledger's transitions: the runtime's events, the work items' course, the
// pods' runtime states and the expiry. Time is a value the tests pass: nothing sleeps.

import (
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/coroner-dev/coroner/agent/cgroup"
	"github.com/coroner-dev/coroner/agent/classify"
	"github.com/coroner-dev/coroner/agent/kmsg"
	"github.com/coroner-dev/coroner/cri"
)

const (
	tablePod = "12121212-1212-4121-8121-121212121212"
	ns       = "batch"
)

var t0 = time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)

func containerID(n int) string { return fmt.Sprintf("%064x", n) }

func podCgroup(uid types.UID) string { return "/kubepods/burstable/pod" + string(uid) }

// oomKill is the kernel's report of a limit OOM in the container id of the pod uid.
func oomKill(uid types.UID, id string, pid int) kmsg.OOMKill {
	cg := podCgroup(uid) + "/" + id
	return kmsg.OOMKill{Scope: kmsg.ScopeMemcg, Constraint: kmsg.ConstraintMemcg, OOMMemcg: cg, TaskMemcg: cg,
		Task: "memhog", PID: pid, MemcgLimitKB: 20 << 10, MemcgUsageKB: 20 << 10, Time: t0}
}

// tableEvent is an event of the container of tablePod named "main" with ID containerID(n).
func tableEvent(kind cri.Kind, n int) cri.ContainerEvent {
	id := containerID(n)
	return cri.ContainerEvent{Kind: kind, PodNamespace: ns, PodName: "p", PodUID: tablePod, ContainerName: "main",
		ContainerID: id, StartedAt: t0.Add(-time.Minute), CgroupPath: podCgroup(tablePod) + "/" + id, MemoryLimit: 20 << 20}
}

// apply feeds an event through the ledger as the agent does (Observe, then Record),
// with r as the cgroups' reading, and returns whether it queued a work item.
func (tb *Ledger) apply(ev cri.ContainerEvent, now time.Time, r Reading) bool {
	seen := tb.Observe(ev, klog.Background())
	if !Reads(ev.Kind) {
		return false
	}
	_, queued := tb.Record(ev, seen.First, now, r)
	return queued
}

func memWith(oomKill uint64, peak, limit int64) *cgroup.Memory {
	return &cgroup.Memory{Version: cgroup.V1, OOMKill: oomKill, HasOOMKill: true, Peak: peak, Limit: limit}
}

// TestLedgerEvents: which events queue work, and what is pending afterwards.
func TestLedgerEvents(t *testing.T) {
	counted := Reading{Mem: memWith(1, 20<<20, 20<<20), Pod: memWith(1, 20<<20, 0), PIDs: []int{7}}
	fresh := Reading{Mem: memWith(0, 1<<20, 20<<20), Pod: memWith(0, 1<<20, 0), PIDs: []int{7}}
	exit := tableEvent(cri.Exited, 1)
	exit.ExitCode, exit.FinishedAt = 137, t0
	for _, tc := range []struct {
		name       string
		events     []cri.ContainerEvent
		readings   []Reading
		wantQueued []bool
		// after the events: the exit's and the OOM events' work pending
		wantExit, wantOOM bool
		wantOOMs          int
	}{
		{name: "fresh start", events: []cri.ContainerEvent{tableEvent(cri.Started, 1)}, readings: []Reading{fresh},
			wantQueued: []bool{false}},
		{name: "first seen with an OOM kill counted", events: []cri.ContainerEvent{tableEvent(cri.Started, 1)},
			readings: []Reading{counted}, wantQueued: []bool{true}, wantOOM: true, wantOOMs: 1},
		{name: "counted, but seen before", events: []cri.ContainerEvent{tableEvent(cri.OOM, 1), tableEvent(cri.Started, 1)},
			readings: []Reading{{}, counted}, wantQueued: []bool{true, false}, wantOOM: true, wantOOMs: 1},
		{name: "start not read", events: []cri.ContainerEvent{tableEvent(cri.Started, 1)}, readings: []Reading{{}},
			wantQueued: []bool{false}},
		{name: "OOM event", events: []cri.ContainerEvent{tableEvent(cri.Started, 1), tableEvent(cri.OOM, 1)},
			readings: []Reading{fresh, counted}, wantQueued: []bool{false, true}, wantOOM: true, wantOOMs: 1},
		{name: "exit", events: []cri.ContainerEvent{tableEvent(cri.Started, 1), exit},
			readings: []Reading{fresh, {}}, wantQueued: []bool{false, true}, wantExit: true},
		{name: "OOM event and exit", events: []cri.ContainerEvent{tableEvent(cri.OOM, 1), exit},
			readings: []Reading{counted, {}}, wantQueued: []bool{true, true}, wantExit: true, wantOOM: true, wantOOMs: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb := New(classify.PIDFacts{})
			for i, ev := range tc.events {
				if got := tb.apply(ev, t0, tc.readings[i]); got != tc.wantQueued[i] {
					t.Errorf("event %d (%s): queued %v, want %v", i, ev.Kind, got, tc.wantQueued[i])
				}
			}
			id := containerID(1)
			if _, ok := tb.Pending(id, Exit); ok != tc.wantExit {
				t.Errorf("exit pending %v, want %v", ok, tc.wantExit)
			}
			if _, ok := tb.Pending(id, OOM); ok != tc.wantOOM {
				t.Errorf("OOM pending %v, want %v", ok, tc.wantOOM)
			}
			if n := len(tb.containers[id].ooms); n != tc.wantOOMs {
				t.Errorf("%d OOM events, want %d", n, tc.wantOOMs)
			}
		})
	}
}

// TestLedgerFinish: FinishExit and FinishOOM claim their work once, and say what to count.
func TestLedgerFinish(t *testing.T) {
	started := t0
	for _, tc := range []struct {
		name string
		// setup: "oom" an OOM event, "missed" a start whose cgroup counted a kill,
		// "exit" an exit after started, "replayed" one from before started
		setup   []string
		unknown bool
		finish  []Item
		wantOK  []bool
		// wantCount: whether each finish is to count an UnknownOOM
		wantCount []bool
	}{
		{name: "exit claimed once", setup: []string{"exit"}, finish: []Item{Exit, Exit},
			wantOK: []bool{true, false}, wantCount: []bool{false, false}},
		{name: "unknown exit counted once", setup: []string{"exit"}, unknown: true, finish: []Item{Exit, Exit},
			wantOK: []bool{true, false}, wantCount: []bool{true, false}},
		{name: "replayed unknown exit not counted", setup: []string{"replayed"}, unknown: true, finish: []Item{Exit},
			wantOK: []bool{true}, wantCount: []bool{false}},
		{name: "the exit takes the OOM events", setup: []string{"oom", "exit"}, finish: []Item{Exit, OOM},
			wantOK: []bool{true, false}, wantCount: []bool{false, false}},
		{name: "OOM events, then the exit", setup: []string{"oom", "exit"}, unknown: true, finish: []Item{OOM, Exit},
			wantOK: []bool{true, true}, wantCount: []bool{true, false}},
		{name: "OOM events claimed once", setup: []string{"oom", "oom"}, finish: []Item{OOM, OOM},
			wantOK: []bool{true, false}, wantCount: []bool{false, false}},
		{name: "a missed OOM kill is not counted", setup: []string{"missed"}, unknown: true, finish: []Item{OOM},
			wantOK: []bool{true}, wantCount: []bool{false}},
		{name: "no exit", setup: []string{"oom"}, finish: []Item{Exit}, wantOK: []bool{false}, wantCount: []bool{false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb := New(classify.PIDFacts{})
			for _, s := range tc.setup {
				switch s {
				case "oom":
					tb.apply(tableEvent(cri.OOM, 1), t0, Reading{})
				case "missed":
					tb.apply(tableEvent(cri.Started, 1), t0, Reading{Mem: memWith(1, 0, 0)})
				case "exit", "replayed":
					ev := tableEvent(cri.Exited, 1)
					ev.FinishedAt = started.Add(time.Second)
					if s == "replayed" {
						ev.FinishedAt = started.Add(-time.Second)
					}
					tb.apply(ev, t0, Reading{})
				}
			}
			now := t0.Add(time.Minute)
			for i, kind := range tc.finish {
				var ok, count bool
				if kind == Exit {
					var c ExitClaim
					c, ok = tb.FinishExit(containerID(1), now, started, tc.unknown)
					count = c.CountUnknown
					if ok && c.Replay != (tc.setup[len(tc.setup)-1] == "replayed") {
						t.Errorf("finish %d: replay %v", i, c.Replay)
					}
				} else {
					var c OOMClaim
					c, ok = tb.FinishOOM(containerID(1), tc.unknown)
					count = c.CountUnknown
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
			if queued := tb.apply(tableEvent(cri.OOM, 1), now, Reading{}); queued == c.exitDone {
				t.Errorf("OOM event after the finishes queued: %v (exit done %v)", queued, c.exitDone)
			}
		})
	}
}

// TestLedgerFinishOOMTimes: FinishOOM hands the first and the last OOM event not
// classified before.
func TestLedgerFinishOOMTimes(t *testing.T) {
	tb := New(classify.PIDFacts{})
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	oom := func(s int) {
		ev := tableEvent(cri.OOM, 1)
		ev.OOMAt = at(s)
		tb.apply(ev, t0, Reading{})
	}
	oom(1)
	oom(2)
	if c, ok := tb.FinishOOM(containerID(1), false); !ok || !c.First.Equal(at(1)) || !c.Last.Equal(at(2)) {
		t.Errorf("first claim %+v, %v; want %v to %v", c, ok, at(1), at(2))
	}
	oom(3)
	if c, ok := tb.FinishOOM(containerID(1), false); !ok || !c.First.Equal(at(3)) || !c.Last.Equal(at(3)) {
		t.Errorf("second claim %+v, %v; want %v", c, ok, at(3))
	}
}

// TestLedgerWaits: the pod wait starts once per item and the API server's confirmation is
// kept; the kernel wait is per item.
func TestLedgerWaits(t *testing.T) {
	tb := New(classify.PIDFacts{})
	id := containerID(1)
	tb.apply(tableEvent(cri.OOM, 1), t0, Reading{})
	tb.apply(tableEvent(cri.Exited, 1), t0, Reading{})
	for _, tc := range []struct {
		kind      Item
		now       time.Time
		confirm   bool
		wantFirst time.Time
		wantConf  bool
	}{
		{kind: Exit, now: t0, wantFirst: t0},
		{kind: Exit, now: t0.Add(time.Second), confirm: true, wantFirst: t0},
		{kind: Exit, now: t0.Add(2 * time.Second), wantFirst: t0, wantConf: true},
		{kind: OOM, now: t0.Add(3 * time.Second), wantFirst: t0.Add(3 * time.Second), wantConf: true},
	} {
		first, conf := tb.AwaitPod(id, tc.kind, tc.now)
		if !first.Equal(tc.wantFirst) || conf != tc.wantConf {
			t.Errorf("%s at +%v: waiting since %v, confirmed %v; want %v, %v", tc.kind, tc.now.Sub(t0), first, conf, tc.wantFirst, tc.wantConf)
		}
		if tc.confirm {
			tb.PodConfirmed(id)
		}
	}
	tb.KernelWait(id, Exit)
	for kind, want := range map[Item]bool{Exit: true, OOM: false} {
		if s, ok := tb.Snapshot(id, kind); !ok || s.KernelWaited != want {
			t.Errorf("%s: waited %v, %v; want %v", kind, s.KernelWaited, ok, want)
		}
	}
	// Nothing happens to a container the table does not know.
	other := containerID(2)
	tb.KernelWait(other, Exit)
	tb.PodConfirmed(other)
	tb.Drop(other, Exit, t0, true)
	if _, ok := tb.Snapshot(other, Exit); ok || len(tb.containers) != 1 {
		t.Errorf("a container appeared: %d", len(tb.containers))
	}
}

// TestLedgerDrop: a dropped exit is done (and collectable), dropped OOM events are
// handled, and a pod gone forgets its runtime states.
func TestLedgerDrop(t *testing.T) {
	for _, tc := range []struct {
		name      string
		kind      Item
		forgetPod bool
		wantDone  bool
	}{
		{name: "exit", kind: Exit, wantDone: true},
		{name: "exit of a pod gone", kind: Exit, forgetPod: true, wantDone: true},
		{name: "OOM", kind: OOM},
		{name: "OOM of a pod gone", kind: OOM, forgetPod: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb := New(classify.PIDFacts{})
			id := containerID(1)
			tb.apply(tableEvent(cri.OOM, 1), t0, Reading{})
			tb.apply(tableEvent(cri.Exited, 1), t0, Reading{})
			now := t0.Add(time.Second)
			tb.Drop(id, tc.kind, now, tc.forgetPod)
			_, exitPending := tb.Pending(id, Exit)
			_, oomPending := tb.Pending(id, OOM)
			if exitPending == tc.wantDone || oomPending {
				t.Errorf("pending: exit %v, OOM %v", exitPending, oomPending)
			}
			if c := tb.containers[id]; c.doneAt.Equal(now) != tc.wantDone {
				t.Errorf("done at %v", c.doneAt)
			}
			if n := len(tb.Observed(tablePod)); (n == 0) != tc.forgetPod {
				t.Errorf("%d runtime states kept", n)
			}
		})
	}
}

// TestLedgerSnapshot: the facts are ClassifyOOM's, copied from the table.
func TestLedgerSnapshot(t *testing.T) {
	tb := New(classify.PIDFacts{InitNamespace: true})
	id := containerID(1)
	start := tableEvent(cri.Started, 1)
	start.PID, start.MemoryLimit = 42, 0
	tb.apply(start, t0, Reading{Mem: memWith(0, 1<<20, 20<<20), Pod: memWith(0, 1<<20, 0), PIDs: []int{42, 43}})
	// Seen running again (a relist): the pod's counters still count from the first reading.
	tb.apply(start, t0, Reading{Mem: memWith(0, 1<<20, 20<<20), Pod: memWith(1, 1<<20, 0), PIDs: []int{42, 43}})
	tb.apply(tableEvent(cri.OOM, 1), t0, Reading{Mem: memWith(1, 20<<20, 20<<20), Pod: memWith(1, 20<<20, 0)})
	exit := tableEvent(cri.Exited, 1)
	exit.ExitCode, exit.Reason, exit.FinishedAt = 137, "OOMKilled", t0
	tb.apply(exit, t0, Reading{})
	tb.LearnKill(oomKill(tablePod, id, 42), t0, klog.Background())

	for _, kind := range []Item{Exit, OOM} {
		s, ok := tb.Snapshot(id, kind)
		if !ok {
			t.Fatalf("%s: no snapshot", kind)
		}
		f := s.Facts
		if f.ContainerID != id || f.PodUID != tablePod || !f.TaskOOM || len(f.PIDs) != 2 || len(f.Kernel) != 1 ||
			f.MemoryLimit != 20<<20 || f.PeakUsage != 20<<20 || f.Counters == nil || f.Counters.OOMKill != 1 ||
			f.PodCounters == nil || f.PodCounters.OOMKill != 1 || f.Pod == nil || !f.PrefixKnown {
			t.Errorf("%s: facts %+v", kind, f)
		}
		if wantCode := map[Item]int32{Exit: 137}[kind]; f.ExitCode != wantCode || (kind == Exit) != (f.Reason == "OOMKilled") {
			t.Errorf("%s: exit code %d, reason %q", kind, f.ExitCode, f.Reason)
		}
		if got := classify.ClassifyOOM(f).Kind; got != classify.LimitOOM {
			t.Errorf("%s: verdict %s", kind, got)
		}
		// A copy: changing it changes nothing in the table.
		f.Pod.OOMKill, f.PIDs[0], f.Kernel[0].PID = 9, 9, 9
	}
	c := tb.containers[id]
	if c.podLast.OOMKill != 1 || c.pids[0] != 42 || tb.evidence.kernel.recs[0].rec.PID != 42 {
		t.Error("the snapshot shares the ledger's memory")
	}
}

// TestLedgerObserved: the runtime's states of a pod's containers, the latest attempt's.
func TestLedgerObserved(t *testing.T) {
	tb := New(classify.PIDFacts{})
	run := func(n int, attempt uint32, kind cri.Kind) {
		ev := tableEvent(kind, n)
		ev.Attempt = attempt
		tb.apply(ev, t0, Reading{})
	}
	state := func() classify.ContainerState {
		s := tb.Observed(tablePod)
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
	tb.Forget("other", tablePod)
	if s := tb.Observed(tablePod); len(s) != 0 {
		t.Errorf("states %+v of a forgotten pod", s)
	}
}

// TestLedgerExpire: what Expire forgets.
func TestLedgerExpire(t *testing.T) {
	tb := New(classify.PIDFacts{})
	tb.apply(tableEvent(cri.Exited, 1), t0, Reading{})
	tb.FinishExit(containerID(1), t0, t0, false)
	tb.apply(tableEvent(cri.Exited, 2), t0, Reading{})
	tb.FinishExit(containerID(2), t0.Add(time.Minute), t0, false)
	tb.apply(tableEvent(cri.Started, 3), t0, Reading{})
	other := tableEvent(cri.Exited, 4)
	other.PodUID = "cached"
	tb.apply(other, t0, Reading{})
	tb.Drop(containerID(4), Exit, t0, false)
	gone := tableEvent(cri.Exited, 5)
	gone.PodUID = "gone"
	tb.apply(gone, t0, Reading{})
	tb.Drop(containerID(5), Exit, t0, false)
	tb.LearnKill(kmsg.OOMKill{PID: 1}, t0, klog.Background())
	tb.LearnKill(kmsg.OOMKill{PID: 2}, t0.Add(2*time.Minute), klog.Background())

	cached := []types.UID{"cached"}
	now := t0.Add(ContainerTTL + 30*time.Second)
	tb.Expire(now, cached)
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
	tb.Expire(t0.Add(KernelTTL+time.Minute), cached)
	if len(tb.evidence.kernel.recs) != 1 || tb.evidence.kernel.recs[0].rec.PID != 2 {
		t.Errorf("kernel kills kept %+v, want the newer one", tb.evidence.kernel.recs)
	}
}

// TestLedgerLateOOMEvent: containerd's OOM event that comes after the exit, while the exit
// waits for late evidence, is queued, reaches the exit's snapshot, and is claimed with the
// exit: the OOM item then finds nothing left.
func TestLedgerLateOOMEvent(t *testing.T) {
	tb := New(classify.PIDFacts{})
	id := containerID(1)
	tb.apply(tableEvent(cri.Started, 1), t0, Reading{})
	exit := tableEvent(cri.Exited, 1)
	exit.ExitCode, exit.Reason, exit.FinishedAt = 137, "Error", t0
	tb.apply(exit, t0, Reading{})
	s, _ := tb.Snapshot(id, Exit)
	if s.Facts.TaskOOM || s.KernelWaited {
		t.Fatalf("before the OOM event: TaskOOM %v, waited %v", s.Facts.TaskOOM, s.KernelWaited)
	}
	tb.KernelWait(id, Exit)

	oom := tableEvent(cri.OOM, 1)
	oom.OOMAt = t0.Add(-time.Millisecond)
	if !tb.apply(oom, t0.Add(time.Millisecond), Reading{Mem: memWith(1, 20<<20, 20<<20)}) {
		t.Error("the OOM event after the exit, not classified yet, was not queued")
	}
	s, _ = tb.Snapshot(id, Exit)
	if !s.Facts.TaskOOM || !s.KernelWaited || s.Facts.Counters == nil || s.Facts.Counters.OOMKill != 1 || s.Facts.ExitCode != 137 {
		t.Errorf("the exit's snapshot after the OOM event: %+v, waited %v", s.Facts, s.KernelWaited)
	}
	if _, ok := tb.FinishExit(id, t0.Add(time.Second), t0.Add(-time.Hour), false); !ok {
		t.Fatal("the exit was not claimed")
	}
	if _, ok := tb.FinishOOM(id, false); ok {
		t.Error("the OOM events were claimed again after the exit took them")
	}
	if st, _ := tb.Container(id); !st.Done() || st.OOMs != 1 {
		t.Errorf("status %+v, want done with 1 OOM event", st)
	}
}
