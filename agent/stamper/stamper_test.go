package stamper

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/coroner-dev/coroner/agent/classify"
	"github.com/coroner-dev/coroner/agent/exithistory"
	"github.com/coroner-dev/coroner/agent/metrics"
	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/conditions/conditionstest"
)

// fakePods is the shared fake API server for pod writes.
type fakePods = conditionstest.FakePods

var newFakePods = conditionstest.NewFakePods

const (
	ns      = "team-a"
	podName = "train-0"
	podUID  = types.UID("0b5f1f3e-1111-4222-8333-444455556666")
)

var t0 = time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)

func testPod() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: podName, UID: podUID, ResourceVersion: "10"},
		Spec: corev1.PodSpec{NodeName: "node-a", RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "main"}, {Name: "side"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
}

var ref = PodRef{Namespace: ns, Name: podName, UID: podUID}

func limitOOM(container string) classify.Stamp {
	msg := "container " + container + " was OOM-killed at its memory limit of 20Mi"
	return classify.Stamp{Kind: classify.KindLimitOOM, Reason: conditions.ReasonMemoryLimitExceeded, Message: msg,
		Condition: &corev1.PodCondition{Type: conditions.OOMKilled, Status: corev1.ConditionTrue,
			Reason: conditions.ReasonMemoryLimitExceeded, Message: msg, LastTransitionTime: metav1.NewTime(t0)}}
}

func phase(p corev1.PodPhase) classify.Stamp {
	return classify.Stamp{Kind: classify.KindTerminalPhase, Reason: string(p), Phase: p, Message: "phase " + string(p)}
}

func history(container string, restart int32) (classify.Stamp, *v1alpha1.Exit) {
	return classify.Stamp{Kind: classify.KindExitHistory, Reason: "Recorded",
			Annotation: &classify.Annotation{Key: conditions.AnnotationExitHistory, Value: "ignored"}},
		&v1alpha1.Exit{Container: container, ExitCode: 1, Reason: "Error", FinishedAt: t0.Add(time.Duration(restart) * time.Second), RestartCount: restart}
}

type env struct {
	t       *testing.T
	clk     *testingclock.FakeClock
	pods    *fakePods
	s       *Stamper
	reg     *prometheus.Registry
	m       *metrics.Metrics
	rec     *record.FakeRecorder
	mu      sync.Mutex
	lookup  func() *corev1.Pod // what Lookup returns; default the fake's current pod
	stopped chan struct{}
}

func newEnv(t *testing.T, pods ...*corev1.Pod) *env { return newEnvPatching(t, nil, pods...) }

// newEnvPatching is newEnv with the stamper's writes going through wrap(the fake) when
// wrap is not nil.
func newEnvPatching(t *testing.T, wrap func(*fakePods) conditions.PodPatcher, pods ...*corev1.Pod) *env {
	t.Helper()
	e := &env{t: t, clk: testingclock.NewFakeClock(t0), pods: newFakePods(pods...), reg: prometheus.NewRegistry(),
		rec: record.NewFakeRecorder(100), stopped: make(chan struct{})}
	e.m = metrics.New(e.reg)
	var patcher conditions.PodPatcher = e.pods
	if wrap != nil {
		patcher = wrap(e.pods)
	}
	e.s = New(Config{
		Patcher: patcher,
		Lookup: func(uid types.UID) *corev1.Pod {
			e.mu.Lock()
			l := e.lookup
			e.mu.Unlock()
			if l != nil {
				return l()
			}
			p := e.pods.Pod(ns, podName)
			if p == nil || p.UID != uid {
				return nil
			}
			return p
		},
		Clock:    e.clk,
		Metrics:  e.m,
		History:  exithistory.Limits{MaxEntries: 5},
		Recorder: e.rec,
	})
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		defer close(e.stopped)
		e.s.Run(ctx)
	}()
	t.Cleanup(func() { cancel(); <-e.stopped })
	return e
}

func (e *env) setLookup(f func() *corev1.Pod) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.lookup = f
}

// step advances the fake clock by d once the stamper waits on it.
func (e *env) step(d time.Duration) {
	e.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !e.clk.HasWaiters() {
		if time.Now().After(deadline) {
			e.t.Fatal("the stamper does not wait on the clock")
		}
		time.Sleep(time.Millisecond)
	}
	e.clk.Step(d)
}

// waitPatches waits until the fake has seen n patches, then a little more to catch any
// extra one.
func (e *env) waitPatches(n int) {
	e.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for e.pods.PatchCount() < n {
		if time.Now().After(deadline) {
			e.t.Fatalf("%d patches, want %d: %q", e.pods.PatchCount(), n, e.pods.PatchSummaries())
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
	if got := e.pods.PatchCount(); got != n {
		e.t.Fatalf("%d patches, want %d: %q", got, n, e.pods.PatchSummaries())
	}
}

func (e *env) waitIdle() {
	e.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for e.s.Pending(podUID) > 0 {
		if time.Now().After(deadline) {
			e.t.Fatalf("still %d pending", e.s.Pending(podUID))
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
}

func TestBatchOneWritePerPod(t *testing.T) {
	e := newEnv(t, testPod())
	e.s.Add(
		Request{Pod: ref, Stamp: limitOOM("main"), EventTime: t0.Add(-time.Second)},
		Request{Pod: ref, Stamp: limitOOM("side"), EventTime: t0}, // same type: the first stays
		Request{Pod: ref, Stamp: limitOOM("main"), EventTime: t0}, // a duplicate
		Request{Pod: ref, Stamp: phase(corev1.PodFailed), EventTime: t0},
	)
	// Nothing before the batch period is over.
	e.step(DefaultBatchPeriod / 2)
	time.Sleep(20 * time.Millisecond)
	if n := e.pods.PatchCount(); n != 0 {
		t.Fatalf("%d patches before the batch period ended", n)
	}
	e.step(DefaultBatchPeriod / 2)
	e.waitPatches(1)

	got := e.pods.Pod(ns, podName)
	if got.Status.Phase != corev1.PodFailed {
		t.Errorf("phase %q, want Failed", got.Status.Phase)
	}
	c := conditions.Find(&got.Status, conditions.OOMKilled)
	if c == nil || c.Status != corev1.ConditionTrue || !strings.Contains(c.Message, "container main ") {
		t.Errorf("OOMKilled condition %+v, want True naming container main", c)
	}
	if v := metrics.Value(e.m.Stamps.WithLabelValues("LimitOOM", "MemoryLimitExceeded")); v != 1 {
		t.Errorf("LimitOOM stamps = %v, want 1", v)
	}
	if v := metrics.Value(e.m.Stamps.WithLabelValues("TerminalPhase", "Failed")); v != 1 {
		t.Errorf("TerminalPhase stamps = %v, want 1", v)
	}
	if n := metrics.Value(e.m.DetectionLatency); n != 2 {
		t.Errorf("%v latency samples, want 2 (LimitOOM, TerminalPhase)", n)
	}
	// The LimitOOM latency is from its event time, a second before t0, to the patch at
	// t0 + the batch period.
	if want := (time.Second + DefaultBatchPeriod).Seconds(); !hasLatency(t, e.reg, "LimitOOM", want) {
		t.Errorf("no LimitOOM latency sample of %vs", want)
	}
	if len(e.rec.Events) != 2 {
		t.Errorf("%d events, want 2", len(e.rec.Events))
	}
	wantWrites(t, e.m, 1)
}

// wantWrites checks the pod writes counted.
func wantWrites(t *testing.T, m *metrics.Metrics, n float64) {
	t.Helper()
	if v := metrics.Value(m.PodWrites); v != n {
		t.Errorf("pod writes = %v, want %v", v, n)
	}
}

func hasLatency(t *testing.T, reg *prometheus.Registry, kind string, want float64) bool {
	t.Helper()
	n, sum := histogramOf(t, reg, "coroner_agent_detection_latency_seconds", kind)
	return n == 1 && sum > want-0.001 && sum < want+0.001
}

// histogramOf returns the sample count and sum of the series of kind of the histogram
// name; 0, 0 when it has none.
func histogramOf(t *testing.T, reg *prometheus.Registry, name, kind string) (uint64, float64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == kind {
				h := m.GetHistogram()
				return h.GetSampleCount(), h.GetSampleSum()
			}
		}
	}
	return 0, 0
}

// TestStageLatencies: a request with its observation time records the observe and the
// write stage beside the detection latency; one without records the detection latency
// only.
func TestStageLatencies(t *testing.T) {
	e := newEnv(t, testPod())
	e.s.Add(
		// Finished 300 ms before t0, in the agent's runtime watcher 200 ms before t0.
		Request{Pod: ref, Stamp: limitOOM("main"), EventTime: t0.Add(-300 * time.Millisecond), ObservedTime: t0.Add(-200 * time.Millisecond)},
		// A pod-level decision: no observation time.
		Request{Pod: ref, Stamp: phase(corev1.PodFailed), EventTime: t0.Add(-time.Second)},
	)
	e.step(DefaultBatchPeriod) // both written at t0 + 100 ms, in one patch
	e.waitPatches(1)
	for _, tc := range []struct {
		name      string
		metric    string
		kind      string
		wantCount uint64
		wantSum   float64
	}{
		{"detection, observed", "coroner_agent_detection_latency_seconds", "LimitOOM", 1, 0.4},
		{"observe stage", "coroner_agent_observe_latency_seconds", "LimitOOM", 1, 0.1},
		{"write stage", "coroner_agent_write_latency_seconds", "LimitOOM", 1, 0.3},
		{"detection, not observed", "coroner_agent_detection_latency_seconds", "TerminalPhase", 1, 1.1},
		{"no observe stage without an observation time", "coroner_agent_observe_latency_seconds", "TerminalPhase", 0, 0},
		{"no write stage without an observation time", "coroner_agent_write_latency_seconds", "TerminalPhase", 0, 0},
	} {
		n, sum := histogramOf(t, e.reg, tc.metric, tc.kind)
		if n != tc.wantCount || sum < tc.wantSum-0.0001 || sum > tc.wantSum+0.0001 {
			t.Errorf("%s: %s{kind=%s}: %d samples summing %vs, want %d summing %vs", tc.name, tc.metric, tc.kind, n, sum, tc.wantCount, tc.wantSum)
		}
	}
	if o, w := metrics.Value(e.m.ObserveLatency), metrics.Value(e.m.WriteLatency); o != 1 || w != 1 {
		t.Errorf("%v observe and %v write samples in all, want 1 and 1", o, w)
	}
}

func TestStages(t *testing.T) {
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	cases := []struct {
		name            string
		event, observed time.Time
		at              time.Time
		wantObserved    time.Duration
		wantObservedOK  bool
		wantWritten     time.Duration
		wantWrittenOK   bool
	}{
		{name: "both stages", event: ms(0), observed: ms(30), at: ms(250),
			wantObserved: 30 * time.Millisecond, wantObservedOK: true, wantWritten: 220 * time.Millisecond, wantWrittenOK: true},
		{name: "no observation time: neither", event: ms(0), at: ms(250)},
		{name: "no event time: the write stage only", observed: ms(30), at: ms(250),
			wantWritten: 220 * time.Millisecond, wantWrittenOK: true},
		{name: "observed before the event (clock skew): the write stage only", event: ms(40), observed: ms(30), at: ms(250),
			wantWritten: 220 * time.Millisecond, wantWrittenOK: true},
		{name: "written before it was observed: the observe stage only", event: ms(0), observed: ms(300), at: ms(250),
			wantObserved: 300 * time.Millisecond, wantObservedOK: true},
		{name: "observed at the event: zero, known", event: ms(0), observed: ms(0), at: ms(100),
			wantObservedOK: true, wantWritten: 100 * time.Millisecond, wantWrittenOK: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o, ook, w, wok := stages(Request{EventTime: tc.event, ObservedTime: tc.observed}, tc.at)
			if o != tc.wantObserved || ook != tc.wantObservedOK || w != tc.wantWritten || wok != tc.wantWrittenOK {
				t.Errorf("stages = %v %v, %v %v; want %v %v, %v %v", o, ook, w, wok, tc.wantObserved, tc.wantObservedOK, tc.wantWritten, tc.wantWrittenOK)
			}
		})
	}
}

func TestBatchesAreSeparatedByThePeriod(t *testing.T) {
	e := newEnv(t, testPod())
	e.s.Add(Request{Pod: ref, Stamp: limitOOM("main"), EventTime: t0})
	e.step(DefaultBatchPeriod)
	e.waitPatches(1)
	// A later stamp of the same pod waits a period of its own.
	e.s.Add(Request{Pod: ref, Stamp: phase(corev1.PodSucceeded), EventTime: e.clk.Now()})
	time.Sleep(20 * time.Millisecond)
	if n := e.pods.PatchCount(); n != 1 {
		t.Fatalf("%d patches right after the second Add, want 1", n)
	}
	e.step(DefaultBatchPeriod)
	e.waitPatches(2)
	if p := e.pods.Pod(ns, podName); p.Status.Phase != corev1.PodSucceeded {
		t.Errorf("phase %q", p.Status.Phase)
	}
}

func TestRetryAfterError(t *testing.T) {
	e := newEnv(t, testPod())
	e.pods.SetPatchErrs(apierrors.NewServiceUnavailable("etcd is sad"), apierrors.NewTooManyRequests("slow down", 1))
	e.s.Add(Request{Pod: ref, Stamp: limitOOM("main"), EventTime: t0})
	e.step(DefaultBatchPeriod)
	e.waitPatches(1)
	if e.s.Pending(podUID) != 1 {
		t.Fatalf("the failed stamp is not pending any more")
	}
	// Backoff: RetryBase, then twice that.
	e.step(DefaultRetryBase - time.Millisecond)
	time.Sleep(20 * time.Millisecond)
	if n := e.pods.PatchCount(); n != 1 {
		t.Fatalf("retried before the backoff: %d patches", n)
	}
	e.step(time.Millisecond)
	e.waitPatches(2)
	// A stamp added while backing off joins the retry.
	e.s.Add(Request{Pod: ref, Stamp: phase(corev1.PodFailed), EventTime: t0})
	e.step(2 * DefaultRetryBase)
	e.waitPatches(3)
	e.waitIdle()
	got := e.pods.Pod(ns, podName)
	if !conditions.IsTrue(&got.Status, conditions.OOMKilled) || got.Status.Phase != corev1.PodFailed {
		t.Errorf("pod status after the retries: %+v", got.Status)
	}
	if v := metrics.Value(e.m.WriteErrors); v != 2 {
		t.Errorf("write errors = %v, want 2", v)
	}
	wantWrites(t, e.m, 3) // the failed ones count
	if v := metrics.Value(e.m.Stamps.WithLabelValues("LimitOOM", "MemoryLimitExceeded")); v != 1 {
		t.Errorf("LimitOOM stamps = %v, want 1", v)
	}
}

func TestPodGone(t *testing.T) {
	t.Run("not in the cache", func(t *testing.T) {
		e := newEnv(t, testPod())
		e.setLookup(func() *corev1.Pod { return nil })
		e.s.Add(Request{Pod: ref, Stamp: limitOOM("main")})
		e.step(DefaultBatchPeriod)
		e.waitIdle()
		if n := e.pods.PatchCount(); n != 0 {
			t.Errorf("%d patches for a pod that is gone", n)
		}
		if v := metrics.Value(e.m.DroppedEvents.WithLabelValues(metrics.DroppedPodGone)); v != 1 {
			t.Errorf("dropped = %v, want 1", v)
		}
	})
	t.Run("404 from the API server", func(t *testing.T) {
		e := newEnv(t) // the fake has no pod; the cache still does
		cached := testPod()
		e.setLookup(func() *corev1.Pod { return cached })
		e.s.Add(Request{Pod: ref, Stamp: limitOOM("main")})
		e.step(DefaultBatchPeriod)
		e.waitPatches(1)
		e.waitIdle()
		if v := metrics.Value(e.m.DroppedEvents.WithLabelValues(metrics.DroppedPodGone)); v != 1 {
			t.Errorf("dropped = %v, want 1", v)
		}
		if v := metrics.Value(e.m.WriteErrors); v != 0 {
			t.Errorf("a gone pod counted as a write error")
		}
	})
}

func TestTerminalPodKeepsItsPhase(t *testing.T) {
	p := testPod()
	p.Status.Phase = corev1.PodFailed
	e := newEnv(t, p)
	e.s.Add(Request{Pod: ref, Stamp: phase(corev1.PodSucceeded)}, Request{Pod: ref, Stamp: limitOOM("main")})
	e.step(DefaultBatchPeriod)
	e.waitPatches(1)
	got := e.pods.Pod(ns, podName)
	if got.Status.Phase != corev1.PodFailed || !conditions.IsTrue(&got.Status, conditions.OOMKilled) {
		t.Errorf("status %+v: want phase Failed kept and OOMKilled added", got.Status)
	}
}

// TestExitHistoryFromStaleCache: the cache has not seen the first history write when the
// second is computed; the annotation still gets both exits.
func TestExitHistoryFromStaleCache(t *testing.T) {
	p := testPod()
	p.Spec.RestartPolicy = corev1.RestartPolicyOnFailure
	e := newEnv(t, p)
	stale := e.pods.Pod(ns, podName)
	e.setLookup(func() *corev1.Pod { return stale })

	s1, h1 := history("main", 0)
	e.s.Add(Request{Pod: ref, Stamp: s1, History: h1})
	e.step(DefaultBatchPeriod)
	e.waitPatches(1)
	s2, h2 := history("main", 1)
	e.s.Add(Request{Pod: ref, Stamp: s2, History: h2})
	e.step(DefaultBatchPeriod)
	e.waitPatches(3) // a conflict (stale resourceVersion), then the write
	got, err := v1alpha1.ParseExitHistory(e.pods.Pod(ns, podName).Annotations[conditions.AnnotationExitHistory])
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].RestartCount != 0 || got[1].RestartCount != 1 {
		t.Errorf("exit history %+v, want restarts 0 and 1", got)
	}
	if v := metrics.Value(e.m.Stamps.WithLabelValues("ExitHistory", "Recorded")); v != 2 {
		t.Errorf("ExitHistory stamps = %v, want 2", v)
	}
	wantWrites(t, e.m, 3) // the conflict counts
}

func TestForgetDropsPending(t *testing.T) {
	e := newEnv(t, testPod())
	e.s.Add(Request{Pod: ref, Stamp: limitOOM("main")})
	e.s.Forget(podUID)
	if e.s.Pending(podUID) != 0 {
		t.Fatal("pending after Forget")
	}
	e.clk.Step(DefaultBatchPeriod)
	time.Sleep(20 * time.Millisecond)
	if n := e.pods.PatchCount(); n != 0 {
		t.Errorf("%d patches for a forgotten pod", n)
	}
}

func TestNonWritingStampsIgnored(t *testing.T) {
	e := newEnv(t, testPod())
	e.s.Add(Request{Pod: ref, Stamp: classify.Stamp{Kind: classify.KindUnknownOOM, Reason: "Unknown"}})
	if e.s.Pending(podUID) != 0 {
		t.Error("a stamp that writes nothing is pending")
	}
}

// blockingPatcher holds every patch until release is closed, saying on entered when one
// has come.
type blockingPatcher struct {
	*fakePods
	entered chan<- struct{}
	release <-chan struct{}
}

func (b blockingPatcher) PatchPod(ctx context.Context, namespace, name string, pt types.PatchType, data []byte, subresources ...string) (*corev1.Pod, error) {
	select {
	case b.entered <- struct{}{}:
	default:
	}
	<-b.release
	return b.fakePods.PatchPod(ctx, namespace, name, pt, data, subresources...)
}

// TestUnwrittenCountsWritesInFlight: a stamp whose write has not come back is unwritten
// (a stopping agent counts it dropped: it cannot know whether it landed).
func TestUnwrittenCountsWritesInFlight(t *testing.T) {
	entered, release := make(chan struct{}, 1), make(chan struct{})
	e := newEnvPatching(t, func(f *fakePods) conditions.PodPatcher { return blockingPatcher{f, entered, release} }, testPod())
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock) // before the env's cleanup, which waits for the write

	e.s.Add(Request{Pod: ref, Stamp: limitOOM("main"), EventTime: t0})
	e.step(DefaultBatchPeriod)
	select {
	case <-entered:
	case <-time.After(5 * time.Second):
		t.Fatal("no write within 5s")
	}
	if got, n := e.s.Unwritten(); len(got) != 1 || n != 1 {
		t.Errorf("during the write: Unwritten() = %v, %d stamps; want the pod, 1 stamp", got, n)
	}
	unblock()
	e.waitPatches(1)
	if got, n := e.s.Unwritten(); len(got) != 0 || n != 0 {
		t.Errorf("after the write: Unwritten() = %v, %d stamps; want none", got, n)
	}
	if !conditions.IsTrue(&e.pods.Pod(ns, podName).Status, conditions.OOMKilled) {
		t.Error("the stamp was not written")
	}
}
