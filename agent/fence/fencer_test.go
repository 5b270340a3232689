package fence

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clienttesting "k8s.io/client-go/testing"

	"github.com/coroner-dev/coroner/agent/metrics"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/cri"
)

const leaseNS = "coroner-system"

const fenceAfter = 10 * time.Second

func TestRenewsTheLease(t *testing.T) {
	e := newTestEnv(t)
	if err := e.f.renew(e.ctx); err != nil {
		t.Fatal(err)
	}
	l := e.lease()
	if *l.Spec.HolderIdentity != node || *l.Spec.LeaseDurationSeconds != 10 || !l.Spec.RenewTime.Time.Equal(t0) ||
		!l.Spec.AcquireTime.Time.Equal(t0) || l.Annotations[conditions.AnnotationFenceAfter] != "10s" {
		t.Errorf("created Lease %+v", l)
	}
	for i := 1; i <= 10; i++ {
		e.pass(e.f.RenewPeriod())
		l = e.lease()
		if want := t0.Add(time.Duration(i) * e.f.RenewPeriod()); !l.Spec.RenewTime.Time.Equal(want) {
			t.Fatalf("renewal %d: renewTime %v, want %v", i, l.Spec.RenewTime.Time, want)
		}
	}
	if !l.Spec.AcquireTime.Time.Equal(t0) {
		t.Errorf("acquireTime moved to %v", l.Spec.AcquireTime.Time)
	}
	if _, ok := l.Annotations[conditions.AnnotationFencedAt]; ok {
		t.Errorf("fenced-at written without a fence: %v", l.Annotations)
	}
	e.mu.Lock()
	requests := e.requests
	e.mu.Unlock()
	// Get + Create, then one Update per renewal.
	if requests != 12 {
		t.Errorf("%d Lease requests for 11 renewals, want 12", requests)
	}
	if e.f.Fenced() || e.fenced() != 0 || len(e.rt.stopped()) != 0 {
		t.Errorf("fenced while renewing")
	}
}

// TestFenceAndRecover is the whole story: renewals fail, the agent fences after
// fence-after and not before, stops the opted-in pods' containers only (and again when
// the kubelet restarts one), and when a renewal succeeds records fenced-at and one Event.
func TestFenceAndRecover(t *testing.T) {
	in := makePod("in").optedIn().grace(5).obj()
	out := makePod("out").obj()
	e := newTestEnv(t, in, out)
	e.rt.add(running("c-in", "in", "main"))
	e.rt.add(running("c-out", "out", "main"))
	if err := e.f.renew(e.ctx); err != nil {
		t.Fatal(err)
	}

	e.setAPIDown(true)
	// 10s after the last renewal: not over fence-after yet.
	for range 4 {
		e.pass(2500 * time.Millisecond)
	}
	if e.f.Fenced() || len(e.rt.stopped()) != 0 || e.fenced() != 0 {
		t.Fatalf("fenced at fence-after exactly (stops %v)", e.rt.stopped())
	}
	e.pass(time.Second)
	if !e.f.Fenced() || e.fenced() != 1 {
		t.Fatal("not fenced 11s after the last renewal")
	}
	if got := e.rt.stopped(); !slices.Equal(got, []string{"c-in"}) {
		t.Fatalf("stopped %v, want [c-in]", got)
	}
	if e.rt.timeouts[0] != 5*time.Second {
		t.Errorf("stop timeout %v, want the pod's grace 5s", e.rt.timeouts[0])
	}

	// The kubelet restarts the container: stopped again at the next pass.
	e.rt.add(cri.Container{ID: "c-in-1", Name: "main", PodNamespace: ns, PodName: "in", PodUID: "uid-in", Attempt: 1, Running: true})
	e.pass(FencedPeriod)
	if got := e.rt.stopped(); !slices.Equal(got, []string{"c-in", "c-in-1"}) {
		t.Fatalf("stopped %v, want [c-in c-in-1]", got)
	}
	if n := metrics.Value(e.m.FenceStoppedContainers); n != 2 {
		t.Errorf("fence_stopped_containers_total %v, want 2", n)
	}
	if len(e.rec.all()) != 0 {
		t.Errorf("an Event while fenced: %+v", e.rec.all())
	}

	// The API server is back: the next renewal ends the fence.
	e.setAPIDown(false)
	e.pass(FencedPeriod)
	if e.f.Fenced() || e.fenced() != 0 {
		t.Fatal("still fenced after a successful renewal")
	}
	l := e.lease()
	fencedAt := t0.Add(11 * time.Second).Format(time.RFC3339)
	if l.Annotations[conditions.AnnotationFencedAt] != fencedAt || !l.Spec.RenewTime.Time.Equal(t0.Add(13*time.Second)) {
		t.Errorf("Lease after the fence: annotations %v, renewTime %v; want fenced-at %s, renewed at +13s", l.Annotations, l.Spec.RenewTime, fencedAt)
	}
	evs := e.rec.all()
	if len(evs) != 1 {
		t.Fatalf("%d Events, want 1: %+v", len(evs), evs)
	}
	ev := evs[0]
	want := "Lost the API server for 13s (over --fence-after 10s): stopped 2 containers of 1 opted-in pod: batch/in"
	if ev.typ != corev1.EventTypeWarning || ev.reason != conditions.EventReasonFenced || ev.message != want ||
		ev.ref == nil || ev.ref.Kind != "Node" || ev.ref.Name != node || ev.ref.UID != "node-uid" {
		t.Errorf("Event %+v (on %+v), want Warning Fenced %q on Node %s with its UID", ev, ev.ref, want, node)
	}

	// Back to normal: nothing stopped, no more Events, fenced-at stays for the record.
	e.rt.add(cri.Container{ID: "c-in-2", Name: "main", PodNamespace: ns, PodName: "in", PodUID: "uid-in", Attempt: 2, Running: true})
	for range 8 {
		e.pass(2500 * time.Millisecond)
	}
	if got := e.rt.stopped(); len(got) != 2 || len(e.rec.all()) != 1 || e.f.Fenced() {
		t.Errorf("after the fence: stops %v, events %d, fenced %v", got, len(e.rec.all()), e.f.Fenced())
	}
	if e.lease().Annotations[conditions.AnnotationFencedAt] != fencedAt {
		t.Error("fenced-at lost by a later renewal")
	}
}

// TestFenceFromStart: an agent that never renews (its Lease is refused from the start)
// fences fence-after after it started.
func TestFenceFromStart(t *testing.T) {
	e := newTestEnv(t, makePod("in").optedIn().obj())
	e.rt.add(running("c1", "in", "main"))
	e.setAPIDown(true)
	_ = e.f.renew(e.ctx)
	e.pass(fenceAfter)
	if e.f.Fenced() {
		t.Fatal("fenced at fence-after after the start")
	}
	e.pass(time.Millisecond)
	if !e.f.Fenced() || !slices.Equal(e.rt.stopped(), []string{"c1"}) {
		t.Fatalf("fenced %v, stops %v: want fenced with c1 stopped", e.f.Fenced(), e.rt.stopped())
	}
	if e.rt.timeouts[0] != DefaultMaxStopTimeout {
		t.Errorf("stop timeout %v for a pod with the default grace, want %v", e.rt.timeouts[0], DefaultMaxStopTimeout)
	}
}

// TestStartedCutOff: an agent that starts cut off from the API server has an empty pod
// cache; it fences fence-after after its start, and stops the containers whose sandboxes
// opt in (the kubelet's copy of the pod's annotations), and only those; back, its Event
// says it never reached the API server since it started.
func TestStartedCutOff(t *testing.T) {
	e := newTestEnv(t)
	e.rt.addSandbox(sandbox("in", optIn))
	e.rt.addSandbox(sandbox("out", map[string]string{"kubernetes.io/config.source": "api"}))
	e.rt.add(running("c-in", "in", "main"))
	e.rt.add(running("c-out", "out", "main"))
	e.setAPIDown(true)
	_ = e.f.renew(e.ctx)
	e.pass(fenceAfter)
	if e.f.Fenced() || len(e.rt.stopped()) != 0 {
		t.Fatalf("fenced at fence-after after the start (stops %v)", e.rt.stopped())
	}
	e.pass(time.Millisecond)
	if !e.f.Fenced() || !slices.Equal(e.rt.stopped(), []string{"c-in"}) {
		t.Fatalf("fenced %v, stops %v: want fenced with c-in stopped", e.f.Fenced(), e.rt.stopped())
	}
	if e.rt.timeouts[0] != DefaultMaxStopTimeout {
		t.Errorf("stop timeout %v for a pod only its sandbox knows, want %v", e.rt.timeouts[0], DefaultMaxStopTimeout)
	}
	e.rt.mu.Lock()
	lists := slices.Clone(e.rt.lists)
	e.rt.mu.Unlock()
	if !slices.Equal(lists, []string{"containers", "sandboxes"}) {
		t.Errorf("listed %v, want the containers, then the sandboxes", lists)
	}

	// The kubelet restarts it: stopped again.
	e.rt.add(cri.Container{ID: "c-in-1", SandboxID: "sb-in", Name: "main", PodNamespace: ns, PodName: "in", PodUID: "uid-in", Attempt: 1, Running: true})
	e.pass(FencedPeriod)
	if got := e.rt.stopped(); !slices.Equal(got, []string{"c-in", "c-in-1"}) {
		t.Fatalf("stopped %v, want [c-in c-in-1]", got)
	}

	e.setAPIDown(false)
	e.pass(FencedPeriod)
	if e.f.Fenced() {
		t.Fatal("still fenced after a successful renewal")
	}
	evs := e.rec.all()
	want := "Could not reach the API server for 12s since the agent started (over --fence-after 10s): stopped 2 containers of 1 opted-in pod: batch/in"
	if len(evs) != 1 || evs[0].message != want {
		t.Errorf("Events %+v, want one: %q", evs, want)
	}
	if l := e.lease(); l.Annotations[conditions.AnnotationFencedAt] != t0.Add(fenceAfter+time.Millisecond).Format(time.RFC3339) {
		t.Errorf("fenced-at %q", l.Annotations[conditions.AnnotationFencedAt])
	}

	// A later fence, after renewals: "Lost", from the last renewal.
	e.setAPIDown(true)
	e.pass(fenceAfter + time.Second)
	e.setAPIDown(false)
	e.pass(FencedPeriod)
	if evs := e.rec.all(); len(evs) != 2 || !strings.HasPrefix(evs[1].message, "Lost the API server for 12s (over --fence-after 10s)") {
		t.Errorf("Events %+v, want a second one from the last renewal", evs)
	}
}

// TestSandboxesAndCache: the cache's opted-in pods and the sandboxes' together; the
// cache decides the pods it knows; a failed sandbox listing leaves the cache's.
func TestSandboxesAndCache(t *testing.T) {
	e := newTestEnv(t, makePod("cached").optedIn().grace(2).obj(), makePod("withdrawn").obj())
	e.rt.addSandbox(sandbox("cached", nil))
	e.rt.addSandbox(sandbox("withdrawn", optIn))
	e.rt.addSandbox(sandbox("new", optIn))
	e.rt.add(running("c-cached", "cached", "main"))
	e.rt.add(running("c-withdrawn", "withdrawn", "main"))
	e.rt.add(running("c-new", "new", "main"))
	e.rt.sandboxErr = errors.New("rpc error: code = Unavailable")
	e.setAPIDown(true)
	e.pass(fenceAfter + time.Second)
	if !e.f.Fenced() || !slices.Equal(e.rt.stopped(), []string{"c-cached"}) {
		t.Fatalf("fenced %v, stops %v: want the cache's c-cached alone while the sandboxes cannot be listed", e.f.Fenced(), e.rt.stopped())
	}
	e.rt.mu.Lock()
	e.rt.sandboxErr = nil
	e.rt.mu.Unlock()
	e.pass(FencedPeriod)
	if got := e.rt.stopped(); !slices.Equal(got, []string{"c-cached", "c-new"}) {
		t.Fatalf("stops %v, want c-cached, then c-new (its sandbox opts in); never c-withdrawn (the cache says it is not opted in)", got)
	}
}

// TestRuntimeWithoutSandboxes: a Runtime that does not list sandboxes: the cache alone.
func TestRuntimeWithoutSandboxes(t *testing.T) {
	var rt *fakeRuntime
	e := newTestEnvWith(t, func(c *Config) {
		rt = c.Runtime.(*fakeRuntime)
		c.Runtime = struct{ Runtime }{rt} // hides Sandboxes
	}, makePod("cached").optedIn().obj())
	rt.addSandbox(sandbox("sandbox-only", optIn))
	rt.add(running("c-cached", "cached", "main"))
	rt.add(running("c-sandbox", "sandbox-only", "main"))
	e.setAPIDown(true)
	e.pass(fenceAfter + time.Second)
	if got := rt.stopped(); !slices.Equal(got, []string{"c-cached"}) {
		t.Fatalf("stops %v, want [c-cached]", got)
	}
}

// TestStart: Config.Start, when the agent started, is the first "renewal": the fence
// comes fence-after after it, not after New or Run; a Start in the future counts as now.
func TestStart(t *testing.T) {
	e := newTestEnvWith(t, func(c *Config) { c.Start = t0.Add(-4 * time.Second) }, makePod("in").optedIn().obj())
	e.rt.add(running("c1", "in", "main"))
	e.setAPIDown(true)
	e.pass(fenceAfter - 4*time.Second)
	if e.f.Fenced() {
		t.Fatal("fenced at fence-after after the start")
	}
	e.pass(time.Millisecond)
	if !e.f.Fenced() || len(e.rt.stopped()) != 1 {
		t.Fatalf("fenced %v, stops %v: want fenced fence-after after Start", e.f.Fenced(), e.rt.stopped())
	}

	e = newTestEnvWith(t, func(c *Config) { c.Start = t0.Add(time.Hour) })
	e.setAPIDown(true)
	e.pass(fenceAfter + time.Millisecond)
	if !e.f.Fenced() {
		t.Fatal("a Start in the future delayed the fence")
	}
}

// TestFencedWhateverTheError: the shim sees a stale Lease whatever the reason, so an
// agent whose renewals are refused (not a partition) fences too.
func TestFencedWhateverTheError(t *testing.T) {
	e := newTestEnv(t, makePod("in").optedIn().obj())
	e.rt.add(running("c1", "in", "main"))
	_ = e.f.renew(e.ctx)
	e.client.PrependReactor("update", "leases", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}, "x", errors.New("denied"))
	})
	for range 5 {
		e.pass(2500 * time.Millisecond)
	}
	if !e.f.Fenced() || len(e.rt.stopped()) != 1 {
		t.Errorf("fenced %v, stops %v: want fenced", e.f.Fenced(), e.rt.stopped())
	}
}

// TestStopErrorsRetried: a stop that fails is tried again at the next pass, and a
// listing error stops nothing but keeps the fence.
func TestStopErrorsRetried(t *testing.T) {
	e := newTestEnv(t, makePod("in").optedIn().obj())
	e.rt.add(running("c1", "in", "main"))
	e.rt.stopErr = map[string]error{"c1": errors.New("rpc error: code = DeadlineExceeded")}
	e.setAPIDown(true)
	e.pass(fenceAfter + time.Second)
	if !e.f.Fenced() || len(e.rt.stopped()) != 0 || metrics.Value(e.m.FenceStoppedContainers) != 0 {
		t.Fatalf("fenced %v, stops %v", e.f.Fenced(), e.rt.stopped())
	}
	e.rt.mu.Lock()
	e.rt.stopErr = nil
	e.rt.listErr = errors.New("connection refused")
	e.rt.mu.Unlock()
	e.pass(FencedPeriod)
	if len(e.rt.stopped()) != 0 || !e.f.Fenced() {
		t.Fatalf("stops %v without a listing; fenced %v", e.rt.stopped(), e.f.Fenced())
	}
	e.rt.mu.Lock()
	e.rt.listErr = nil
	e.rt.mu.Unlock()
	e.pass(FencedPeriod)
	if !slices.Equal(e.rt.stopped(), []string{"c1"}) {
		t.Fatalf("stops %v, want [c1] once the runtime answers", e.rt.stopped())
	}
}

// TestConflictRereads: someone else updated the Lease; the agent reads it again and
// renews in the same attempt.
func TestConflictRereads(t *testing.T) {
	e := newTestEnv(t)
	if err := e.f.renew(e.ctx); err != nil {
		t.Fatal(err)
	}
	l := e.lease()
	l.Annotations["someone"] = "else"
	if _, err := e.client.CoordinationV1().Leases(leaseNS).Update(e.ctx, l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The fake tracker does not check resourceVersions: a conflict is injected once.
	conflicts := 1
	e.client.PrependReactor("update", "leases", func(clienttesting.Action) (bool, runtime.Object, error) {
		if conflicts > 0 {
			conflicts--
			return true, nil, apierrors.NewConflict(schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}, l.Name, errors.New("modified"))
		}
		return false, nil, nil
	})
	e.clk.Step(time.Second)
	if err := e.f.renew(e.ctx); err != nil {
		t.Fatalf("renewal after a conflict: %v", err)
	}
	if got := e.lease(); !got.Spec.RenewTime.Time.Equal(t0.Add(time.Second)) || got.Annotations["someone"] != "else" {
		t.Errorf("Lease after the conflict: renewTime %v, annotations %v", got.Spec.RenewTime, got.Annotations)
	}
}

// TestEventWithoutNode: the Node cannot be read; the Event goes without its UID.
func TestEventWithoutNode(t *testing.T) {
	e := newTestEnv(t)
	if err := e.client.Tracker().Delete(schema.GroupVersionResource{Version: "v1", Resource: "nodes"}, "", node); err != nil {
		t.Fatal(err)
	}
	e.setAPIDown(true)
	e.pass(fenceAfter + time.Second)
	e.setAPIDown(false)
	e.pass(FencedPeriod)
	evs := e.rec.all()
	if len(evs) != 1 || evs[0].ref.Name != node || evs[0].ref.UID != "" ||
		evs[0].message != "Could not reach the API server for 12s since the agent started (over --fence-after 10s): no container of an opted-in pod was running" {
		t.Errorf("Events %+v", evs)
	}
}

// TestRun drives Run on the fake clock: the Lease is renewed on its period, the fence
// starts when renewals fail, and ends when they succeed.
func TestRun(t *testing.T) {
	e := newTestEnv(t, makePod("in").optedIn().obj())
	e.rt.add(running("c1", "in", "main"))
	ctx := e.run()
	renewedAt := func(at time.Time) func() bool {
		return func() bool {
			l, err := e.client.CoordinationV1().Leases(leaseNS).Get(ctx, conditions.AgentLeaseName(node), metav1.GetOptions{})
			return err == nil && l.Spec.RenewTime.Time.Equal(at)
		}
	}
	step := func(d time.Duration) { e.step(d, 250*time.Millisecond, nil) }
	until(t, "the first renewal", renewedAt(t0))
	step(2500 * time.Millisecond)
	until(t, "the second renewal", renewedAt(t0.Add(2500*time.Millisecond)))

	e.setAPIDown(true)
	step(fenceAfter + 2*time.Second)
	until(t, "the fence", func() bool { return e.f.Fenced() && len(e.rt.stopped()) == 1 })

	e.setAPIDown(false)
	step(2 * time.Second)
	until(t, "the end of the fence", func() bool { return !e.f.Fenced() && len(e.rec.all()) == 1 })
	if e.fenced() != 0 {
		t.Error("the gauge is still 1")
	}
}
