package agent

// Tests of what happened while the agent was not looking: replayed exits, the kernel log's
// backlog, OOM kills counted before the start.

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/coroner-dev/coroner/agent/metrics"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/cri"
)

// TestReplayedExitWaitsForTheKernelBacklog (issue 12, item 1): an exit from before the
// agent's start (the first relist replays it; its cgroup is gone) is classified only once
// the kernel log's backlog has been read, and the kill line logged while the agent was
// not running places it: the limit OOM is stamped, not left unknown.
func TestReplayedExitWaitsForTheKernelBacklog(t *testing.T) {
	uid := types.UID("cccccccc-cccc-4ccc-8ccc-cccccccccccc")
	p := newPod("hog", uid, corev1.RestartPolicyNever, "main")
	caughtUp := make(chan struct{})
	e := newTestEnv(t, func(c *Config) { c.KernelCaughtUp = caughtUp }, p)
	id := containerID(21)
	ev := exited(p, "main", id, 137, "OOMKilled")
	ev.FinishedAt = t0.Add(-30 * time.Second) // before the start
	ev.Source = cri.SourceRelist
	e.src.Send(ev)
	e.until("the exit seen", func() bool {
		c, ok := e.a.ledger.Container(id)
		return ok && c.Exited
	})
	for range 5 {
		e.clk.Step(50 * time.Millisecond)
		e.settle()
	}
	if e.containerDone(id)() {
		t.Fatal("the replayed exit was classified before the kernel log's backlog was read")
	}

	// The backlog: the kill line, then the reader is caught up.
	kill := oomKill(p, id, 4242)
	kill.Time = ev.FinishedAt
	e.kernel <- kill
	close(caughtUp)
	e.stepUntil("the stamp", 20*time.Millisecond, func() bool {
		return conditions.IsTrue(&e.pod("hog").Status, conditions.OOMKilled)
	})
	if v := metrics.Value(e.m.ContainerExits.WithLabelValues("LimitOOM")); v != 1 {
		t.Errorf("exits classified LimitOOM = %v, want 1", v)
	}
	if v := metrics.Value(e.m.UnknownOOM); v != 0 {
		t.Errorf("unknown OOMs = %v", v)
	}
}

// TestKernelBacklogWaitIsBounded: a kernel log reader that never catches up holds
// classifications for KernelBacklogWait after the start, no longer.
func TestKernelBacklogWaitIsBounded(t *testing.T) {
	uid := types.UID("dddddddd-dddd-4ddd-8ddd-dddddddddddd")
	p := newPod("exit3", uid, corev1.RestartPolicyNever, "main")
	e := newTestEnv(t, func(c *Config) { c.KernelCaughtUp = make(chan struct{}) }, p)
	id := containerID(22)
	e.src.Send(exited(p, "main", id, 3, "Error"))
	e.stepUntil("the exit classified", 100*time.Millisecond, e.containerDone(id))
	if waited := e.clk.Now().Sub(t0); waited < KernelBacklogWait {
		t.Errorf("classified %v after the start, before KernelBacklogWait", waited)
	}
}

// TestOOMCountedBeforeTheStart: a container first seen running whose own cgroup has
// already counted an OOM kill (a child killed while no agent ran) is classified as an
// OOM event: at its limit, it is stamped OOMKilled; an agent started again (the
// condition is there) writes nothing.
func TestOOMCountedBeforeTheStart(t *testing.T) {
	uid := types.UID("eeeeeeee-eeee-4eee-8eee-eeeeeeeeeeee")
	p := newPod("child", uid, corev1.RestartPolicyNever, "main")
	id := containerID(23)
	cg := podCgroup(uid) + "/" + id

	e := newTestEnv(t, nil, p)
	e.writeCgroup(podCgroup(uid), 1, 30, 0, 20<<20)
	e.writeCgroup(cg, 1, 30, 20<<20, 20<<20, 4242) // oom_kill 1, peak at the limit
	e.src.Send(event(cri.Started, p, "main", id))
	e.stepUntil("the stamp", 20*time.Millisecond, func() bool {
		return conditions.IsTrue(&e.pod("child").Status, conditions.OOMKilled)
	})
	e.settle()
	if n := e.patcher.count(); n != 1 {
		t.Errorf("%d patches, want 1", n)
	}

	// The next agent finds the pod stamped.
	stamped := e.pod("child")
	e2 := newTestEnv(t, nil, stamped)
	e2.writeCgroup(podCgroup(uid), 1, 30, 0, 20<<20)
	e2.writeCgroup(cg, 1, 30, 20<<20, 20<<20, 4242)
	e2.src.Send(event(cri.Started, stamped, "main", id))
	e2.stepUntil("the OOM classified", 20*time.Millisecond, func() bool {
		c, ok := e2.a.ledger.Container(id)
		return ok && c.OOMs == 1 && c.OOMsHandled == 1
	})
	for range 10 {
		e2.clk.Step(20 * time.Millisecond)
		e2.settle()
	}
	if n := e2.patcher.count(); n != 0 {
		t.Errorf("the second agent patched %d times, want 0", n)
	}
}

// TestFreshContainerIsNotAnOOM: a container first seen running with counters at 0 is
// not classified.
func TestFreshContainerIsNotAnOOM(t *testing.T) {
	uid := types.UID("ffffffff-ffff-4fff-8fff-ffffffffffff")
	p := newPod("fresh", uid, corev1.RestartPolicyNever, "main")
	e := newTestEnv(t, nil, p)
	id := containerID(24)
	e.writeCgroup(podCgroup(uid), 0, 0, 0, 0)
	e.writeCgroup(podCgroup(uid)+"/"+id, 0, 0, 20<<20, 1<<20, 4242)
	e.src.Send(event(cri.Started, p, "main", id))
	e.until("the start reading", func() bool {
		c, ok := e.a.ledger.Container(id)
		return ok && c.StartRead
	})
	c, _ := e.a.ledger.Container(id)
	n := c.OOMs
	if n != 0 {
		t.Errorf("%d OOM events for a fresh container", n)
	}
}
