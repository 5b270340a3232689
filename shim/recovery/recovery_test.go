package recovery

import (
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coroner-dev/coroner/conditions"
)

var now = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

type podOpt func(*corev1.Pod)

func pod(opts ...podOpt) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", Annotations: map[string]string{}},
		Spec:       corev1.PodSpec{NodeName: "n1"},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

func optedIn(key string) podOpt { return func(p *corev1.Pod) { p.Annotations[key] = "true" } }
func deletedAgo(d time.Duration) podOpt {
	return func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{Time: now.Add(-d)} }
}
func phase(ph corev1.PodPhase) podOpt { return func(p *corev1.Pod) { p.Status.Phase = ph } }
func disrupted(reason string, ago time.Duration) podOpt {
	return func(p *corev1.Pod) {
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue,
			Reason: reason, LastTransitionTime: metav1.Time{Time: now.Add(-ago)}})
	}
}

func forcefullyTerminated(p *corev1.Pod) {
	p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: conditions.ForcefullyTerminated, Status: corev1.ConditionTrue, Reason: conditions.ReasonNodeUnreachable})
}

func node(taints ...corev1.Taint) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Spec: corev1.NodeSpec{Taints: taints}}
}

var unreachableNoExecute = corev1.Taint{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoExecute}

func lease(renewedAgo time.Duration, fenceAfter string) *coordinationv1.Lease {
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: conditions.AgentLeaseName("n1"), Annotations: map[string]string{}}}
	if fenceAfter != "" {
		l.Annotations[conditions.AnnotationFenceAfter] = fenceAfter
	}
	l.Spec.RenewTime = &metav1.MicroTime{Time: now.Add(-renewedAgo)}
	return l
}

func TestDecide(t *testing.T) {
	cfg := Config{Threshold: 60 * time.Second, FenceMargin: 15 * time.Second, StaleAfter: 2 * time.Minute, OrphanQuarantine: 40 * time.Second}
	cases := []struct {
		name             string
		in               Input
		wantAction       Action
		wantReason       string   // the ForcefullyTerminated or DisruptionTarget reason written
		wantTypes        []string // condition types written
		wantRequeue      time.Duration
		wantMessageParts []string
	}{
		{
			name:       "zombie past the threshold",
			in:         Input{Pod: pod(optedIn(conditions.AnnotationSafeToForcefullyDelete), deletedAgo(61*time.Second)), Node: node(unreachableNoExecute)},
			wantAction: ForceTerminate, wantReason: conditions.ReasonNodeUnreachable,
			wantTypes:        []string{string(conditions.ForcefullyTerminated), string(corev1.DisruptionTarget)},
			wantMessageParts: []string{"after 1m1s", "node n1 is unreachable", "coroner.dev/safe-to-forcefully-delete"},
		},
		{
			name:       "zombie opted in with Kueue's annotation, already DisruptionTarget from the taint manager",
			in:         Input{Pod: pod(optedIn(conditions.AnnotationKueueSafeToForcefullyTerminate), deletedAgo(90*time.Second), disrupted(conditions.ReasonDeletionByTaintManager, 90*time.Second)), Node: node(unreachableNoExecute)},
			wantAction: ForceTerminate, wantReason: conditions.ReasonNodeUnreachable,
			wantTypes:        []string{string(conditions.ForcefullyTerminated)},
			wantMessageParts: []string{"kueue.x-k8s.io/safe-to-forcefully-terminate"},
		},
		{
			name:        "zombie before the threshold: come back at the deadline",
			in:          Input{Pod: pod(optedIn(conditions.AnnotationSafeToForcefullyDelete), deletedAgo(20*time.Second)), Node: node(unreachableNoExecute)},
			wantRequeue: 40 * time.Second,
		},
		{
			name: "deleted pod on an unreachable node, not opted in",
			in:   Input{Pod: pod(deletedAgo(time.Hour)), Node: node(unreachableNoExecute)},
		},
		{
			name: "opted in with another value than true",
			in: Input{Pod: pod(func(p *corev1.Pod) { p.Annotations[conditions.AnnotationSafeToForcefullyDelete] = "yes" }, deletedAgo(time.Hour)),
				Node: node(unreachableNoExecute)},
		},
		{
			name: "deleted opted-in pod on a reachable node: the kubelet will finish it",
			in:   Input{Pod: pod(optedIn(conditions.AnnotationSafeToForcefullyDelete), deletedAgo(time.Hour)), Node: node()},
		},
		{
			name: "only NoSchedule unreachable taint counts too",
			in: Input{Pod: pod(optedIn(conditions.AnnotationSafeToForcefullyDelete), deletedAgo(time.Hour)),
				Node: node(corev1.Taint{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoSchedule})},
			wantAction: ForceTerminate, wantReason: conditions.ReasonNodeUnreachable,
			wantTypes: []string{string(conditions.ForcefullyTerminated), string(corev1.DisruptionTarget)},
		},
		{
			// Issue 12 item 5 (newer Kueue does the same): no kubelet will confirm the
			// deletion; the containers have stopped, so nothing is risked.
			name:             "a terminal pod being deleted on an unreachable node is force-deleted at once",
			in:               Input{Pod: pod(optedIn(conditions.AnnotationSafeToForcefullyDelete), deletedAgo(time.Second), phase(corev1.PodFailed)), Node: node(unreachableNoExecute)},
			wantAction:       DeleteTerminal,
			wantMessageParts: []string{"phase Failed", "node n1", "unreachable", "coroner.dev/safe-to-forcefully-delete"},
		},
		{
			name:       "a terminal pod not of a managed Job, opted in by Kueue's annotation, is force-deleted too",
			in:         Input{Pod: pod(optedIn(conditions.AnnotationKueueSafeToForcefullyDelete), deletedAgo(time.Hour), phase(corev1.PodSucceeded)), Node: node(unreachableNoExecute), OptedInOnly: true},
			wantAction: DeleteTerminal,
		},
		{
			name: "a terminal pod that is not being deleted is left alone",
			in:   Input{Pod: pod(optedIn(conditions.AnnotationSafeToForcefullyDelete), phase(corev1.PodFailed)), Node: node(unreachableNoExecute)},
		},
		{
			name: "a terminal pod being deleted on a reachable node is left alone",
			in:   Input{Pod: pod(optedIn(conditions.AnnotationSafeToForcefullyDelete), deletedAgo(time.Hour), phase(corev1.PodFailed)), Node: node()},
		},
		{
			name: "a terminal pod that is not opted in is left alone",
			in:   Input{Pod: pod(deletedAgo(time.Hour), phase(corev1.PodFailed)), Node: node(unreachableNoExecute)},
		},
		{
			name: "a terminal pod force-deleted already, kept by a finalizer: nothing more",
			in: Input{Pod: pod(optedIn(conditions.AnnotationSafeToForcefullyDelete), deletedAgo(0), phase(corev1.PodFailed), func(p *corev1.Pod) {
				p.DeletionGracePeriodSeconds = new(int64)
			}), Node: node(unreachableNoExecute)},
		},
		{
			name:       "not of a managed Job, opted in: a zombie is recovered",
			in:         Input{Pod: pod(optedIn(conditions.AnnotationKueueSafeToForcefullyTerminate), deletedAgo(61*time.Second)), Node: node(unreachableNoExecute), OptedInOnly: true},
			wantAction: ForceTerminate, wantReason: conditions.ReasonNodeUnreachable,
			wantTypes: []string{string(conditions.ForcefullyTerminated), string(corev1.DisruptionTarget)},
		},
		{
			name:       "not of a managed Job, opted in: recovered at once on a fenced node",
			in:         Input{Pod: pod(optedIn(conditions.AnnotationSafeToForcefullyDelete)), Node: node(unreachableNoExecute), Fence: conditions.FenceEvidence{Node: "n1", Agent: lease(61*time.Second, "45s")}, OptedInOnly: true},
			wantAction: ForceTerminate, wantReason: conditions.ReasonNodeFenced,
		},
		{
			name: "not of a managed Job and not opted in: a zombie is left alone",
			in:   Input{Pod: pod(deletedAgo(time.Hour)), Node: node(unreachableNoExecute), Fence: conditions.FenceEvidence{Node: "n1", Agent: lease(time.Hour, "45s")}, OptedInOnly: true},
		},
		{
			name: "not of a managed Job: an orphan is pod GC's",
			in:   Input{Pod: pod(optedIn(conditions.AnnotationSafeToForcefullyDelete)), NodeGone: true, NodeMissingFor: time.Hour, OptedInOnly: true},
		},
		{
			name: "not of a managed Job: a stale DisruptionTarget is its controller's",
			in:   Input{Pod: pod(optedIn(conditions.AnnotationSafeToForcefullyDelete), disrupted(conditions.ReasonEvictionByEvictionAPI, time.Hour)), Node: node(), OptedInOnly: true},
		},
		{
			name:       "fenced node: not deleted, recovered at once",
			in:         Input{Pod: pod(optedIn(conditions.AnnotationSafeToForcefullyDelete)), Node: node(unreachableNoExecute), Fence: conditions.FenceEvidence{Node: "n1", Agent: lease(61*time.Second, "45s")}},
			wantAction: ForceTerminate, wantReason: conditions.ReasonNodeFenced,
			wantTypes:        []string{string(conditions.ForcefullyTerminated), string(corev1.DisruptionTarget)},
			wantMessageParts: []string{"unreachable and fenced", "the agent's Lease has not been renewed for 1m1s"},
		},
		{
			name:       "fenced wins over a zombie threshold not reached",
			in:         Input{Pod: pod(optedIn(conditions.AnnotationSafeToForcefullyDelete), deletedAgo(5*time.Second)), Node: node(unreachableNoExecute), Fence: conditions.FenceEvidence{Node: "n1", Agent: lease(2*time.Minute, "45s")}},
			wantAction: ForceTerminate, wantReason: conditions.ReasonNodeFenced,
			wantTypes: []string{string(conditions.ForcefullyTerminated), string(corev1.DisruptionTarget)},
		},
		{
			name:        "lease expiring: come back when the agent has surely fenced",
			in:          Input{Pod: pod(optedIn(conditions.AnnotationSafeToForcefullyDelete)), Node: node(unreachableNoExecute), Fence: conditions.FenceEvidence{Node: "n1", Agent: lease(30*time.Second, "45s")}},
			wantRequeue: 30 * time.Second,
		},
		{
			name:        "earliest of the fence and zombie deadlines",
			in:          Input{Pod: pod(optedIn(conditions.AnnotationSafeToForcefullyDelete), deletedAgo(50*time.Second)), Node: node(unreachableNoExecute), Fence: conditions.FenceEvidence{Node: "n1", Agent: lease(10*time.Second, "45s")}},
			wantRequeue: 10 * time.Second,
		},
		{
			name: "agent without fencing: an old lease means nothing",
			in:   Input{Pod: pod(optedIn(conditions.AnnotationSafeToForcefullyDelete)), Node: node(unreachableNoExecute), Fence: conditions.FenceEvidence{Node: "n1", Agent: lease(time.Hour, "")}},
		},
		{
			name: "fenced lease but the node is reachable",
			in:   Input{Pod: pod(optedIn(conditions.AnnotationSafeToForcefullyDelete)), Node: node(), Fence: conditions.FenceEvidence{Node: "n1", Agent: lease(time.Hour, "45s")}},
		},
		{
			name:             "orphan: its node is gone",
			in:               Input{Pod: pod(), NodeGone: true, NodeMissingFor: 40 * time.Second},
			wantAction:       FailOrphan,
			wantTypes:        []string{string(conditions.ForcefullyTerminated), string(corev1.DisruptionTarget)},
			wantMessageParts: []string{"node n1 no longer exists"},
		},
		{
			name:       "recovered, failed, not deleted yet: delete it",
			in:         Input{Pod: pod(phase(corev1.PodFailed), forcefullyTerminated), Node: node(unreachableNoExecute)},
			wantAction: FinishDeletion,
		},
		{
			name: "recovered and force-deleted, kept by its finalizer: nothing more",
			in: Input{Pod: pod(phase(corev1.PodFailed), forcefullyTerminated, deletedAgo(0), func(p *corev1.Pod) {
				p.DeletionGracePeriodSeconds = new(int64)
			}), Node: node(unreachableNoExecute)},
		},
		{
			name:       "orphan that was already disrupted keeps its reason",
			in:         Input{Pod: pod(disrupted(conditions.ReasonEvictionByEvictionAPI, time.Second)), NodeGone: true, NodeMissingFor: time.Hour},
			wantAction: FailOrphan,
		},
		{
			name:        "node missing for less than the quarantine: it may come back",
			in:          Input{Pod: pod(), NodeGone: true, NodeMissingFor: 10 * time.Second},
			wantRequeue: 30 * time.Second,
		},
		{
			name:       "stale DisruptionTarget cleared",
			in:         Input{Pod: pod(disrupted(conditions.ReasonEvictionByEvictionAPI, 2*time.Minute)), Node: node()},
			wantAction: ClearDisruption, wantReason: conditions.ReasonStaleDisruptionTarget,
			wantTypes:        []string{string(corev1.DisruptionTarget)},
			wantMessageParts: []string{"DisruptionTarget (EvictionByEvictionAPI) cleared", "2m0s"},
		},
		{
			name:        "fresh DisruptionTarget: come back when it would be stale",
			in:          Input{Pod: pod(disrupted(conditions.ReasonPreemptionByScheduler, 30*time.Second)), Node: node()},
			wantRequeue: 90 * time.Second,
		},
		{
			name: "DisruptionTarget on a pod being deleted is not stale",
			in:   Input{Pod: pod(disrupted(conditions.ReasonPreemptionByScheduler, time.Hour), deletedAgo(time.Hour)), Node: node()},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.in.Now = now
			d := cfg.Decide(tc.in)
			if d.Action != tc.wantAction {
				t.Fatalf("action %q, want %q (decision %+v)", d.Action, tc.wantAction, d)
			}
			if d.RequeueAfter != tc.wantRequeue {
				t.Errorf("requeue after %v, want %v", d.RequeueAfter, tc.wantRequeue)
			}
			var types []string
			for _, c := range d.Conditions {
				types = append(types, string(c.Type))
				if tc.wantReason != "" && c.Reason != tc.wantReason {
					t.Errorf("condition %s reason %q, want %q", c.Type, c.Reason, tc.wantReason)
				}
			}
			if tc.wantTypes != nil && strings.Join(types, ",") != strings.Join(tc.wantTypes, ",") {
				t.Errorf("conditions %v, want %v", types, tc.wantTypes)
			}
			if wantDelete := tc.wantAction == ForceTerminate || tc.wantAction == FailOrphan || tc.wantAction == FinishDeletion || tc.wantAction == DeleteTerminal; d.Delete != wantDelete {
				t.Errorf("delete %v, want %v", d.Delete, wantDelete)
			}
			for _, part := range tc.wantMessageParts {
				if !strings.Contains(d.Message, part) {
					t.Errorf("message %q does not contain %q", d.Message, part)
				}
			}
			if tc.wantAction != None && tc.wantAction != FinishDeletion && (d.Message == "" || d.Reason == "") {
				t.Errorf("decision %+v without an Event", d)
			}
		})
	}
}

func TestRelevant(t *testing.T) {
	cases := map[string]struct {
		pod  *corev1.Pod
		want bool
		// wantOptedInOnly is Relevant's answer for a pod not of a managed Job.
		wantOptedInOnly bool
	}{
		"plain running pod":                  {pod(), false, false},
		"opted in":                           {pod(optedIn(conditions.AnnotationSafeToForcefullyDelete)), true, true},
		"being deleted":                      {pod(deletedAgo(time.Second)), true, false},
		"disrupted":                          {pod(disrupted("x", time.Second)), true, false},
		"unbound":                            {pod(deletedAgo(time.Second), func(p *corev1.Pod) { p.Spec.NodeName = "" }), false, false},
		"terminal and deleted":               {pod(deletedAgo(time.Second), phase(corev1.PodSucceeded)), false, false},
		"terminal, deleted and opted in":     {pod(optedIn(conditions.AnnotationKueueSafeToForcefullyTerminate), deletedAgo(time.Second), phase(corev1.PodSucceeded)), true, true},
		"terminal, opted in, not deleted":    {pod(optedIn(conditions.AnnotationKueueSafeToForcefullyTerminate), phase(corev1.PodFailed)), false, false},
		"opted in with a value not \"true\"": {pod(func(p *corev1.Pod) { p.Annotations[conditions.AnnotationSafeToForcefullyDelete] = "True" }, deletedAgo(time.Second)), true, false},
		"nil":                                {nil, false, false},
	}
	for name, tc := range cases {
		if got := Relevant(tc.pod, false); got != tc.want {
			t.Errorf("%s: Relevant = %v, want %v", name, got, tc.want)
		}
		if got := Relevant(tc.pod, true); got != tc.wantOptedInOnly {
			t.Errorf("%s: Relevant (opted-in only) = %v, want %v", name, got, tc.wantOptedInOnly)
		}
	}
}
