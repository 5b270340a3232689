package recoverer

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
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
	"github.com/coroner-dev/coroner/shim/queue"
	"github.com/coroner-dev/coroner/shim/recovery"
)

const testNS = "ns"

var threshold = 10 * time.Second

// fakeQueue records what is added instead of queueing.
type fakeQueue struct {
	queue.Queue
	mu    sync.Mutex
	added []string // key, or key@duration for AddAfter
}

func (q *fakeQueue) Add(key string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.added = append(q.added, key)
}

func (q *fakeQueue) AddAfter(key string, d time.Duration) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.added = append(q.added, key+"@"+d.String())
}

// take returns what was added since the last call, sorted.
func (q *fakeQueue) take() []string {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := q.added
	q.added = nil
	slices.Sort(out)
	return out
}

type fixture struct {
	r        *Recoverer
	client   *fake.Clientset
	inf      *informers.Informers
	queue    *fakeQueue
	recorder *record.FakeRecorder
	clock    *clocktesting.FakeClock
	metrics  *metrics.Metrics
}

// newFixture builds a Recoverer whose informers are not started: the test puts objects
// in their stores itself. objs go into the fake clientset only.
func newFixture(t *testing.T, scope RecoverScope, objs ...runtime.Object) *fixture {
	t.Helper()
	f := &fixture{
		client:   fake.NewClientset(objs...),
		queue:    &fakeQueue{},
		recorder: record.NewFakeRecorder(100),
		clock:    clocktesting.NewFakeClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)),
		metrics:  metrics.New(prometheus.NewRegistry()),
	}
	f.inf = informers.New(f.client, informers.Config{OtherPodsNamespace: testNS})
	f.r = New(context.Background(), f.client, f.inf, Config{
		Recovery:    recovery.Config{Threshold: threshold},
		RecoverPods: scope,
		Clock:       f.clock,
		Metrics:     f.metrics,
		Recorder:    f.recorder,
	})
	f.r.queue = f.queue
	return f
}

// inCache puts objects in the informer stores, with what the informers' handlers would do
// beyond enqueueing: a node tainted unreachable gets (with RecoverAll) an informer of its
// pods, recorded and not started (Run is not called); a managed Job's pod (labelled) goes
// to Pods, any other pod to the informer of its node's pods, stripped, through that
// informer's handler (which enqueues it when opted in), or nowhere when its node has no
// such informer, as it would not be watched.
func (f *fixture) inCache(t *testing.T, objs ...runtime.Object) {
	t.Helper()
	for _, o := range objs {
		var err error
		switch o := o.(type) {
		case *batchv1.Job:
			err = f.inf.Jobs.GetIndexer().Add(o)
		case *corev1.Node:
			err = f.inf.Nodes.GetIndexer().Add(o)
			f.r.watchNodePods(o.Name, o)
		case *coordinationv1.Lease:
			err = f.inf.Leases.GetIndexer().Add(o)
		case *corev1.Pod:
			if managedPod(o) {
				err = f.inf.Pods.GetIndexer().Add(o)
			} else if nw := f.nodeWatch(o.Spec.NodeName); nw != nil {
				stub, _ := informers.StripForRecovery(o.DeepCopy())
				if err = nw.inf.GetStore().Add(stub); err == nil {
					f.r.nodePodChanged(nw, stub)
				}
			}
		default:
			t.Fatalf("inCache: unexpected %T", o)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// nodeWatch returns the informer of the node's pods; nil when there is none.
func (f *fixture) nodeWatch(node string) *nodeWatch {
	f.r.nodes.mu.Lock()
	defer f.r.nodes.mu.Unlock()
	return f.r.nodes.byNode[node]
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

func managedJob(name, managedBy string) *batchv1.Job {
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS, UID: types.UID(name + "-uid")},
		Spec:       batchv1.JobSpec{ManagedBy: ptr.To(managedBy)},
	}
}

// podOn is a Running pod bound to node, of job (nil: a bare pod), opted in or not. The
// pod of a Job managed by conditions.ManagedBy carries conditions.ManagedPodLabel.
func podOn(name, node string, job *batchv1.Job, optedIn bool) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS, UID: types.UID(name + "-uid"), ResourceVersion: "1",
			Labels: map[string]string{}},
		Spec:   corev1.PodSpec{NodeName: node},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
	if job != nil {
		p.Labels[batchv1.ControllerUidLabel] = string(job.UID)
		p.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(job, batchv1.SchemeGroupVersion.WithKind("Job"))}
		if informers.IsManagedBy(job, conditions.ManagedBy) {
			p.Labels[conditions.ManagedPodLabel] = "true"
		}
	}
	if optedIn {
		p.Annotations = map[string]string{conditions.AnnotationSafeToForcefullyDelete: "true"}
	}
	return p
}

// counter reads a counter's value.
func counter(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func deletedAt(p *corev1.Pod, at time.Time) *corev1.Pod {
	p = p.DeepCopy()
	p.DeletionTimestamp = ptr.To(metav1.NewTime(at))
	p.DeletionGracePeriodSeconds = ptr.To[int64](30)
	return p
}

func unreachableNode(name string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{Taints: []corev1.Taint{
		{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoSchedule},
		{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoExecute},
	}}}
}

// TestHandlers checks what the event handlers enqueue: relevant pods of managed Jobs,
// opted-in other pods only with RecoverAll from the informer of a node tainted
// unreachable (never a managed Job's pod seen there), and the relevant pods of a node
// whose taints or agent Lease changed, or that is gone; not a resync, nor a node update
// that leaves the taints.
func TestHandlers(t *testing.T) {
	for _, scope := range []RecoverScope{RecoverAll, RecoverManaged} {
		t.Run(string(scope), func(t *testing.T) {
			job := managedJob("j", conditions.ManagedBy)
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1", ResourceVersion: "1"}}
			jobPod := podOn("job-pod", "node-1", job, true)
			plainJobPod := podOn("plain-job-pod", "node-1", job, false)
			bare := podOn("bare", "node-1", nil, true)
			plainBare := podOn("plain-bare", "node-1", nil, false)
			f := newFixture(t, scope)
			f.inCache(t, job, node, jobPod, plainJobPod)
			all := scope == RecoverAll
			withOthers := func(keys ...string) []string {
				if all {
					keys = append(keys, "ns/bare")
				}
				slices.Sort(keys)
				return keys
			}
			check := func(what string, want []string) {
				t.Helper()
				if got := f.queue.take(); !slices.Equal(got, want) {
					t.Errorf("%s: enqueued %v, want %v", what, got, want)
				}
			}
			watched := func(what string, want ...string) {
				t.Helper()
				if got := f.r.WatchedNodes(); !slices.Equal(got, want) {
					t.Errorf("%s: watching the pods of %q, want %q", what, got, want)
				}
			}

			f.r.addPod(jobPod)
			f.r.addPod(plainJobPod)
			check("Jobs' pods added", []string{"ns/job-pod"})
			f.r.updatePod(jobPod, jobPod)
			check("resync", nil)
			updated := jobPod.DeepCopy()
			updated.ResourceVersion = "2"
			f.r.updatePod(jobPod, updated)
			check("Job's pod updated", []string{"ns/job-pod"})
			watched("reachable node")
			f.inCache(t, bare, plainBare)
			check("other pods on a reachable node", nil)

			tainted := unreachableNode("node-1")
			tainted.ResourceVersion = "2"
			f.r.updateNode(node, tainted)
			check("taints changed (the node's informer has listed nothing yet)", []string{"ns/job-pod"})
			if all {
				watched("tainted", "node-1")
			} else {
				watched("tainted, RecoverManaged")
			}
			f.inCache(t, bare, plainBare) // the node's informer lists them
			check("other pods on an unreachable node", withOthers())
			if nw := f.nodeWatch("node-1"); nw != nil {
				// A managed Job's pod is in a node's informer too: ignored there.
				stub, _ := informers.StripForRecovery(jobPod.DeepCopy())
				f.r.nodePodChanged(nw, stub)
				check("a managed Job's pod seen by the node's informer", nil)
				if p := f.r.nodePod("ns/job-pod"); p != nil {
					t.Errorf("nodePod(ns/job-pod) = %v, want nil: a managed Job's pod is looked up in Pods", p)
				}
			}
			if got := f.r.nodePod("ns/bare") != nil; got != all {
				t.Errorf("nodePod(ns/bare) found: %v, want %v", got, all)
			}

			relabelled := tainted.DeepCopy()
			relabelled.Labels = map[string]string{"a": "b"}
			f.r.updateNode(tainted, relabelled)
			check("taints unchanged", nil)
			lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: conditions.AgentLeaseName("node-1"), Namespace: f.inf.AgentNamespace}}
			f.r.leaseChanged(lease)
			check("agent Lease", withOthers("ns/job-pod"))
			f.r.leaseChanged(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "node-1", Namespace: f.inf.AgentNamespace}})
			check("another Lease", nil)

			// A pod that gets the managed label (the Job controller labels a managed Job's
			// pod that lacked it) leaves the lookup.
			if nw := f.nodeWatch("node-1"); nw != nil {
				labelled, _ := informers.StripForRecovery(bare.DeepCopy())
				labelled.(*corev1.Pod).Labels = map[string]string{conditions.ManagedPodLabel: "true"}
				f.r.nodePodChanged(nw, labelled)
				check("pod labelled managed", nil)
				if p := f.r.nodePod("ns/bare"); p != nil {
					t.Errorf("nodePod(ns/bare) after the managed label = %v, want nil", p)
				}
				f.r.nodePodChanged(nw, mustStrip(bare))
				check("label gone again", []string{"ns/bare"})
			}

			f.r.deleteNode(cache.DeletedFinalStateUnknown{Key: "node-1", Obj: relabelled})
			check("node deleted", []string{"ns/job-pod"})
			watched("node deleted")
			if p := f.r.nodePod("ns/bare"); p != nil {
				t.Errorf("nodePod(ns/bare) after the node's deletion = %v, want nil", p)
			}
		})
	}
}

func mustStrip(p *corev1.Pod) *corev1.Pod {
	stub, _ := informers.StripForRecovery(p.DeepCopy())
	return stub.(*corev1.Pod)
}

// TestWatchNodePods: the node events that start and stop the informer of a node's pods.
// It runs for a node tainted unreachable (whatever the taint's effect), from the initial
// list on, with RecoverAll only; it stops when the taint goes or the node is deleted.
func TestWatchNodePods(t *testing.T) {
	healthy := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}}
	notReady := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}, Spec: corev1.NodeSpec{Taints: []corev1.Taint{
		{Key: corev1.TaintNodeNotReady, Effect: corev1.TaintEffectNoExecute}}}}
	noSchedule := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}, Spec: corev1.NodeSpec{Taints: []corev1.Taint{
		{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoSchedule}}}}
	unreachable := unreachableNode("n")
	add := func(n *corev1.Node) func(*Recoverer) { return func(r *Recoverer) { r.addNode(n) } }
	update := func(o, n *corev1.Node) func(*Recoverer) { return func(r *Recoverer) { r.updateNode(o, n) } }
	del := func(obj any) func(*Recoverer) { return func(r *Recoverer) { r.deleteNode(obj) } }
	for _, tc := range []struct {
		name        string
		scope       RecoverScope
		events      []func(*Recoverer)
		wantWatched bool
	}{
		{"tainted at start", RecoverAll, []func(*Recoverer){add(unreachable)}, true},
		{"healthy at start", RecoverAll, []func(*Recoverer){add(healthy)}, false},
		{"not ready", RecoverAll, []func(*Recoverer){add(notReady)}, false},
		{"taint added", RecoverAll, []func(*Recoverer){add(healthy), update(healthy, unreachable)}, true},
		{"NoSchedule only", RecoverAll, []func(*Recoverer){add(healthy), update(healthy, noSchedule)}, true},
		{"NoExecute added", RecoverAll, []func(*Recoverer){add(noSchedule), update(noSchedule, unreachable)}, true},
		{"taint removed", RecoverAll, []func(*Recoverer){add(unreachable), update(unreachable, healthy)}, false},
		{"unreachable to not ready", RecoverAll, []func(*Recoverer){add(unreachable), update(unreachable, notReady)}, false},
		{"deleted", RecoverAll, []func(*Recoverer){add(unreachable), del(unreachable)}, false},
		{"deleted, final state unknown", RecoverAll, []func(*Recoverer){add(unreachable), del(cache.DeletedFinalStateUnknown{Key: "n", Obj: unreachable})}, false},
		{"deleted and back tainted", RecoverAll, []func(*Recoverer){add(unreachable), del(unreachable), add(unreachable)}, true},
		{"RecoverManaged, tainted at start", RecoverManaged, []func(*Recoverer){add(unreachable)}, false},
		{"RecoverManaged, taint added", RecoverManaged, []func(*Recoverer){add(healthy), update(healthy, unreachable)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.scope)
			for _, e := range tc.events {
				e(f.r)
			}
			var want []string
			if tc.wantWatched {
				want = []string{"n"}
			}
			if got := f.r.WatchedNodes(); !slices.Equal(got, want) {
				t.Errorf("watching the pods of %q, want %q", got, want)
			}
			if nw := f.nodeWatch("n"); nw != nil && nw.stop != nil {
				t.Error("the informer started before Run")
			}
		})
	}
}

// TestRecoverZombie: an opted-in pod of a managed Job, being deleted on an unreachable
// node, is requeued until its deletion plus the threshold, then failed with the conditions
// and force-deleted, with Events on the pod and the Job and the metric counted.
func TestRecoverZombie(t *testing.T) {
	job := managedJob("j", conditions.ManagedBy)
	f := newFixture(t, RecoverAll)
	pod := deletedAt(podOn("zombie", "node-1", job, true), f.clock.Now())
	f.client = fake.NewClientset(pod)
	f.r.client = f.client
	f.r.patcher = conditions.NewPodPatcher(f.client, conditions.ShimComponent)
	f.inCache(t, job, unreachableNode("node-1"), pod)

	if err := f.r.recoverPod(context.Background(), "ns/zombie"); err != nil {
		t.Fatal(err)
	}
	if got, want := f.queue.take(), []string{"ns/zombie@" + threshold.String()}; !slices.Equal(got, want) {
		t.Errorf("before the threshold: enqueued %v, want %v", got, want)
	}
	if n := len(f.client.Actions()); n != 0 {
		t.Errorf("before the threshold: %d API calls, want none: %v", n, f.client.Actions())
	}

	f.clock.Step(threshold)
	if err := f.r.recoverPod(context.Background(), "ns/zombie"); err != nil {
		t.Fatal(err)
	}
	var patched, deleted bool
	for _, a := range f.client.Actions() {
		switch a := a.(type) {
		case k8stesting.PatchAction:
			patched = a.GetSubresource() == "status" && strings.Contains(string(a.GetPatch()), `"phase":"Failed"`) &&
				strings.Contains(string(a.GetPatch()), string(conditions.ForcefullyTerminated))
		case k8stesting.DeleteAction:
			deleted = a.GetName() == "zombie" && ptr.Deref(a.GetDeleteOptions().GracePeriodSeconds, -1) == 0 &&
				*a.GetDeleteOptions().Preconditions.UID == pod.UID
		}
	}
	if !patched || !deleted {
		t.Errorf("status written: %v, force-deleted: %v; want both: %v", patched, deleted, f.client.Actions())
	}
	events := f.events()
	if len(events) != 2 || !strings.HasPrefix(events[0], "Warning "+conditions.EventReasonForcefullyTerminated) || events[0] != events[1] {
		t.Errorf("Events %q: want one Warning %s on the pod and the same on the Job", events, conditions.EventReasonForcefullyTerminated)
	}
	if n := counter(t, f.metrics.PodsRecovered.WithLabelValues(string(recovery.ForceTerminate), conditions.ReasonNodeUnreachable)); n != 1 {
		t.Errorf("coroner_pods_recovered_total = %v, want 1", n)
	}
}

// TestRecoverOrphan: a pod of a managed Job on a node that neither the cache nor the API
// server knows is failed and deleted once the node has been missing for the quarantine;
// a node the API server has (the cache lags) is no orphan.
func TestRecoverOrphan(t *testing.T) {
	job := managedJob("j", conditions.ManagedBy)
	pod := podOn("orphan", "gone", job, false)
	lagging := podOn("lagging", "new", job, false)
	f := newFixture(t, RecoverManaged, pod, lagging, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "new"}})
	f.r.patcher = conditions.NewPodPatcher(f.client, conditions.ShimComponent)
	f.inCache(t, job, pod, lagging)

	if err := f.r.recoverPod(context.Background(), "ns/lagging"); err != nil {
		t.Fatal(err)
	}
	if got := f.queue.take(); len(got) != 0 {
		t.Errorf("pod on a node the cache lags behind: enqueued %v, want nothing", got)
	}
	if err := f.r.recoverPod(context.Background(), "ns/orphan"); err != nil {
		t.Fatal(err)
	}
	quarantine := recovery.DefaultOrphanQuarantine
	if got, want := f.queue.take(), []string{"ns/orphan@" + quarantine.String()}; !slices.Equal(got, want) {
		t.Errorf("node just found missing: enqueued %v, want %v", got, want)
	}
	f.clock.Step(quarantine)
	if err := f.r.recoverPod(context.Background(), "ns/orphan"); err != nil {
		t.Fatal(err)
	}
	got, err := f.client.CoreV1().Pods(testNS).Get(context.Background(), "orphan", metav1.GetOptions{})
	if err == nil {
		t.Errorf("orphan still there after the quarantine: phase %s", got.Status.Phase)
	}
	if n := counter(t, f.metrics.PodsRecovered.WithLabelValues(string(recovery.FailOrphan), conditions.ReasonNodeDeleted)); n != 1 {
		t.Errorf("coroner_pods_recovered_total{FailOrphan} = %v, want 1", n)
	}
}

// TestRecoverOthersScope: an opted-in zombie that is not of a managed Job (a Job managed
// by someone else, a bare pod) is recovered with RecoverAll, from the informer of its
// node's pods, in the informers' namespace only, when its node is tainted unreachable,
// and never with RecoverManaged.
func TestRecoverOthersScope(t *testing.T) {
	others := managedJob("builtin", "kubernetes.io/job-controller")
	reachable := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}}
	for _, tc := range []struct {
		name      string
		scope     RecoverScope
		pod       *corev1.Pod
		node      *corev1.Node // default: tainted unreachable
		recovered bool
	}{
		{"another's Job, all", RecoverAll, podOn("p", "node-1", others, true), nil, true},
		{"another's Job, managed", RecoverManaged, podOn("p", "node-1", others, true), nil, false},
		{"bare, all", RecoverAll, podOn("p", "node-1", nil, true), nil, true},
		{"bare, managed", RecoverManaged, podOn("p", "node-1", nil, true), nil, false},
		{"bare, not opted in", RecoverAll, podOn("p", "node-1", nil, false), nil, false},
		{"bare, node reachable", RecoverAll, podOn("p", "node-1", nil, true), reachable, false},
		{"another namespace", RecoverAll, func() *corev1.Pod {
			p := podOn("p", "node-1", others, true)
			p.Namespace = "elsewhere"
			return p
		}(), nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.scope)
			start := f.clock.Now()
			pod := deletedAt(tc.pod, start)
			f.client = fake.NewClientset(pod)
			f.r.client = f.client
			f.r.patcher = conditions.NewPodPatcher(f.client, conditions.ShimComponent)
			node := tc.node
			if node == nil {
				node = unreachableNode("node-1")
			}
			f.inCache(t, others, node, pod)
			f.clock.Step(threshold)
			if err := f.r.recoverPod(context.Background(), pod.Namespace+"/p"); err != nil {
				t.Fatal(err)
			}
			deleted := slices.ContainsFunc(f.client.Actions(), func(a k8stesting.Action) bool { return a.GetVerb() == "delete" })
			if deleted != tc.recovered {
				t.Errorf("recovered: %v, want %v (%v)", deleted, tc.recovered, f.client.Actions())
			}
			for _, e := range f.events() {
				if tc.recovered && strings.Contains(e, "builtin") {
					t.Errorf("Event %q: no Event goes to a Job that is not managed", e)
				}
			}
		})
	}
}

// TestRecoverOnNodeLease: a node whose agent fences on its kubelet's node Lease. The shim
// reads that Lease and the agent's pod from the API server only for a node tainted
// unreachable, once per HeartbeatTTL, comes back at the deadline, and recovers the pod as
// NodeFenced then; an agent that fences on its own Lease costs no read.
func TestRecoverOnNodeLease(t *testing.T) {
	job := managedJob("j", conditions.ManagedBy)
	f := newFixture(t, RecoverAll)
	now := f.clock.Now()
	pod := podOn("p", "node-1", job, true)
	agentPod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: f.inf.AgentNamespace, Name: "coroner-agent-abcde"},
		Spec: corev1.PodSpec{NodeName: "node-1"}, Status: corev1.PodStatus{Phase: corev1.PodRunning,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}}
	heard := metav1.NewMicroTime(now.Add(-5 * time.Second))
	nodeLease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: conditions.NodeLeaseNamespace, Name: "node-1"},
		Spec: coordinationv1.LeaseSpec{RenewTime: &heard}}
	agentLease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: f.inf.AgentNamespace, Name: conditions.AgentLeaseName("node-1"),
		Annotations: map[string]string{conditions.AnnotationFenceOnNodeLease: "10s", conditions.AnnotationAgentPod: f.inf.AgentNamespace + "/coroner-agent-abcde"}}}
	f.client = fake.NewClientset(pod, agentPod, nodeLease)
	f.r.client = f.client
	f.r.patcher = conditions.NewPodPatcher(f.client, conditions.ShimComponent)
	reads := func() (leases, pods int) {
		for _, a := range f.client.Actions() {
			if a.GetVerb() != "get" {
				continue
			}
			switch {
			case a.GetResource().Resource == "leases" && a.GetNamespace() == conditions.NodeLeaseNamespace:
				leases++
			case a.GetResource().Resource == "pods" && a.GetNamespace() == f.inf.AgentNamespace:
				pods++
			}
		}
		return leases, pods
	}
	recover := func() {
		t.Helper()
		if err := f.r.recoverPod(context.Background(), "ns/p"); err != nil {
			t.Fatal(err)
		}
	}

	// Not tainted yet: nothing read.
	reachable := unreachableNode("node-1")
	reachable.Spec.Taints = nil
	f.inCache(t, job, reachable, pod, agentLease)
	recover()
	if l, p := reads(); l != 0 || p != 0 {
		t.Errorf("a reachable node: %d Lease and %d pod reads, want none", l, p)
	}

	// Tainted: one read of each, a requeue at the deadline (5s ago + 10s + the default 15s
	// margin), and none again within the TTL.
	if err := f.inf.Nodes.GetIndexer().Update(unreachableNode("node-1")); err != nil {
		t.Fatal(err)
	}
	f.queue.take()
	recover()
	if got, want := f.queue.take(), []string{"ns/p@20s"}; !slices.Equal(got, want) {
		t.Errorf("enqueued %v, want %v", got, want)
	}
	f.clock.Step(HeartbeatTTL - time.Second)
	recover()
	if l, p := reads(); l != 1 || p != 1 {
		t.Errorf("two decisions within the TTL: %d Lease and %d pod reads, want 1 and 1", l, p)
	}
	// At the deadline: read again (the TTL has passed), and recovered.
	f.clock.Step(20*time.Second - (HeartbeatTTL - time.Second))
	recover()
	if l, p := reads(); l != 2 || p != 2 {
		t.Errorf("at the deadline: %d Lease and %d pod reads, want 2 and 2", l, p)
	}
	if n := counter(t, f.metrics.PodsRecovered.WithLabelValues(string(recovery.ForceTerminate), conditions.ReasonNodeFenced)); n != 1 {
		t.Errorf("coroner_pods_recovered_total{NodeFenced} = %v, want 1: %v", n, f.client.Actions())
	}

	// An agent that fences on its own Lease: no read at all.
	g := newFixture(t, RecoverAll)
	own := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: g.inf.AgentNamespace, Name: conditions.AgentLeaseName("node-1"),
		Annotations: map[string]string{conditions.AnnotationFenceAfter: "10s"}}, Spec: coordinationv1.LeaseSpec{RenewTime: &heard}}
	g.client = fake.NewClientset(pod)
	g.r.client = g.client
	g.inCache(t, job, unreachableNode("node-1"), pod, own)
	if err := g.r.recoverPod(context.Background(), "ns/p"); err != nil {
		t.Fatal(err)
	}
	for _, a := range g.client.Actions() {
		if a.GetVerb() == "get" {
			t.Errorf("an agent-lease agent: read %v", a)
		}
	}
}
