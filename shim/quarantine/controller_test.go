package quarantine

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/informers"
	"github.com/coroner-dev/coroner/shim/metrics"
)

// fixture is a Controller on informers whose stores the test fills (nothing runs), a
// fake client, a fake clock and a fake recorder.
type fixture struct {
	c        *Controller
	cs       *fake.Clientset
	inf      *informers.Informers
	clock    *clocktesting.FakeClock
	recorder *record.FakeRecorder
	m        *metrics.Metrics
	job      *batchv1.Job
}

func newFixture(t *testing.T, enabled bool, nodes ...string) *fixture {
	t.Helper()
	f := &fixture{cs: fake.NewClientset(), clock: clocktesting.NewFakeClock(t0), recorder: record.NewFakeRecorder(100), m: metrics.New(prometheus.NewRegistry())}
	f.inf = informers.New(f.cs, informers.Config{})
	f.job = &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "j", UID: "job-uid"}, Spec: batchv1.JobSpec{ManagedBy: ptr.To(conditions.ManagedBy)}}
	if err := f.inf.Jobs.GetStore().Add(f.job); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, ResourceVersion: "1"}}
		if err := f.inf.Nodes.GetStore().Add(node); err != nil {
			t.Fatal(err)
		}
		if _, err := f.cs.CoreV1().Nodes().Create(context.Background(), node, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	f.c = New(context.Background(), f.cs, f.inf, Config{Enabled: enabled, Clock: f.clock, Metrics: f.m, Recorder: f.recorder,
		Options: Options{Deaths: 3, Window: 30 * time.Minute, For: time.Hour, Max: Max{N: 1}}})
	f.c.started = t0
	return f
}

// nodeOOM is a pod of the fixture's Job (or of job when not nil) failed on node by a node
// OOM.
func (f *fixture) nodeOOM(name, node string, job *batchv1.Job) *corev1.Pod {
	if job == nil {
		job = f.job
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID(name + "-uid"),
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: job.Name, UID: job.UID, Controller: ptr.To(true)}}},
		Spec: corev1.PodSpec{NodeName: node},
		Status: corev1.PodStatus{Phase: corev1.PodFailed, Conditions: []corev1.PodCondition{{Type: conditions.DisruptionTarget, Status: corev1.ConditionTrue,
			Reason: conditions.ReasonNodeOOMKill, LastTransitionTime: metav1.NewTime(f.clock.Now())}}},
	}
}

func (f *fixture) nodePatches() []string {
	var out []string
	for _, a := range f.cs.Actions() {
		if p, ok := a.(k8stesting.PatchAction); ok && a.GetResource().Resource == "nodes" {
			out = append(out, p.GetName()+" "+string(p.GetPatch()))
		}
	}
	return out
}

func (f *fixture) events() []string {
	var out []string
	for {
		select {
		case e := <-f.recorder.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// TestCountsOncePerPod: without --quarantine the deaths are counted, once per pod UID
// (its updates and its deletion seen again), only for pods of Jobs this shim manages, and
// nothing is written.
func TestCountsOncePerPod(t *testing.T) {
	f := newFixture(t, false, "a")
	p := f.nodeOOM("p", "a", nil)
	f.c.observe(p)
	f.c.observe(p)
	f.c.observe(cache.DeletedFinalStateUnknown{Key: "ns/p", Obj: p})
	other := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "other", UID: "other-uid"}, Spec: batchv1.JobSpec{ManagedBy: ptr.To("example.com/other")}}
	if err := f.inf.Jobs.GetStore().Add(other); err != nil {
		t.Fatal(err)
	}
	f.c.observe(f.nodeOOM("q", "a", other))
	exit := f.nodeOOM("r", "a", nil)
	exit.Status.Conditions = nil
	f.c.observe(exit)
	if got := testutil.ToFloat64(f.m.NodeBlamedDeaths.WithLabelValues("a", "node-oom")); got != 1 {
		t.Errorf("coroner_node_blamed_deaths_total{node=a,cause=node-oom} = %v, want 1", got)
	}
	if len(f.c.history) != 0 || f.c.queue.Len() != 0 {
		t.Errorf("without --quarantine: history %v, %d queued; want none", f.c.history, f.c.queue.Len())
	}
}

// TestSync: three deaths quarantine node a (one guarded patch, then the Event and the
// metric); a hand lift forgets them, so the next pass does not taint a again; the quiet
// period lifts a quarantine.
func TestSync(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, true, "a", "b")
	for _, name := range []string{"p1", "p2", "p3"} {
		f.c.observe(f.nodeOOM(name, "a", nil))
		f.clock.Step(time.Minute)
	}
	if err := f.c.sync(ctx, syncKey); err != nil {
		t.Fatal(err)
	}
	patches := f.nodePatches()
	if len(patches) != 1 || !strings.HasPrefix(patches[0], `a [{"op":"test","path":"/metadata/resourceVersion","value":"1"},{"op":"add","path":"/spec/taints","value":[{"key":"coroner.dev/quarantined","value":"node-oom","effect":"NoSchedule"`) {
		t.Fatalf("patches %q", patches)
	}
	if ev := f.events(); len(ev) != 1 || !strings.HasPrefix(ev[0], "Warning NodeQuarantined 3 pod deaths blamed on this node within 30m0s: ns/p1 (node-oom, 2026-12-07T12:00:00Z)") {
		t.Errorf("events %q", ev)
	}
	if got := testutil.ToFloat64(f.m.NodeQuarantines.WithLabelValues("node-oom")); got != 1 {
		t.Errorf("coroner_node_quarantines_total = %v", got)
	}

	// The informer sees the taint; an operator removes it by hand.
	stored, err := f.cs.CoreV1().Nodes().Get(ctx, "a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_ = f.inf.Nodes.GetStore().Update(stored)
	lifted := stored.DeepCopy()
	lifted.Spec.Taints = nil
	f.c.updateNode(stored, lifted)
	_ = f.inf.Nodes.GetStore().Update(lifted)
	f.cs.ClearActions()
	if err := f.c.sync(ctx, syncKey); err != nil {
		t.Fatal(err)
	}
	if p := f.nodePatches(); len(p) != 0 {
		t.Errorf("after a hand lift, patches %q; want none (the old deaths are forgotten)", p)
	}

	// Quarantined again by new deaths, then lifted after an hour without one.
	for _, name := range []string{"p4", "p5", "p6"} {
		f.c.observe(f.nodeOOM(name, "a", nil))
	}
	if err := f.c.sync(ctx, syncKey); err != nil {
		t.Fatal(err)
	}
	stored, _ = f.cs.CoreV1().Nodes().Get(ctx, "a", metav1.GetOptions{})
	_ = f.inf.Nodes.GetStore().Update(stored)
	f.events()
	f.clock.Step(time.Hour)
	f.cs.ClearActions()
	if err := f.c.sync(ctx, syncKey); err != nil {
		t.Fatal(err)
	}
	if p := f.nodePatches(); len(p) != 1 || !strings.Contains(p[0], `"value":[]`) {
		t.Errorf("after an hour without a death, patches %q; want the taint removed", p)
	}
	if ev := f.events(); len(ev) != 1 || !strings.HasPrefix(ev[0], "Normal NodeQuarantineLifted Removed the taint coroner.dev/quarantined: no pod death blamed on this node for 1h0m0s") {
		t.Errorf("events %q", ev)
	}
}
