package agent

// The test environment of the agent's tests: an Agent on a fake clientset, runtime
// (crifake), kernel feed and cgroup tree, with helpers to wait, step the fake clock and
// make pods, events and cgroup readings.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"
	testingclock "k8s.io/utils/clock/testing"

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
	xids    chan kmsg.XidReport // when the test's Config has one
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
		c, ok := e.a.ledger.Container(id)
		return ok && c.Done()
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

// kernelReports feeds kills to the agent's kernel reader and returns once it has read
// them: a test that means "the kernel line came first" must wait for the read, or the
// exit may be classified first and wait KernelWait on a fake clock nobody steps.
func (e *testEnv) kernelReports(kills ...kmsg.OOMKill) {
	e.t.Helper()
	read := e.a.ledger.Kernel().Kills
	for _, k := range kills {
		e.kernel <- k
	}
	e.until("the kernel kills read", func() bool {
		return e.a.ledger.Kernel().Kills == read+len(kills)
	})
}

// oomKill is the kernel's report of a limit OOM in the container.
func oomKill(pod *corev1.Pod, id string, pid int) kmsg.OOMKill {
	cg := podCgroup(pod.UID) + "/" + id
	return kmsg.OOMKill{Scope: kmsg.ScopeMemcg, Constraint: kmsg.ConstraintMemcg, OOMMemcg: cg, TaskMemcg: cg,
		Task: "memhog", PID: pid, MemcgLimitKB: 20 << 10, MemcgUsageKB: 20 << 10, Time: t0}
}
