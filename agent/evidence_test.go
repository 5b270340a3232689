package agent

// Tests of OOM kills whose evidence is missing or late, of pod-level decisions for
// evicted and static pods, and of the shutdown drain.

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	"github.com/coroner-dev/coroner/agent/ledger"
	"github.com/coroner-dev/coroner/agent/metrics"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/cri"
)

func ptr[T any](v T) *T { return &v }

// oomWithoutKernelReport makes a limit OOM kill in the container id of p's container
// "main" that its cgroup counters show (usage peaked at the 20 MiB limit) and no kernel
// report names: the container starts, the counters move, containerd's OOM event comes,
// and it returns once the agent waits for the kernel's report (KernelWait).
func (e *testEnv) oomWithoutKernelReport(p *corev1.Pod, id string) {
	e.t.Helper()
	cg := podCgroup(p.UID) + "/" + id
	e.writeCgroup(podCgroup(p.UID), 0, 0, 0, 0)
	e.writeCgroup(cg, 0, 0, 20<<20, 1<<20, 99)
	e.src.Send(event(cri.Started, p, "main", id))
	e.until("the start reading", func() bool {
		c, ok := e.a.ledger.Container(id)
		return ok && c.StartRead
	})
	e.writeCgroup(cg, 1, 12, 20<<20, 20<<20, 99)
	e.writeCgroup(podCgroup(p.UID), 1, 12, 0, 20<<20)
	oom := event(cri.OOM, p, "main", id)
	oom.OOMAt = t0
	e.src.Send(oom)
	e.until("waiting for the kernel", func() bool {
		c, ok := e.a.ledger.Container(id)
		return ok && c.Waited(ledger.OOM)
	})
}

// TestOOMWithoutKernelReport: an OOM kill whose kernel report never comes is classified
// from the cgroup counters after KernelWait: peak usage at the limit is the pod's own.
func TestOOMWithoutKernelReport(t *testing.T) {
	uid := types.UID("cccccccc-cccc-4ccc-8ccc-cccccccccccc")
	p := newPod("quiet", uid, corev1.RestartPolicyNever, "main")
	e := newTestEnv(t, nil, p)
	e.oomWithoutKernelReport(p, containerID(12))
	e.settle()
	if n := e.a.stamper.Pending(uid); n != 0 {
		t.Fatalf("%d stamps pending before KernelWait is over", n)
	}
	e.stepUntil("the stamp", 50*time.Millisecond, func() bool {
		return conditions.IsTrue(&e.pod("quiet").Status, conditions.OOMKilled)
	})
	if c := conditions.Find(&e.pod("quiet").Status, conditions.OOMKilled); !strings.Contains(c.Message, "peak 20Mi") {
		t.Errorf("message %q, want the peak usage", c.Message)
	}
}

// TestKubeletEviction (A3): a pod the kubelet evicted, on a kubelet that does not add
// DisruptionTarget, gets DisruptionTarget TerminationByKubelet at once, and phase Failed
// once its container has stopped and the grace is over.
func TestKubeletEviction(t *testing.T) {
	uid := types.UID("dddddddd-dddd-4ddd-8ddd-dddddddddddd")
	p := newPod("evicted", uid, corev1.RestartPolicyNever, "main")
	p.Status.Reason, p.Status.Message = "Evicted", "The node was low on resource: memory."
	e := newTestEnv(t, nil, p)
	e.stepUntil("the condition", 20*time.Millisecond, func() bool {
		return conditions.IsTrue(&e.pod("evicted").Status, conditions.DisruptionTarget)
	})
	c := conditions.Find(&e.pod("evicted").Status, conditions.DisruptionTarget)
	if c.Reason != conditions.ReasonTerminationByKubelet || c.Message != p.Status.Message {
		t.Errorf("DisruptionTarget %+v", c)
	}
	if ph := e.pod("evicted").Status.Phase; ph != corev1.PodRunning {
		t.Fatalf("phase %q while the container may run", ph)
	}
	id := containerID(13)
	ev := exited(p, "main", id, 137, "Error")
	ev.FinishedAt = e.clk.Now()
	e.src.Send(ev)
	// With no OOM evidence, the 137 exit waits KernelWait on the agent's clock.
	e.stepUntil("the exit classified", 50*time.Millisecond, e.containerDone(id))
	e.stepUntil("phase Failed", 200*time.Millisecond, func() bool { return e.pod("evicted").Status.Phase == corev1.PodFailed })
	if since := e.clk.Since(ev.FinishedAt); since < 5*time.Second {
		t.Errorf("phase written %v after the exit, before the grace of 5s", since)
	}
	e.until("both stamps counted", func() bool {
		return metrics.Value(e.m.Stamps.WithLabelValues("TerminationByKubelet", "Evicted")) == 1 &&
			metrics.Value(e.m.Stamps.WithLabelValues("TerminalPhase", "Failed")) == 1
	})
}

// TestStaticPodMirrorStamped (N4): a static pod's containers carry the kubelet's config
// hash as their pod UID (CRI label and cgroup pod<hash>); the agent finds the mirror pod
// by its kubernetes.io/config.mirror annotation and stamps it, under its own name and
// UID, and its pod-level decision sees the runtime's states.
func TestStaticPodMirrorStamped(t *testing.T) {
	const hash = "5b6f2f1f8d7c6e4d3b2a19081726354a"
	mirror := newPod("etcd-node-a", "f0f0f0f0-f0f0-4f0f-8f0f-f0f0f0f0f0f0", corev1.RestartPolicyAlways, "etcd")
	mirror.Annotations = map[string]string{corev1.MirrorPodAnnotationKey: hash, "kubernetes.io/config.hash": hash}
	e := newTestEnv(t, nil, mirror)
	e.until("the mirror pod found by the hash", func() bool {
		p := e.a.podByUID(hash)
		return p != nil && p.Name == "etcd-node-a"
	})
	static := mirror.DeepCopy()
	static.UID = hash // what the runtime's events say
	id := containerID(30)
	e.kernelReports(oomKill(static, id, 0))
	e.src.Send(exited(static, "etcd", id, 137, "OOMKilled"))
	e.until("the exit classified", e.containerDone(id))
	e.stepUntil("the stamp", 20*time.Millisecond, func() bool {
		return conditions.IsTrue(&e.pod("etcd-node-a").Status, conditions.OOMKilled)
	})
	if got := e.pod("etcd-node-a"); got.UID != mirror.UID {
		t.Errorf("stamped pod UID %s, want the mirror pod's %s", got.UID, mirror.UID)
	}
	if v := metrics.Value(e.m.DroppedEvents); v != 0 {
		t.Errorf("dropped = %v, want 0", v)
	}
	if n := len(e.a.ledger.Observed(runtimeUID(e.a.podByUID(mirror.UID)))); n != 1 {
		t.Errorf("the pod-level decision sees %d runtime states, want 1", n)
	}
}

// limitOOMExit: the kernel reports a limit OOM kill in p's container "main" (id), the
// container exits OOMKilled, and it returns once the stamp waits in the stamper (its
// batch period, which the frozen fake clock does not end).
func (e *testEnv) limitOOMExit(p *corev1.Pod, id string) {
	e.t.Helper()
	e.kernelReports(oomKill(p, id, 0))
	e.src.Send(exited(p, "main", id, 137, "OOMKilled"))
	e.until("the stamp queued", func() bool { return e.a.stamper.Pending(p.UID) > 0 })
}

// TestShutdownWritesWhatItKnows: told to stop (SIGTERM, a rollout), the agent still
// writes the stamp waiting for its batch and classifies the OOM kill that was waiting for
// a kernel report (which can no longer come), then returns; nothing is dropped.
func TestShutdownWritesWhatItKnows(t *testing.T) {
	hogUID := types.UID("dddddddd-dddd-4ddd-8ddd-dddddddddddd")
	quietUID := types.UID("eeeeeeee-eeee-4eee-8eee-eeeeeeeeeeee")
	hog := newPod("hog", hogUID, corev1.RestartPolicyNever, "main")
	quiet := newPod("quiet", quietUID, corev1.RestartPolicyNever, "main")
	e := newTestEnv(t, func(c *Config) { c.ShutdownGrace = DefaultShutdownGrace }, hog, quiet)

	e.limitOOMExit(hog, containerID(20))

	e.oomWithoutKernelReport(quiet, containerID(21))
	if conditions.IsTrue(&e.pod("hog").Status, conditions.OOMKilled) {
		t.Fatal("stamped before its batch period: the test shows nothing")
	}

	took := e.shutdown()
	for _, name := range []string{"hog", "quiet"} {
		if !conditions.IsTrue(&e.pod(name).Status, conditions.OOMKilled) {
			t.Errorf("pod %s: no OOMKilled stamp after the shutdown", name)
		}
	}
	if v := metrics.Value(e.m.DroppedEvents); v != 0 {
		t.Errorf("dropped = %v, want 0", v)
	}
	if took >= DefaultShutdownGrace {
		t.Errorf("the drain took %v: it waited out the grace period with nothing left", took)
	}
}

// TestShutdownGraceOver: an API server that refuses every write holds the stamp; the
// agent gives up when the grace period is over, counts the stamp dropped and returns.
func TestShutdownGraceOver(t *testing.T) {
	uid := types.UID("ffffffff-ffff-4fff-8fff-ffffffffffff")
	p := newPod("stuck", uid, corev1.RestartPolicyNever, "main")
	e := newTestEnv(t, func(c *Config) { c.ShutdownGrace = 3 * time.Second }, p)
	for range 100 {
		e.patcher.errs = append(e.patcher.errs, apierrors.NewServiceUnavailable("etcd is down"))
	}
	e.limitOOMExit(p, containerID(22))

	took := e.shutdown()
	if took < 3*time.Second || took > 4*time.Second {
		t.Errorf("the drain took %v, want the grace period (3s)", took)
	}
	if conditions.IsTrue(&e.pod("stuck").Status, conditions.OOMKilled) {
		t.Error("stamped although every write failed")
	}
	if v := metrics.Value(e.m.DroppedEvents); v != 1 {
		t.Errorf("dropped = %v, want 1 (reason Shutdown)", v)
	}
	if e.patcher.count() < 2 {
		t.Errorf("%d writes, want the stamper to keep retrying during the drain", e.patcher.count())
	}
}

// TestLateOOMEvidence: a SIGKILL exit (137) reported before any evidence of an OOM kill
// waits KernelWait for it: containerd's OOM event arriving after the exit still makes it
// a limit OOM; a 137 exit that no evidence follows (a kill by the kubelet) stays NotOOM
// and writes nothing.
func TestLateOOMEvidence(t *testing.T) {
	uid := types.UID("eeeeeeee-eeee-4eee-8eee-eeeeeeeeeeee")
	p := newPod("late", uid, corev1.RestartPolicyNever, "main")
	killed := newPod("killed", types.UID("ffffffff-ffff-4fff-8fff-ffffffffffff"), corev1.RestartPolicyNever, "main")
	e := newTestEnv(t, nil, p, killed)
	id := containerID(40)
	cg := e.startedWith20MiB(p, id, 77)
	e.writeCgroup(cg, 0, 12, 20<<20, 20<<20, 77)
	e.writeCgroup(podCgroup(uid), 0, 12, 0, 20<<20)
	e.src.Send(exited(p, "main", id, 137, "Error"))
	e.until("the exit waiting for evidence", func() bool {
		c, ok := e.a.ledger.Container(id)
		return ok && c.Waited(ledger.Exit)
	})
	oom := event(cri.OOM, p, "main", id)
	oom.OOMAt = t0
	e.src.Send(oom)
	e.stepUntil("the stamp", 50*time.Millisecond, func() bool {
		return conditions.IsTrue(&e.pod("late").Status, conditions.OOMKilled)
	})
	if v := metrics.Value(e.m.ContainerExits.WithLabelValues("LimitOOM")); v != 1 {
		t.Errorf("exits classified LimitOOM = %v, want 1", v)
	}

	other := containerID(41)
	e.src.Send(exited(killed, "main", other, 137, "Error"))
	e.until("the kill waiting for evidence", func() bool {
		c, ok := e.a.ledger.Container(other)
		return ok && c.Waited(ledger.Exit)
	})
	e.stepUntil("the kill classified", 50*time.Millisecond, e.containerDone(other))
	if v := metrics.Value(e.m.ContainerExits.WithLabelValues(metrics.VerdictNotOOM)); v != 1 {
		t.Errorf("NotOOM exits = %v, want 1", v)
	}
	e.stepUntil("a few batch periods", 50*time.Millisecond, func() bool { return e.clk.Since(t0) > 2*time.Second })
	e.settle()
	if c := conditions.Find(&e.pod("killed").Status, conditions.OOMKilled); c != nil {
		t.Errorf("a SIGKILL without OOM evidence stamped %+v", c)
	}
}

// startedWith20MiB starts p's container "main" as id, its cgroup (returned) limited to
// 20 MiB with 1 MiB in use and pid in it, the pod's cgroup at zero, and returns once the
// agent has read both at the start.
func (e *testEnv) startedWith20MiB(p *corev1.Pod, id string, pid int) string {
	e.t.Helper()
	cg := podCgroup(p.UID) + "/" + id
	e.writeCgroup(podCgroup(p.UID), 0, 0, 0, 0)
	e.writeCgroup(cg, 0, 0, 20<<20, 1<<20, pid)
	e.src.Send(event(cri.Started, p, "main", id))
	e.until("the start reading", func() bool {
		c, ok := e.a.ledger.Container(id)
		return ok && c.StartRead && c.PIDs == 1
	})
	return cg
}
