package fence

import (
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	clienttesting "k8s.io/client-go/testing"

	"github.com/coroner-dev/coroner/conditions"
)

var agentPodName = types.NamespacedName{Namespace: leaseNS, Name: "coroner-agent-x7k2p"}

// newNodeLeaseEnv is a test environment whose fencer fences on the kubelet's node Lease,
// which exists, renewed at renewed.
func newNodeLeaseEnv(t *testing.T, renewed time.Time, pods ...*corev1.Pod) *testEnv {
	t.Helper()
	e := newTestEnvWith(t, func(c *Config) { c.NodeLease, c.Pod = true, agentPodName }, pods...)
	d := int32(40)
	rt := metav1.NewMicroTime(renewed)
	holder := node
	if _, err := e.client.CoordinationV1().Leases(conditions.NodeLeaseNamespace).Create(e.ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: conditions.NodeLeaseNamespace, Name: node},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &d, RenewTime: &rt},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return e
}

// kubeletRenews is the kubelet renewing its node Lease at the fake clock's now, written
// straight into the fake API server's tracker (which tells the watches), so that the
// agent's own requests can be counted apart.
func (e *testEnv) kubeletRenews() *coordinationv1.Lease {
	e.t.Helper()
	gvr := schema.GroupVersionResource{Group: "coordination.k8s.io", Version: "v1", Resource: "leases"}
	obj, err := e.client.Tracker().Get(gvr, conditions.NodeLeaseNamespace, node)
	if err != nil {
		e.t.Fatal(err)
	}
	l := obj.(*coordinationv1.Lease).DeepCopy()
	rt := metav1.NewMicroTime(e.clk.Now())
	l.Spec.RenewTime = &rt
	if err := e.client.Tracker().Update(gvr, l, conditions.NodeLeaseNamespace); err != nil {
		e.t.Fatal(err)
	}
	return l
}

// agentLeaseWrites counts the creates and updates of the agent's own Lease.
func countAgentLeaseWrites(e *testEnv) func() int {
	var mu sync.Mutex
	n := 0
	e.client.PrependReactor("*", "leases", func(a clienttesting.Action) (bool, runtime.Object, error) {
		if a.GetNamespace() == leaseNS && (a.GetVerb() == "create" || a.GetVerb() == "update") {
			mu.Lock()
			n++
			mu.Unlock()
		}
		return false, nil, nil
	})
	return func() int {
		mu.Lock()
		defer mu.Unlock()
		return n
	}
}

func TestNodeLeaseNeedsThePod(t *testing.T) {
	_, err := New(Config{NodeName: node, Namespace: leaseNS, FenceAfter: fenceAfter, Client: newTestEnv(t).client,
		Runtime: &fakeRuntime{}, Pods: func() []*corev1.Pod { return nil }, Recorder: &recorder{}, NodeLease: true})
	if err == nil || !strings.Contains(err.Error(), "--pod-name") {
		t.Errorf("New without the Pod: %v, want an error naming --pod-name", err)
	}
}

// TestNodeLeaseFenceAndRecover is the story on the kubelet's heartbeat: the agent writes
// its own Lease once (how it fences, its pod), fences fence-after after the last renewal
// of the node Lease it saw and not before, writes nothing while fenced, and when it sees a
// renewal again ends the fence, records fenced-at and emits one Event. The shim, reading
// the same Leases, takes the node for fenced only after the agent has fenced.
func TestNodeLeaseFenceAndRecover(t *testing.T) {
	in := makePod("in").optedIn().grace(5).obj()
	out := makePod("out").obj()
	e := newNodeLeaseEnv(t, t0, in, out)
	writes := countAgentLeaseWrites(e)
	e.rt.add(running("c-in", "in", "main"))
	e.rt.add(running("c-out", "out", "main"))
	if err := e.f.record(e.ctx); err != nil {
		t.Fatal(err)
	}
	l := e.lease()
	if l.Annotations[conditions.AnnotationFenceOnNodeLease] != "10s" || l.Annotations[conditions.AnnotationAgentPod] != agentPodName.String() {
		t.Errorf("the agent's Lease annotations %v: want %s=10s and %s=%s", l.Annotations,
			conditions.AnnotationFenceOnNodeLease, conditions.AnnotationAgentPod, agentPodName)
	}
	if _, ok := l.Annotations[conditions.AnnotationFenceAfter]; ok {
		t.Errorf("the agent's Lease has %s, which an older shim would take for renewals: %v", conditions.AnnotationFenceAfter, l.Annotations)
	}

	// The kubelet renews every 2.5 s for a minute: no fence, no write.
	for range 24 {
		e.clk.Step(2500 * time.Millisecond)
		e.f.heardFrom(e.ctx, e.kubeletRenews())
		e.f.enforce(e.ctx)
	}
	last := e.clk.Now()
	// Then it falls silent: not fenced at fence-after exactly, fenced a second later.
	for range 4 {
		e.clk.Step(2500 * time.Millisecond)
		e.f.enforce(e.ctx)
	}
	if e.f.Fenced() || len(e.rt.stopped()) != 0 {
		t.Fatalf("fenced at fence-after exactly (stops %v)", e.rt.stopped())
	}
	e.clk.Step(time.Second)
	e.f.enforce(e.ctx)
	if !e.f.Fenced() || e.fenced() != 1 {
		t.Fatal("not fenced 11s after the kubelet's last renewal")
	}
	if got := e.rt.stopped(); !slices.Equal(got, []string{"c-in"}) {
		t.Fatalf("stopped %v, want [c-in]", got)
	}
	fencedAt := e.clk.Now()

	// The shim's view of the same moment: the agent's pod ready, the node Lease as the
	// kubelet left it. Not fenced before renewTime + fence-after + margin, when the agent
	// has been fenced for the margin.
	nodeLease, err := e.client.CoordinationV1().Leases(conditions.NodeLeaseNamespace).Get(e.ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ready := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: agentPodName.Namespace, Name: agentPodName.Name},
		Spec: corev1.PodSpec{NodeName: node}, Status: corev1.PodStatus{Phase: corev1.PodRunning,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}}
	ev := conditions.FenceEvidence{Node: node, Agent: e.lease(), NodeLease: nodeLease, AgentPod: ready}
	const margin = 5 * time.Second
	deadline, ok := conditions.FenceDeadline(ev, margin)
	if !ok || !deadline.Equal(last.Add(fenceAfter+margin)) || !deadline.After(fencedAt) {
		t.Errorf("the shim's deadline %v (%v), want the kubelet's last renewal + fence-after + margin %v, after the agent fenced at %v",
			deadline, ok, last.Add(fenceAfter+margin), fencedAt)
	}
	if st := conditions.NodeFenced(ev, last.Add(fenceAfter+margin), margin); !st.Fenced || !st.Since.Equal(last.Add(fenceAfter)) {
		t.Errorf("NodeFenced at the deadline: %+v", st)
	}

	// While fenced: the kubelet restarts the container, stopped again; nothing written.
	e.rt.add(running("c-in-1", "in", "main"))
	e.clk.Step(FencedPeriod)
	e.f.enforce(e.ctx)
	if got := e.rt.stopped(); !slices.Equal(got, []string{"c-in", "c-in-1"}) {
		t.Fatalf("stopped %v, want [c-in c-in-1]", got)
	}
	if n := writes(); n != 1 {
		t.Errorf("%d writes of the agent's Lease, want 1 (the start)", n)
	}

	// The kubelet renews again: the fence ends, then the record and the Event.
	e.clk.Step(2 * time.Second)
	e.f.heardFrom(e.ctx, e.kubeletRenews())
	back := e.clk.Now()
	e.f.enforce(e.ctx)
	if e.f.Fenced() || e.fenced() != 0 {
		t.Fatal("still fenced after the node Lease was renewed again")
	}
	if len(e.rec.all()) != 0 {
		t.Fatal("the Event before the record")
	}
	if err := e.f.record(e.ctx); err != nil {
		t.Fatal(err)
	}
	if got := e.lease().Annotations[conditions.AnnotationFencedAt]; got != fencedAt.Format(time.RFC3339) {
		t.Errorf("fenced-at %q, want %s", got, fencedAt.Format(time.RFC3339))
	}
	evs := e.rec.all()
	want := "The kubelet's node Lease went unrenewed for " + back.Sub(last).String() + " (over --fence-after 10s): stopped 2 containers of 1 opted-in pod: batch/in"
	if len(evs) != 1 || evs[0].reason != conditions.EventReasonFenced || evs[0].message != want || evs[0].ref.Name != node {
		t.Errorf("Events %+v, want one Fenced on the Node: %q", evs, want)
	}
	if n := writes(); n != 2 {
		t.Errorf("%d writes of the agent's Lease, want 2 (the start, the record)", n)
	}
}

// TestNodeLeaseOldRenewalAtStart: the first renewal the agent sees replaces its start as
// the last renewal, even an older one: a kubelet silent for longer than fence-after when
// the agent starts gets its node fenced at once, as the shim expects.
func TestNodeLeaseOldRenewalAtStart(t *testing.T) {
	e := newNodeLeaseEnv(t, t0.Add(-time.Minute), makePod("in").optedIn().obj())
	e.rt.add(running("c-in", "in", "main"))
	e.f.enforce(e.ctx)
	if e.f.Fenced() {
		t.Fatal("fenced before hearing from the node Lease: the start counts as a renewal")
	}
	e.f.readNodeLease(e.ctx)
	e.f.enforce(e.ctx)
	if !e.f.Fenced() || !slices.Equal(e.rt.stopped(), []string{"c-in"}) {
		t.Errorf("fenced %v, stopped %v: want fenced at once on a renewal a minute old", e.f.Fenced(), e.rt.stopped())
	}
	// A renewal from the future (another clock) counts as now, not later.
	e2 := newNodeLeaseEnv(t, t0.Add(time.Hour))
	e2.f.readNodeLease(e2.ctx)
	e2.clk.Step(fenceAfter + time.Second)
	e2.f.enforce(e2.ctx)
	if !e2.f.Fenced() {
		t.Error("a renewTime in the future kept the fence off past now + fence-after")
	}
}

// TestNodeLeaseUnreadable: an API server that cannot be reached is no renewal, and a
// missing node Lease is none either.
func TestNodeLeaseUnreadable(t *testing.T) {
	e := newNodeLeaseEnv(t, t0)
	e.setAPIDown(true)
	e.clk.Step(5 * time.Second)
	e.f.readNodeLease(e.ctx)
	e.f.mu.Lock()
	heard := e.f.heard
	e.f.mu.Unlock()
	if heard {
		t.Error("heard from the node Lease through an API server that is down")
	}
	e.setAPIDown(false)
	if err := e.client.CoordinationV1().Leases(conditions.NodeLeaseNamespace).Delete(e.ctx, node, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.f.readNodeLease(e.ctx)
	e.clk.Step(fenceAfter + time.Second)
	e.f.enforce(e.ctx)
	if !e.f.Fenced() {
		t.Error("not fenced fence-after after the start without a node Lease")
	}
}

// TestNodeLeaseRunWritesOnlyAtStart drives Run on the fake clock with the watch on the
// fake API server: the kubelet renews every 10 s for 5 minutes; the agent writes its own
// Lease once and never reads the node Lease itself (its watch hears every renewal); then
// the kubelet falls silent and the agent fences, reading the Lease every RenewPeriod once
// the watch has been quiet for QuietAfter.
func TestNodeLeaseRunWritesOnlyAtStart(t *testing.T) {
	e := newNodeLeaseEnv(t, t0, makePod("in").optedIn().obj())
	e.rt.add(running("c1", "in", "main"))
	writes := countAgentLeaseWrites(e)
	var mu sync.Mutex
	gets := 0
	e.client.PrependReactor("get", "leases", func(a clienttesting.Action) (bool, runtime.Object, error) {
		if a.GetNamespace() == conditions.NodeLeaseNamespace {
			mu.Lock()
			gets++
			mu.Unlock()
		}
		return false, nil, nil
	})
	ctx := e.run()
	heardAt := func(at time.Time) func() bool {
		return func() bool {
			e.f.mu.Lock()
			defer e.f.mu.Unlock()
			return e.f.heard && e.f.lastRenewal.Equal(at)
		}
	}
	step := func(d time.Duration) { e.step(d, 500*time.Millisecond, nil) }
	until(t, "the start's write", func() bool { return writes() == 1 })
	until(t, "the watch", heardAt(t0))
	for range 30 {
		step(10 * time.Second)
		e.kubeletRenews()
		until(t, "the renewal seen", heardAt(e.clk.Now()))
	}
	mu.Lock()
	atRest := gets
	mu.Unlock()
	if n := writes(); n != 1 || atRest != 0 {
		t.Errorf("at rest for 5 minutes: %d writes of the agent's Lease (want 1), %d reads of the node Lease (want 0)", n, atRest)
	}
	if e.f.Fenced() {
		t.Fatal("fenced at rest")
	}
	last := e.clk.Now()
	step(fenceAfter + 2*time.Second)
	until(t, "the fence", func() bool { return e.f.Fenced() && len(e.rt.stopped()) == 1 })
	if fenced := e.clk.Now(); fenced.Sub(last) > fenceAfter+2*time.Second {
		t.Errorf("fenced %v after the last renewal", fenced.Sub(last))
	}
	step(QuietAfter)
	mu.Lock()
	quiet := gets
	mu.Unlock()
	if quiet == 0 {
		t.Error("the node Lease not read after the watch had been quiet for QuietAfter")
	}
	e.kubeletRenews()
	step(2 * FencedPeriod)
	until(t, "the end of the fence", func() bool { return !e.f.Fenced() })
	step(e.f.RenewPeriod() + FencedPeriod)
	until(t, "the end of the fence and its record", func() bool { return !e.f.Fenced() && len(e.rec.all()) == 1 && writes() == 2 })
	if _, err := e.client.CoordinationV1().Leases(leaseNS).Get(ctx, conditions.AgentLeaseName(node), metav1.GetOptions{}); apierrors.IsNotFound(err) {
		t.Error("the agent's Lease is gone")
	}
}

// TestNodeLeaseRecordBacksOff: writes of the agent's own Lease that fail are retried
// after 1 s, doubling (with jitter) up to MaxRecordRetry, not every second: the agents of
// a whole cluster start together, and an API server they saturate must get room. The node
// Lease is still watched meanwhile, and the write succeeds once the API server takes it.
func TestNodeLeaseRecordBacksOff(t *testing.T) {
	e := newNodeLeaseEnv(t, t0)
	var mu sync.Mutex
	refuse, attempts := true, 0
	e.client.PrependReactor("*", "leases", func(a clienttesting.Action) (bool, runtime.Object, error) {
		if a.GetNamespace() != leaseNS {
			return false, nil, nil
		}
		mu.Lock()
		defer mu.Unlock()
		if a.GetVerb() == "get" {
			attempts++
		}
		if refuse {
			return true, nil, apierrors.NewTooManyRequests("the API server is saturated", 1)
		}
		return false, nil, nil
	})
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return attempts
	}
	e.run()
	until(t, "the first attempt", func() bool { return count() == 1 })
	renews := func() { e.kubeletRenews() }
	e.step(time.Minute, 500*time.Millisecond, renews) // each half second once the loops wait
	// 1 s, 2 s, 4 s, 8 s, 16 s, 32 s (each x0.5-1.5): 5 to 8 attempts in a minute, where
	// retrying every second would make 60.
	if n := count(); n < 4 || n > 9 {
		t.Errorf("%d attempts to write the agent's Lease in a minute of refusals, want 4 to 9", n)
	}
	if e.f.Fenced() {
		t.Error("fenced while the kubelet renews")
	}
	mu.Lock()
	refuse = false
	mu.Unlock()
	written := func() bool {
		_, err := e.client.Tracker().Get(schema.GroupVersionResource{Group: "coordination.k8s.io", Version: "v1", Resource: "leases"}, leaseNS, conditions.AgentLeaseName(node))
		return err == nil
	}
	if written() {
		t.Fatal("the agent's Lease written while every write was refused")
	}
	// The next attempt comes within MaxRecordRetry x 1.5 (90 s) once the back-off reached
	// its cap, which a minute of refusals can do when the jitter draws short waits.
	for range int((MaxRecordRetry*3/2 + 5*time.Second) / (500 * time.Millisecond)) {
		if written() {
			break
		}
		e.step(500*time.Millisecond, 500*time.Millisecond, renews)
	}
	if e.lease().Annotations[conditions.AnnotationFenceOnNodeLease] != "10s" {
		t.Errorf("the agent's Lease never written once the API server took it: %v", e.lease().Annotations)
	}
}
