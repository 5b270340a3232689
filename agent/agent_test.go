package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/coroner-dev/coroner/agent/exithistory"
	"github.com/coroner-dev/coroner/agent/kmsg"
	"github.com/coroner-dev/coroner/agent/metrics"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/cri"
	"github.com/coroner-dev/coroner/cri/crifake"
)

const (
	node = "node-a"
	ns   = "batch"
)

var t0 = time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)

// countingPatcher is the clientset's patcher with a count of patches and injectable
// errors.
type countingPatcher struct {
	conditions.PodPatcher
	mu      sync.Mutex
	patches int
	errs    []error
}

func (p *countingPatcher) PatchPod(ctx context.Context, namespace, name string, pt types.PatchType, data []byte, sub ...string) (*corev1.Pod, error) {
	p.mu.Lock()
	p.patches++
	var err error
	if len(p.errs) > 0 {
		err, p.errs = p.errs[0], p.errs[1:]
	}
	p.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return p.PodPatcher.PatchPod(ctx, namespace, name, pt, data, sub...)
}

func (p *countingPatcher) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.patches
}

type testEnv struct {
	t       *testing.T
	clk     *testingclock.FakeClock
	client  *fake.Clientset
	src     *crifake.Source
	kernel  chan kmsg.OOMKill
	patcher *countingPatcher
	a       *Agent
	m       *metrics.Metrics
	root    string
	cancel  context.CancelFunc // Run's
	done    chan error         // Run's result
}

func newTestEnv(t *testing.T, tweak func(*Config), pods ...*corev1.Pod) *testEnv {
	t.Helper()
	e := &testEnv{t: t, clk: testingclock.NewFakeClock(t0), src: crifake.New(100), kernel: make(chan kmsg.OOMKill, 10), root: t.TempDir()}
	var objs []runtime.Object
	for _, p := range pods {
		objs = append(objs, p)
	}
	e.client = fake.NewClientset(objs...)
	e.patcher = &countingPatcher{PodPatcher: conditions.NewPodPatcher(e.client, Component)}
	e.m = metrics.New(prometheus.NewRegistry())
	cfg := Config{
		NodeName: node, Client: e.client, Source: e.src, Patcher: e.patcher, Kernel: e.kernel,
		CgroupRoot: e.root, PhaseGrace: 5 * time.Second, Clock: e.clk, Metrics: e.m,
		Recorder: record.NewFakeRecorder(100),
	}
	if tweak != nil {
		tweak(&cfg)
	}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.a = a
	_, ctx := ktesting.NewTestContext(t)
	ctx, e.cancel = context.WithCancel(ctx)
	e.done = make(chan error, 1)
	go func() { e.done <- a.Run(ctx) }()
	t.Cleanup(func() {
		if e.cancel != nil { // else the test's e.shutdown did
			e.shutdown()
		}
	})
	e.until("the cache synced", a.HasSynced)
	return e
}

// until waits, in real time, for cond; the fake clock does not move.
func (e *testEnv) until(what string, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// stepUntil steps the fake clock by step until cond holds.
func (e *testEnv) stepUntil(what string, step time.Duration, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: not within 10s (fake clock at +%v)", what, e.clk.Now().Sub(t0))
		}
		e.clk.Step(step)
		time.Sleep(2 * time.Millisecond)
	}
}

// shutdown ends Run's context (SIGTERM) and steps the fake clock until Run returns: the
// fake time the drain took.
func (e *testEnv) shutdown() time.Duration {
	e.t.Helper()
	start := e.clk.Now()
	e.cancel()
	e.cancel = nil
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case err := <-e.done:
			if err != nil {
				e.t.Errorf("Run: %v", err)
			}
			return e.clk.Now().Sub(start)
		default:
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("Run did not return within 10s (fake clock at +%v)", e.clk.Now().Sub(start))
		}
		e.clk.Step(10 * time.Millisecond)
		time.Sleep(2 * time.Millisecond)
	}
}

// settle lets the agent's goroutines finish what they can without the clock moving.
func (e *testEnv) settle() { time.Sleep(50 * time.Millisecond) }

func (e *testEnv) pod(name string) *corev1.Pod {
	e.t.Helper()
	p, err := e.client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return p
}

func (e *testEnv) cached(uid types.UID) func() bool {
	return func() bool { return e.a.podByUID(uid) != nil }
}

// containerDone reports whether the agent has classified (or dropped) the container's
// exit and its OOM events.
func (e *testEnv) containerDone(id string) func() bool {
	return func() bool {
		e.a.table.mu.Lock()
		defer e.a.table.mu.Unlock()
		c := e.a.table.containers[id]
		return c != nil && c.exitDone && c.oomHandled == len(c.ooms)
	}
}

func newPod(name string, uid types.UID, policy corev1.RestartPolicy, containers ...string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: uid, ResourceVersion: "1"},
		Spec:       corev1.PodSpec{NodeName: node, RestartPolicy: policy},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
	for _, c := range containers {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: c})
	}
	return p
}

func podCgroup(uid types.UID) string { return "/kubepods/burstable/pod" + string(uid) }

func containerID(n int) string { return fmt.Sprintf("%064x", n) }

// writeCgroup writes a cgroup v1 memory directory under root/memory.
func (e *testEnv) writeCgroup(path string, oomKill, failcnt, limit, peak int64, pids ...int) {
	e.t.Helper()
	dir := filepath.Join(e.root, "memory", path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		e.t.Fatal(err)
	}
	var procs []string
	for _, p := range pids {
		procs = append(procs, fmt.Sprint(p))
	}
	for name, content := range map[string]string{
		"memory.oom_control":        fmt.Sprintf("oom_kill_disable 0\nunder_oom 0\noom_kill %d\n", oomKill),
		"memory.failcnt":            fmt.Sprint(failcnt),
		"memory.limit_in_bytes":     fmt.Sprint(limit),
		"memory.usage_in_bytes":     fmt.Sprint(peak / 2),
		"memory.max_usage_in_bytes": fmt.Sprint(peak),
		"cgroup.procs":              strings.Join(procs, "\n"),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			e.t.Fatal(err)
		}
	}
}

func event(kind cri.Kind, pod *corev1.Pod, container, id string) cri.ContainerEvent {
	return cri.ContainerEvent{Kind: kind, PodNamespace: pod.Namespace, PodName: pod.Name, PodUID: string(pod.UID),
		ContainerName: container, ContainerID: id, StartedAt: t0.Add(-time.Minute),
		CgroupPath: podCgroup(pod.UID) + "/" + id, MemoryLimit: 20 << 20, Source: cri.SourceContainerd}
}

func exited(pod *corev1.Pod, container, id string, code int32, reason string) cri.ContainerEvent {
	ev := event(cri.Exited, pod, container, id)
	ev.ExitCode, ev.Reason, ev.FinishedAt, ev.ObservedAt = code, reason, t0, t0
	return ev
}

// oomKill is the kernel's report of a limit OOM in the container.
func oomKill(pod *corev1.Pod, id string, pid int) kmsg.OOMKill {
	cg := podCgroup(pod.UID) + "/" + id
	return kmsg.OOMKill{Scope: kmsg.ScopeMemcg, Constraint: kmsg.ConstraintMemcg, OOMMemcg: cg, TaskMemcg: cg,
		Task: "memhog", PID: pid, MemcgLimitKB: 20 << 10, MemcgUsageKB: 20 << 10, Time: t0}
}

// TestLimitOOMStamped: the kernel's report, containerd's OOM event and the exit with
// reason OOMKilled make one coroner.dev/OOMKilled stamp in one patch.
func TestLimitOOMStamped(t *testing.T) {
	uid := types.UID("11111111-1111-4111-8111-111111111111")
	p := newPod("hog", uid, corev1.RestartPolicyNever, "main")
	e := newTestEnv(t, nil, p)
	id := containerID(1)
	cg := e.startedWith20MiB(p, id, 4242)
	e.kernel <- oomKill(p, id, 4242)
	e.until("the kernel kill read", func() bool {
		e.a.table.mu.Lock()
		defer e.a.table.mu.Unlock()
		return len(e.a.table.kernel.kills) == 1
	})
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
		e.kernel <- oomKill(p, id, 0)
		e.until("the kernel kill read", func() bool {
			e.a.table.mu.Lock()
			defer e.a.table.mu.Unlock()
			return len(e.a.table.kernel.kills) == i+1
		})
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
	var entries []exithistory.Entry
	e.stepUntil("both exits recorded", 20*time.Millisecond, func() bool {
		entries, _ = exithistory.Parse(e.pod("crashy").Annotations[conditions.AnnotationExitHistory])
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
		e.a.table.mu.Lock()
		defer e.a.table.mu.Unlock()
		c := e.a.table.containers[id]
		return c != nil && c.podAtStart != nil
	})
	e.writeCgroup(cg, 1, 12, 20<<20, 20<<20, 99)
	e.writeCgroup(podCgroup(p.UID), 1, 12, 0, 20<<20)
	oom := event(cri.OOM, p, "main", id)
	oom.OOMAt = t0
	e.src.Send(oom)
	e.until("waiting for the kernel", func() bool {
		e.a.table.mu.Lock()
		defer e.a.table.mu.Unlock()
		c := e.a.table.containers[id]
		return c != nil && c.kernelWaited[itemOOM]
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
	e.kernel <- oomKill(static, id, 0)
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
	if n := len(e.a.table.observedStates(runtimeUID(e.a.podByUID(mirror.UID)))); n != 1 {
		t.Errorf("the pod-level decision sees %d runtime states, want 1", n)
	}
}

// limitOOMExit: the kernel reports a limit OOM kill in p's container "main" (id), the
// container exits OOMKilled, and it returns once the stamp waits in the stamper (its
// batch period, which the frozen fake clock does not end).
func (e *testEnv) limitOOMExit(p *corev1.Pod, id string) {
	e.t.Helper()
	e.a.table.mu.Lock()
	read := len(e.a.table.kernel.kills)
	e.a.table.mu.Unlock()
	e.kernel <- oomKill(p, id, 0)
	e.until("the kernel kill read", func() bool {
		e.a.table.mu.Lock()
		defer e.a.table.mu.Unlock()
		return len(e.a.table.kernel.kills) == read+1
	})
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
		e.a.table.mu.Lock()
		defer e.a.table.mu.Unlock()
		c := e.a.table.containers[id]
		return c != nil && c.kernelWaited[itemExit]
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
		e.a.table.mu.Lock()
		defer e.a.table.mu.Unlock()
		c := e.a.table.containers[other]
		return c != nil && c.kernelWaited[itemExit]
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
		e.a.table.mu.Lock()
		defer e.a.table.mu.Unlock()
		c := e.a.table.containers[id]
		return c != nil && c.podAtStart != nil && len(c.pids) == 1
	})
	return cg
}
