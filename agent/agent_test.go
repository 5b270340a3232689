package agent

// Tests of the agent end to end on fakes: exits and OOM kills stamped, pods waited for or
// dropped, the stamper's batching and retries, terminal phases, the exit history, health.

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/coroner-dev/coroner/agent/metrics"
	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/cri"
	"github.com/coroner-dev/coroner/cri/crifake"
)

// TestLimitOOMStamped: the kernel's report, containerd's OOM event and the exit with
// reason OOMKilled make one coroner.dev/OOMKilled stamp in one patch.
func TestLimitOOMStamped(t *testing.T) {
	uid := types.UID("11111111-1111-4111-8111-111111111111")
	p := newPod("hog", uid, corev1.RestartPolicyNever, "main")
	e := newTestEnv(t, nil, p)
	id := containerID(1)
	cg := e.startedWith20MiB(p, id, 4242)
	e.kernelReports(oomKill(p, id, 4242))
	e.writeCgroup(cg, 1, 30, 20<<20, 20<<20, 4242)
	e.writeCgroup(podCgroup(uid), 1, 30, 0, 20<<20)
	oom := event(cri.OOM, p, "main", id)
	oom.OOMAt = t0.Add(-50 * time.Millisecond)
	e.src.Send(oom)
	e.src.Send(exited(p, "main", id, 137, "OOMKilled"))
	e.until("the exit classified", e.containerDone(id))
	e.settle()
	if n := e.patcher.count(); n != 0 {
		t.Fatalf("%d patches before the batch period", n)
	}
	e.stepUntil("the stamp", 10*time.Millisecond, func() bool {
		return conditions.IsTrue(&e.pod("hog").Status, conditions.OOMKilled)
	})
	e.settle()
	got := conditions.Find(&e.pod("hog").Status, conditions.OOMKilled)
	if got.Reason != conditions.ReasonMemoryLimitExceeded || !strings.Contains(got.Message, "container main") || !strings.Contains(got.Message, "20Mi") {
		t.Errorf("condition %+v, want reason MemoryLimitExceeded naming container main and 20Mi", got)
	}
	if n := e.patcher.count(); n != 1 {
		t.Errorf("%d patches, want 1", n)
	}
	if v := metrics.Value(e.m.Stamps.WithLabelValues("LimitOOM", "MemoryLimitExceeded")); v != 1 {
		t.Errorf("stamps = %v, want 1", v)
	}
	if v := metrics.Value(e.m.ContainerExits.WithLabelValues("LimitOOM")); v != 1 {
		t.Errorf("exits classified LimitOOM = %v, want 1", v)
	}
	if v := metrics.Value(e.m.DetectionLatency); v != 1 {
		t.Errorf("latency samples = %v, want 1", v)
	}
	if p := e.pod("hog"); p.Status.Phase != corev1.PodRunning {
		t.Errorf("phase %q: the agent must not set a phase on a pod that is not being deleted", p.Status.Phase)
	}
}

// TestNotOOMExitWritesNothing: exit 3 of a restartPolicy Never pod is seen and classified
// and nothing is written.
func TestNotOOMExitWritesNothing(t *testing.T) {
	uid := types.UID("22222222-2222-4222-8222-222222222222")
	p := newPod("exit3", uid, corev1.RestartPolicyNever, "main")
	e := newTestEnv(t, nil, p)
	id := containerID(2)
	e.src.Send(exited(p, "main", id, 3, "Error"))
	e.until("the exit classified", e.containerDone(id))
	e.stepUntil("a few batch periods", 50*time.Millisecond, func() bool { return e.clk.Since(t0) > time.Second })
	e.settle()
	if n := e.patcher.count(); n != 0 {
		t.Errorf("%d patches, want none", n)
	}
	if v := metrics.Value(e.m.ContainerExits.WithLabelValues(metrics.VerdictNotOOM)); v != 1 {
		t.Errorf("NotOOM exits = %v, want 1", v)
	}
}

// TestPodNotInCacheYet: the exit arrives before the pod's watch event; the agent waits
// for it and stamps.
func TestPodNotInCacheYet(t *testing.T) {
	e := newTestEnv(t, nil)
	uid := types.UID("33333333-3333-4333-8333-333333333333")
	p := newPod("late", uid, corev1.RestartPolicyNever, "main")
	id := containerID(3)
	e.kernel <- oomKill(p, id, 0)
	e.src.Send(exited(p, "main", id, 137, "OOMKilled"))
	e.settle()
	e.clk.Step(100 * time.Millisecond) // a retry or two, well within PodCacheWait
	e.settle()
	if _, err := e.client.CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.until("the pod cached", e.cached(uid))
	e.stepUntil("the stamp", 20*time.Millisecond, func() bool {
		return conditions.IsTrue(&e.pod("late").Status, conditions.OOMKilled)
	})
	if v := metrics.Value(e.m.DroppedEvents); v != 0 {
		t.Errorf("dropped = %v, want 0", v)
	}
}

// TestPodGoneOrElsewhere: exits of deleted pods, of pods that never reached this node's
// cache and of pods of other nodes are counted and dropped; nothing is written.
func TestPodGoneOrElsewhere(t *testing.T) {
	deleted := newPod("deleted", "44444444-4444-4444-8444-444444444444", corev1.RestartPolicyNever, "main")
	elsewhere := newPod("elsewhere", "55555555-5555-4555-8555-555555555555", corev1.RestartPolicyNever, "main")
	elsewhere.Spec.NodeName = "node-b"
	never := newPod("never", "66666666-6666-4666-8666-666666666666", corev1.RestartPolicyNever, "main")
	e := newTestEnv(t, nil, deleted, elsewhere)
	e.until("the pod cached", e.cached(deleted.UID))
	if err := e.client.CoreV1().Pods(ns).Delete(context.Background(), "deleted", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.until("the deletion seen", func() bool { return e.a.podByUID(deleted.UID) == nil })

	for i, p := range []*corev1.Pod{deleted, elsewhere, never} {
		id := containerID(40 + i)
		e.kernel <- oomKill(p, id, 0)
		e.src.Send(exited(p, "main", id, 137, "OOMKilled"))
	}
	e.stepUntil("all dropped", 100*time.Millisecond, func() bool {
		return metrics.Value(e.m.DroppedEvents) == 3
	})
	if v := metrics.Value(e.m.DroppedEvents.WithLabelValues(metrics.DroppedPodGone)); v != 2 {
		t.Errorf("dropped as gone = %v, want 2", v)
	}
	if v := metrics.Value(e.m.DroppedEvents.WithLabelValues(metrics.DroppedOtherNode)); v != 1 {
		t.Errorf("dropped as other node = %v, want 1", v)
	}
	if n := e.patcher.count(); n != 0 {
		t.Errorf("%d patches, want none", n)
	}
}

// TestBatchingOnePatch: a pod being deleted whose two containers are OOM-killed gets the
// OOMKilled condition and phase Failed in one patch.
func TestBatchingOnePatch(t *testing.T) {
	uid := types.UID("77777777-7777-4777-8777-777777777777")
	p := newPod("two", uid, corev1.RestartPolicyNever, "a", "b")
	dt := metav1.NewTime(t0.Add(-time.Minute))
	p.DeletionTimestamp, p.DeletionGracePeriodSeconds = &dt, new(int64)
	e := newTestEnv(t, func(c *Config) { c.PhaseGrace = 0 }, p)
	for i, c := range []string{"a", "b"} {
		id := containerID(70 + i)
		e.kernelReports(oomKill(p, id, 0))
		e.src.Send(exited(p, c, id, 137, "OOMKilled"))
		e.until("the exit classified", e.containerDone(id))
	}
	e.until("the pod decision queued", func() bool { return e.a.stamper.Pending(uid) == 3 }) // OOMKilled twice, the phase
	e.stepUntil("the stamps", 20*time.Millisecond, func() bool { return e.pod("two").Status.Phase == corev1.PodFailed })
	e.settle()
	got := e.pod("two")
	if c := conditions.Find(&got.Status, conditions.OOMKilled); c == nil || !strings.Contains(c.Message, "container a ") {
		t.Errorf("OOMKilled %+v, want the first container's", c)
	}
	if n := e.patcher.count(); n != 1 {
		t.Errorf("%d patches, want 1", n)
	}
}

// TestRetryAfterError: the API server fails the first write; the stamp comes with the
// retry.
func TestRetryAfterError(t *testing.T) {
	uid := types.UID("88888888-8888-4888-8888-888888888888")
	p := newPod("flaky", uid, corev1.RestartPolicyNever, "main")
	e := newTestEnv(t, nil, p)
	e.patcher.errs = []error{apierrors.NewServiceUnavailable("etcd leader changed")}
	id := containerID(8)
	e.kernel <- oomKill(p, id, 0)
	e.src.Send(exited(p, "main", id, 137, "OOMKilled"))
	e.stepUntil("the stamp", 20*time.Millisecond, func() bool {
		return conditions.IsTrue(&e.pod("flaky").Status, conditions.OOMKilled)
	})
	if v := metrics.Value(e.m.WriteErrors); v != 1 {
		t.Errorf("write errors = %v, want 1", v)
	}
	if n := e.patcher.count(); n != 2 {
		t.Errorf("%d patches, want 2 (one failed, one retried)", n)
	}
}

// TestTerminalPhaseAfterGrace (A4): a deleted pod whose container exited 0 gets phase
// Succeeded once the grace is over, not before.
func TestTerminalPhaseAfterGrace(t *testing.T) {
	uid := types.UID("99999999-9999-4999-8999-999999999999")
	p := newPod("done", uid, corev1.RestartPolicyNever, "main")
	e := newTestEnv(t, nil, p)
	id := containerID(9)
	ev := exited(p, "main", id, 0, "Completed")
	ev.FinishedAt = e.clk.Now()
	e.src.Send(ev)
	e.until("the exit classified", e.containerDone(id))
	e.stepUntil("well past the grace", time.Second, func() bool { return e.clk.Since(t0) > 10*time.Second })
	e.settle()
	if n := e.patcher.count(); n != 0 {
		t.Fatalf("%d patches for a pod that is not being deleted", n)
	}

	// The pod is deleted (grace period 30s): the phase is due PhaseGrace after that.
	deleted := e.pod("done")
	dt := metav1.NewTime(e.clk.Now().Add(30 * time.Second))
	deleted.DeletionTimestamp, deleted.DeletionGracePeriodSeconds = &dt, ptr(int64(30))
	if _, err := e.client.CoreV1().Pods(ns).Update(context.Background(), deleted, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.until("the deletion cached", func() bool {
		p := e.a.podByUID(uid)
		return p != nil && p.DeletionTimestamp != nil
	})
	e.stepUntil("almost the grace", 500*time.Millisecond, func() bool { return e.clk.Since(dt.Add(-30*time.Second)) >= 4500*time.Millisecond })
	e.settle()
	if n := e.patcher.count(); n != 0 {
		t.Fatalf("phase written before the grace was over")
	}
	e.stepUntil("the phase", 100*time.Millisecond, func() bool { return e.pod("done").Status.Phase == corev1.PodSucceeded })
	e.until("the stamp counted", func() bool {
		return metrics.Value(e.m.Stamps.WithLabelValues("TerminalPhase", "Succeeded")) == 1
	})
	if e.pod("done").DeletionTimestamp == nil {
		t.Error("the pod lost its deletion")
	}
}

// TestExitHistory (A5): two exits of a restarting container end up in the annotation.
func TestExitHistory(t *testing.T) {
	uid := types.UID("aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa")
	p := newPod("crashy", uid, corev1.RestartPolicyOnFailure, "main")
	e := newTestEnv(t, nil, p)
	for attempt := range uint32(2) {
		id := containerID(100 + int(attempt))
		ev := exited(p, "main", id, 1, "Error")
		ev.Attempt = attempt
		ev.FinishedAt = t0.Add(time.Duration(attempt) * time.Minute)
		e.src.Send(ev)
		e.until("the exit classified", e.containerDone(id))
	}
	var entries []v1alpha1.Exit
	e.stepUntil("both exits recorded", 20*time.Millisecond, func() bool {
		entries, _ = v1alpha1.ParseExitHistory(e.pod("crashy").Annotations[conditions.AnnotationExitHistory])
		return len(entries) == 2
	})
	if entries[0].RestartCount != 0 || entries[1].RestartCount != 1 || entries[1].ExitCode != 1 {
		t.Errorf("exit history %+v", entries)
	}
	if p := e.pod("crashy"); len(p.Status.Conditions) != 0 || p.Status.Phase != corev1.PodRunning {
		t.Errorf("status changed: %+v", p.Status)
	}
}

// TestChildOOMStampedWhileRunning: containerd's OOM event for a container that keeps
// running (a child was killed) stamps OOMKilled when the kernel places it at the limit.
func TestChildOOMStampedWhileRunning(t *testing.T) {
	uid := types.UID("bbbbbbbb-bbbb-4bbb-8bbb-bbbbbbbbbbbb")
	p := newPod("child", uid, corev1.RestartPolicyNever, "main")
	e := newTestEnv(t, nil, p)
	id := containerID(11)
	e.kernel <- oomKill(p, id, 777) // the child's pid, not one the agent knows
	oom := event(cri.OOM, p, "main", id)
	oom.OOMAt = t0
	e.src.Send(oom)
	e.stepUntil("the stamp", 20*time.Millisecond, func() bool {
		return conditions.IsTrue(&e.pod("child").Status, conditions.OOMKilled)
	})
	if v := metrics.Value(e.m.ContainerExits); v != 0 {
		t.Errorf("exits = %v for a container that did not exit", v)
	}
}

func TestRuntimeHealth(t *testing.T) {
	src := crifake.New(1)
	if err := RuntimeHealth(src); err != nil {
		t.Errorf("connected: %v", err)
	}
	src.SetConnected(false)
	if err := RuntimeHealth(src); err == nil {
		t.Error("disconnected: nil error")
	}
	why := errors.New("CRI endpoint unix:///run/x.sock: socket /run/x.sock does not exist: is the container runtime running?")
	withErr := &lastErrSource{Source: src, err: why}
	for _, tc := range []struct {
		name     string
		check    func() error
		wantCode int
		wantBody string
	}{
		{name: "connected", check: func() error { return nil }, wantCode: 200, wantBody: "ok"},
		{name: "socket missing", check: func() error { return RuntimeHealth(withErr) }, wantCode: 503, wantBody: "is the container runtime running?"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			HealthHandler(tc.check).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
			if rec.Code != tc.wantCode || !strings.Contains(rec.Body.String(), tc.wantBody) {
				t.Errorf("got %d %q, want %d containing %q", rec.Code, rec.Body.String(), tc.wantCode, tc.wantBody)
			}
		})
	}
}

type lastErrSource struct {
	*crifake.Source
	err error
}

func (s *lastErrSource) LastError() error { return s.err }

// TestRuntimeConnectedMetric: the gauge follows the source.
func TestRuntimeConnectedMetric(t *testing.T) {
	e := newTestEnv(t, nil)
	e.stepUntil("connected", time.Second, func() bool { return metrics.Value(e.m.RuntimeConnected) == 1 })
	e.src.SetConnected(false)
	e.stepUntil("disconnected", time.Second, func() bool { return metrics.Value(e.m.RuntimeConnected) == 0 })
	if err := e.a.Healthy(); err == nil {
		t.Error("Healthy() = nil while the runtime is disconnected")
	}
}

// TestPodCacheDropsManagedFields: the agent's pod cache keeps its node's pods without
// their managedFields.
func TestPodCacheDropsManagedFields(t *testing.T) {
	uid := types.UID("44444444-4444-4444-8444-444444444444")
	p := newPod("managed", uid, corev1.RestartPolicyNever, "main")
	p.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate, Subresource: "status"}}
	e := newTestEnv(t, nil, p)
	e.until("the pod cached", e.cached(uid))
	got := e.a.podByUID(uid)
	if got == nil || got.ManagedFields != nil || got.Name != "managed" {
		t.Errorf("cached pod %+v, want it without managedFields", got)
	}
}
