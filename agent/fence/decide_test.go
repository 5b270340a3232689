package fence

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/cri"
)

const (
	node = "node-a"
	ns   = "batch"
)

var t0 = time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)

// podWrapper builds test pods.
type podWrapper struct{ corev1.Pod }

func makePod(name string) *podWrapper {
	return &podWrapper{corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name)},
		Spec:       corev1.PodSpec{NodeName: node},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}}
}

func (w *podWrapper) optedIn() *podWrapper {
	return w.annotation(conditions.AnnotationSafeToForcefullyDelete, "true")
}

func (w *podWrapper) annotation(k, v string) *podWrapper {
	if w.Annotations == nil {
		w.Annotations = map[string]string{}
	}
	w.Annotations[k] = v
	return w
}

func (w *podWrapper) node(n string) *podWrapper { w.Spec.NodeName = n; return w }

func (w *podWrapper) phase(p corev1.PodPhase) *podWrapper { w.Status.Phase = p; return w }

func (w *podWrapper) grace(s int64) *podWrapper { w.Spec.TerminationGracePeriodSeconds = &s; return w }

func (w *podWrapper) obj() *corev1.Pod { return &w.Pod }

// running is a running container of pod (by name) with the kubelet's labels.
func running(id, pod, name string) cri.Container {
	return cri.Container{ID: id, SandboxID: "sb-" + pod, Name: name, PodNamespace: ns, PodName: pod, PodUID: "uid-" + pod, Running: true}
}

// sandbox is pod's ready sandbox ("sb-<pod>", as running names it) with annotations.
func sandbox(pod string, annotations map[string]string) cri.Sandbox {
	return cri.Sandbox{ID: "sb-" + pod, PodNamespace: ns, PodName: pod, PodUID: "uid-" + pod, Annotations: annotations, Ready: true}
}

// optIn are the annotations of a pod opted in to forceful deletion, as the kubelet copies
// them onto its sandbox.
var optIn = map[string]string{conditions.AnnotationSafeToForcefullyDelete: "true", "kubernetes.io/config.source": "api"}

func TestRenewPeriodAndRequestTimeout(t *testing.T) {
	for _, tc := range []struct {
		fenceAfter          time.Duration
		wantPeriod, wantReq time.Duration
	}{
		{fenceAfter: 2 * time.Second, wantPeriod: time.Second, wantReq: time.Second},
		{fenceAfter: 10 * time.Second, wantPeriod: 2500 * time.Millisecond, wantReq: 2500 * time.Millisecond},
		{fenceAfter: 30 * time.Second, wantPeriod: 7500 * time.Millisecond, wantReq: 5 * time.Second},
		{fenceAfter: 2 * time.Minute, wantPeriod: 10 * time.Second, wantReq: 5 * time.Second},
	} {
		if got := RenewPeriod(tc.fenceAfter); got != tc.wantPeriod {
			t.Errorf("RenewPeriod(%v) = %v, want %v", tc.fenceAfter, got, tc.wantPeriod)
		}
		if got := RequestTimeout(RenewPeriod(tc.fenceAfter)); got != tc.wantReq {
			t.Errorf("RequestTimeout(RenewPeriod(%v)) = %v, want %v", tc.fenceAfter, got, tc.wantReq)
		}
	}
}

func TestShouldFence(t *testing.T) {
	const fenceAfter = 45 * time.Second
	for _, tc := range []struct {
		name        string
		lastRenewal time.Time
		now         time.Time
		want        bool
	}{
		{name: "just renewed", lastRenewal: t0, now: t0, want: false},
		{name: "within fence-after", lastRenewal: t0, now: t0.Add(44 * time.Second), want: false},
		{name: "exactly fence-after is not yet over it", lastRenewal: t0, now: t0.Add(fenceAfter), want: false},
		{name: "over fence-after", lastRenewal: t0, now: t0.Add(fenceAfter + time.Millisecond), want: true},
		{name: "long partition", lastRenewal: t0, now: t0.Add(time.Hour), want: true},
		{name: "clock stepped back", lastRenewal: t0, now: t0.Add(-time.Minute), want: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ShouldFence(tc.lastRenewal, tc.now, fenceAfter); got != tc.want {
				t.Errorf("ShouldFence(%v after) = %v, want %v", tc.now.Sub(tc.lastRenewal), got, tc.want)
			}
		})
	}
}

func TestToStop(t *testing.T) {
	const maxStop = 10 * time.Second
	kueue := makePod("kueue").annotation(conditions.AnnotationKueueSafeToForcefullyTerminate, "true")
	for _, tc := range []struct {
		name       string
		pods       []*corev1.Pod
		sandboxes  []cri.Sandbox
		containers []cri.Container
		want       []Target
	}{
		{
			name:       "opted-in pod's running containers",
			pods:       []*corev1.Pod{makePod("a").optedIn().grace(5).obj()},
			containers: []cri.Container{running("c2", "a", "side"), running("c1", "a", "main")},
			want: []Target{
				{Container: running("c1", "a", "main"), Pod: types.NamespacedName{Namespace: ns, Name: "a"}, Timeout: 5 * time.Second, OptedInBy: OptedInByPod},
				{Container: running("c2", "a", "side"), Pod: types.NamespacedName{Namespace: ns, Name: "a"}, Timeout: 5 * time.Second, OptedInBy: OptedInByPod},
			},
		},
		{
			name:       "a pod that is not opted in is never touched",
			pods:       []*corev1.Pod{makePod("a").obj(), makePod("b").annotation(conditions.AnnotationSafeToForcefullyDelete, "false").obj()},
			containers: []cri.Container{running("c1", "a", "main"), running("c2", "b", "main")},
		},
		{
			name:       "Kueue's annotation opts in too",
			pods:       []*corev1.Pod{kueue.obj()},
			containers: []cri.Container{running("c1", "kueue", "main")},
			want:       []Target{{Container: running("c1", "kueue", "main"), Pod: types.NamespacedName{Namespace: ns, Name: "kueue"}, Timeout: maxStop, OptedInBy: OptedInByPod}},
		},
		{
			name:       "mixed: only the opted-in pod's container",
			pods:       []*corev1.Pod{makePod("in").optedIn().obj(), makePod("out").obj()},
			containers: []cri.Container{running("c1", "out", "main"), running("c2", "in", "main")},
			want:       []Target{{Container: running("c2", "in", "main"), Pod: types.NamespacedName{Namespace: ns, Name: "in"}, Timeout: maxStop, OptedInBy: OptedInByPod}},
		},
		{
			name:       "terminal pods are left alone",
			pods:       []*corev1.Pod{makePod("done").optedIn().phase(corev1.PodSucceeded).obj(), makePod("failed").optedIn().phase(corev1.PodFailed).obj()},
			containers: []cri.Container{running("c1", "done", "main"), running("c2", "failed", "main")},
		},
		{
			name:       "a pending or being-deleted opted-in pod is fenced",
			pods:       []*corev1.Pod{makePod("p").optedIn().phase(corev1.PodPending).grace(0).obj()},
			containers: []cri.Container{running("c1", "p", "main")},
			want:       []Target{{Container: running("c1", "p", "main"), Pod: types.NamespacedName{Namespace: ns, Name: "p"}, Timeout: 0, OptedInBy: OptedInByPod}},
		},
		{
			name:       "a pod of another node (should one reach the cache) is not",
			pods:       []*corev1.Pod{makePod("a").optedIn().node("node-b").obj()},
			containers: []cri.Container{running("c1", "a", "main")},
		},
		{
			name:       "exited containers are not stopped again",
			pods:       []*corev1.Pod{makePod("a").optedIn().obj()},
			containers: []cri.Container{{ID: "c1", Name: "main", PodNamespace: ns, PodName: "a", PodUID: "uid-a"}},
		},
		{
			name:       "containers of unknown pods are not touched",
			pods:       []*corev1.Pod{makePod("a").optedIn().obj()},
			containers: []cri.Container{running("c1", "stranger", "main")},
		},
		{
			name:       "containers match by UID, not by name",
			pods:       []*corev1.Pod{makePod("a").optedIn().obj()},
			containers: []cri.Container{{ID: "c1", Name: "main", PodNamespace: ns, PodName: "a", PodUID: "uid-of-an-older-a", Running: true}},
		},
		{name: "no pods", containers: []cri.Container{running("c1", "a", "main")}},
		{name: "no containers", pods: []*corev1.Pod{makePod("a").optedIn().obj()}},

		// The sandboxes' annotations: pods the cache does not know.
		{
			name:       "a pod only its sandbox knows: its running containers, with the capped grace",
			sandboxes:  []cri.Sandbox{sandbox("a", optIn)},
			containers: []cri.Container{running("c2", "a", "side"), running("c1", "a", "main")},
			want: []Target{
				{Container: running("c1", "a", "main"), Pod: types.NamespacedName{Namespace: ns, Name: "a"}, Timeout: maxStop, OptedInBy: OptedInBySandbox},
				{Container: running("c2", "a", "side"), Pod: types.NamespacedName{Namespace: ns, Name: "a"}, Timeout: maxStop, OptedInBy: OptedInBySandbox},
			},
		},
		{
			name:       "Kueue's annotation on a sandbox opts in too",
			sandboxes:  []cri.Sandbox{sandbox("k", map[string]string{conditions.AnnotationKueueSafeToForcefullyTerminate: "true"})},
			containers: []cri.Container{running("c1", "k", "main")},
			want:       []Target{{Container: running("c1", "k", "main"), Pod: types.NamespacedName{Namespace: ns, Name: "k"}, Timeout: maxStop, OptedInBy: OptedInBySandbox}},
		},
		{
			name: "a sandbox that does not opt in is never touched",
			sandboxes: []cri.Sandbox{sandbox("a", nil), sandbox("b", map[string]string{conditions.AnnotationSafeToForcefullyDelete: "false"}),
				sandbox("c", map[string]string{"kubernetes.io/config.source": "api"})},
			containers: []cri.Container{running("c1", "a", "main"), running("c2", "b", "main"), running("c3", "c", "main")},
		},
		{
			name:       "union: the cache's opted-in pods and the sandboxes', nothing else",
			pods:       []*corev1.Pod{makePod("cached").optedIn().grace(3).obj(), makePod("cached-out").obj()},
			sandboxes:  []cri.Sandbox{sandbox("cached", optIn), sandbox("cached-out", nil), sandbox("only-sandbox", optIn), sandbox("sandbox-out", nil)},
			containers: []cri.Container{running("c1", "sandbox-out", "main"), running("c2", "only-sandbox", "main"), running("c3", "cached-out", "main"), running("c4", "cached", "main"), running("c5", "stranger", "main")},
			want: []Target{
				{Container: running("c4", "cached", "main"), Pod: types.NamespacedName{Namespace: ns, Name: "cached"}, Timeout: 3 * time.Second, OptedInBy: OptedInByPod},
				{Container: running("c2", "only-sandbox", "main"), Pod: types.NamespacedName{Namespace: ns, Name: "only-sandbox"}, Timeout: maxStop, OptedInBy: OptedInBySandbox},
			},
		},
		{
			name:       "opted in by the cache, not by its sandbox (annotated later): stopped",
			pods:       []*corev1.Pod{makePod("a").optedIn().obj()},
			sandboxes:  []cri.Sandbox{sandbox("a", nil)},
			containers: []cri.Container{running("c1", "a", "main")},
			want:       []Target{{Container: running("c1", "a", "main"), Pod: types.NamespacedName{Namespace: ns, Name: "a"}, Timeout: maxStop, OptedInBy: OptedInByPod}},
		},
		{
			name:       "the cache's word wins: opt-in withdrawn after the sandbox was made",
			pods:       []*corev1.Pod{makePod("a").obj(), makePod("b").annotation(conditions.AnnotationSafeToForcefullyDelete, "false").obj()},
			sandboxes:  []cri.Sandbox{sandbox("a", optIn), sandbox("b", optIn)},
			containers: []cri.Container{running("c1", "a", "main"), running("c2", "b", "main")},
		},
		{
			name:       "a pod the cache knows as terminal is left alone whatever its sandbox says",
			pods:       []*corev1.Pod{makePod("done").optedIn().phase(corev1.PodSucceeded).obj(), makePod("failed").phase(corev1.PodFailed).obj()},
			sandboxes:  []cri.Sandbox{sandbox("done", optIn), sandbox("failed", optIn)},
			containers: []cri.Container{running("c1", "done", "main"), running("c2", "failed", "main")},
		},
		{
			name:       "a pod the cache has on another node is not stopped by its sandbox either",
			pods:       []*corev1.Pod{makePod("a").optedIn().node("node-b").obj()},
			sandboxes:  []cri.Sandbox{sandbox("a", optIn)},
			containers: []cri.Container{running("c1", "a", "main")},
		},
		{
			name:       "a sandbox that is not ready still opts its running containers in",
			sandboxes:  []cri.Sandbox{func() cri.Sandbox { s := sandbox("a", optIn); s.Ready = false; return s }()},
			containers: []cri.Container{running("c1", "a", "main")},
			want:       []Target{{Container: running("c1", "a", "main"), Pod: types.NamespacedName{Namespace: ns, Name: "a"}, Timeout: maxStop, OptedInBy: OptedInBySandbox}},
		},
		{
			name:       "a container goes by its own sandbox: another sandbox of the pod that opts in does not count",
			sandboxes:  []cri.Sandbox{{ID: "sb-old", PodNamespace: ns, PodName: "a", PodUID: "uid-a", Annotations: optIn}, sandbox("a", nil)},
			containers: []cri.Container{running("c1", "a", "main")},
		},
		{
			name:       "a container that names another pod than its sandbox's is not stopped",
			sandboxes:  []cri.Sandbox{sandbox("a", optIn)},
			containers: []cri.Container{{ID: "c1", SandboxID: "sb-a", Name: "main", PodNamespace: ns, PodName: "b", PodUID: "uid-b", Running: true}},
		},
		{
			name:       "exited containers of a sandbox-only pod are not stopped again",
			sandboxes:  []cri.Sandbox{sandbox("a", optIn)},
			containers: []cri.Container{{ID: "c1", SandboxID: "sb-a", Name: "main", PodNamespace: ns, PodName: "a", PodUID: "uid-a"}},
		},
		{
			name:       "containers whose sandbox is not listed are not stopped",
			sandboxes:  []cri.Sandbox{sandbox("a", optIn)},
			containers: []cri.Container{running("c1", "b", "main")},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ToStop(node, tc.pods, tc.sandboxes, tc.containers, maxStop)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("ToStop (-want +got):\n%s", diff)
			}
		})
	}
}

func TestStopTimeout(t *testing.T) {
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want time.Duration
	}{
		{name: "unset grace: 30s, capped", pod: makePod("a").obj(), want: 10 * time.Second},
		{name: "short grace", pod: makePod("a").grace(3).obj(), want: 3 * time.Second},
		{name: "zero grace", pod: makePod("a").grace(0).obj(), want: 0},
		{name: "long grace capped", pod: makePod("a").grace(600).obj(), want: 10 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := StopTimeout(tc.pod, 10*time.Second); got != tc.want {
				t.Errorf("StopTimeout = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestMessage(t *testing.T) {
	nn := func(name string) types.NamespacedName { return types.NamespacedName{Namespace: ns, Name: name} }
	many := map[string]types.NamespacedName{}
	for i := range 12 {
		many[string(rune('a'+i))] = nn("p" + string(rune('a'+i)))
	}
	for _, tc := range []struct {
		name      string
		outage    time.Duration
		fromStart bool
		stopped   map[string]types.NamespacedName
		want      string
	}{
		{
			name:    "several containers and pods",
			outage:  72*time.Second + 300*time.Millisecond,
			stopped: map[string]types.NamespacedName{"c1": nn("b"), "c2": nn("a"), "c3": nn("b")},
			want:    "Lost the API server for 1m12s (over --fence-after 45s): stopped 3 containers of 2 opted-in pods: batch/a, batch/b",
		},
		{
			name:    "one",
			outage:  50 * time.Second,
			stopped: map[string]types.NamespacedName{"c1": nn("a")},
			want:    "Lost the API server for 50s (over --fence-after 45s): stopped 1 container of 1 opted-in pod: batch/a",
		},
		{
			name:   "nothing ran",
			outage: 46 * time.Second,
			want:   "Lost the API server for 46s (over --fence-after 45s): no container of an opted-in pod was running",
		},
		{
			name:      "no renewal since the agent started",
			outage:    47 * time.Second,
			fromStart: true,
			stopped:   map[string]types.NamespacedName{"c1": nn("a")},
			want:      "Could not reach the API server for 47s since the agent started (over --fence-after 45s): stopped 1 container of 1 opted-in pod: batch/a",
		},
		{
			name:    "long lists are cut",
			outage:  time.Hour,
			stopped: many,
			want:    "Lost the API server for 1h0m0s (over --fence-after 45s): stopped 12 containers of 12 opted-in pods: batch/pa, batch/pb, batch/pc, batch/pd, batch/pe, batch/pf, batch/pg, batch/ph, batch/pi, batch/pj and 2 more",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Message(tc.outage, 45*time.Second, tc.fromStart, tc.stopped); got != tc.want {
				t.Errorf("Message =\n%q, want\n%q", got, tc.want)
			}
		})
	}
}

func TestDesiredLease(t *testing.T) {
	micro := func(t time.Time) *metav1.MicroTime { m := metav1.NewMicroTime(t); return &m }
	str := func(s string) *string { return &s }
	i32 := func(i int32) *int32 { return &i }
	existing := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "coroner-agent-node-a", Namespace: "coroner-system", ResourceVersion: "7",
			Annotations: map[string]string{conditions.AnnotationFenceAfter: "1m0s", conditions.AnnotationFencedAt: "2026-02-01T00:00:00Z", "other": "kept"}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: str(node), AcquireTime: micro(t0.Add(-time.Hour)), RenewTime: micro(t0.Add(-time.Second)), LeaseDurationSeconds: i32(60)},
	}
	for _, tc := range []struct {
		name       string
		cur        *coordinationv1.Lease
		fenceAfter time.Duration
		fencedAt   time.Time
		want       *coordinationv1.Lease
	}{
		{
			name:       "created",
			fenceAfter: 45 * time.Second,
			want: &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Name: "coroner-agent-node-a", Namespace: "coroner-system",
					Labels:      map[string]string{LeaseLabel: "coroner-agent"},
					Annotations: map[string]string{conditions.AnnotationFenceAfter: "45s"}},
				Spec: coordinationv1.LeaseSpec{HolderIdentity: str(node), AcquireTime: micro(t0), RenewTime: micro(t0), LeaseDurationSeconds: i32(45)},
			},
		},
		{
			name:       "renewed: fence-after updated, fenced-at and others kept, acquireTime kept, duration rounded up",
			cur:        existing,
			fenceAfter: 10500 * time.Millisecond,
			want: &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Name: "coroner-agent-node-a", Namespace: "coroner-system", ResourceVersion: "7",
					Annotations: map[string]string{conditions.AnnotationFenceAfter: "10.5s", conditions.AnnotationFencedAt: "2026-02-01T00:00:00Z", "other": "kept"}},
				Spec: coordinationv1.LeaseSpec{HolderIdentity: str(node), AcquireTime: micro(t0.Add(-time.Hour)), RenewTime: micro(t0), LeaseDurationSeconds: i32(11)},
			},
		},
		{
			name:       "the renewal that ends a fence records it",
			cur:        existing,
			fenceAfter: time.Minute,
			fencedAt:   t0.Add(-90 * time.Second).In(time.FixedZone("CET", 3600)),
			want: &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Name: "coroner-agent-node-a", Namespace: "coroner-system", ResourceVersion: "7",
					Annotations: map[string]string{conditions.AnnotationFenceAfter: "1m0s", conditions.AnnotationFencedAt: "2026-03-01T09:58:30Z", "other": "kept"}},
				Spec: coordinationv1.LeaseSpec{HolderIdentity: str(node), AcquireTime: micro(t0.Add(-time.Hour)), RenewTime: micro(t0), LeaseDurationSeconds: i32(60)},
			},
		},
		{
			name: "held by another: acquired anew",
			cur: &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "coroner-agent-node-a", Namespace: "coroner-system"},
				Spec: coordinationv1.LeaseSpec{HolderIdentity: str("someone"), AcquireTime: micro(t0.Add(-time.Hour))}},
			fenceAfter: time.Minute,
			want: &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Name: "coroner-agent-node-a", Namespace: "coroner-system",
					Annotations: map[string]string{conditions.AnnotationFenceAfter: "1m0s"}},
				Spec: coordinationv1.LeaseSpec{HolderIdentity: str(node), AcquireTime: micro(t0), RenewTime: micro(t0), LeaseDurationSeconds: i32(60)},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var before *coordinationv1.Lease
			if tc.cur != nil {
				before = tc.cur.DeepCopy()
			}
			got := DesiredLease(tc.cur, "coroner-system", node, tc.fenceAfter, t0, tc.fencedAt)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("DesiredLease (-want +got):\n%s", diff)
			}
			if tc.cur != nil && !cmp.Equal(before, tc.cur) {
				t.Error("DesiredLease modified its input")
			}
			// The shim's reading of it: not fenced now, fenced once renewTime +
			// fence-after + margin has passed.
			if st := conditions.NodeFenced(conditions.FenceEvidence{Node: node, Agent: got}, t0.Add(tc.fenceAfter), time.Second); st.Fenced {
				t.Errorf("NodeFenced right at fence-after: %+v", st)
			}
			if st := conditions.NodeFenced(conditions.FenceEvidence{Node: node, Agent: got}, t0.Add(tc.fenceAfter+time.Second), time.Second); !st.Fenced || !st.Since.Equal(t0.Add(tc.fenceAfter)) {
				t.Errorf("NodeFenced after fence-after + margin: %+v, want fenced since %v", st, t0.Add(tc.fenceAfter))
			}
		})
	}
}
