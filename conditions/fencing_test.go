package conditions

import (
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestNodeFenced(t *testing.T) {
	renewed := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	lease := func(annotations map[string]string, renew *time.Time) *coordinationv1.Lease {
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: AgentLeaseName("n1"), Annotations: annotations}}
		if renew != nil {
			l.Spec.RenewTime = &metav1.MicroTime{Time: *renew}
		}
		return l
	}
	fencing := map[string]string{AnnotationFenceAfter: "45s"}
	const margin = 15 * time.Second
	cases := []struct {
		name      string
		lease     *coordinationv1.Lease
		now       time.Time
		want      bool
		wantSince time.Time
	}{
		{"no lease", nil, renewed.Add(time.Hour), false, time.Time{}},
		{"agent does not fence", lease(nil, &renewed), renewed.Add(time.Hour), false, time.Time{}},
		{"invalid fence-after", lease(map[string]string{AnnotationFenceAfter: "soon"}, &renewed), renewed.Add(time.Hour), false, time.Time{}},
		{"never renewed", lease(fencing, nil), renewed.Add(time.Hour), false, time.Time{}},
		{"fresh", lease(fencing, &renewed), renewed.Add(10 * time.Second), false, time.Time{}},
		{"past fence-after, within the margin", lease(fencing, &renewed), renewed.Add(59 * time.Second), false, time.Time{}},
		{"exactly fence-after plus margin", lease(fencing, &renewed), renewed.Add(60 * time.Second), true, renewed.Add(45 * time.Second)},
		{"long expired", lease(fencing, &renewed), renewed.Add(time.Hour), true, renewed.Add(45 * time.Second)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := NodeFenced(FenceEvidence{Node: "n1", Agent: tc.lease}, tc.now, margin)
			if got.Fenced != tc.want || !got.Since.Equal(tc.wantSince) || got.Why == "" {
				t.Errorf("NodeFenced = %+v, want fenced=%v since %v and a reason", got, tc.want, tc.wantSince)
			}
			deadline, ok := FenceDeadline(FenceEvidence{Node: "n1", Agent: tc.lease}, margin)
			if ok && (tc.now.Before(deadline) == tc.want) {
				t.Errorf("FenceDeadline %v disagrees with NodeFenced at %v", deadline, tc.now)
			}
		})
	}
}

// agentPod is an agent's pod on node: Running, with the Ready condition given (none when
// ready is "").
func agentPod(node string, ready corev1.ConditionStatus, reason string, transition time.Time) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "coroner-system", Name: "coroner-agent-x7k2p"},
		Spec: corev1.PodSpec{NodeName: node}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	if ready != "" {
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: ready, Reason: reason,
			LastTransitionTime: metav1.NewTime(transition)}}
	}
	return p
}

func TestNodeFencedOnNodeLease(t *testing.T) {
	heard := time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC)
	const margin = 15 * time.Second
	agent := func(annotations map[string]string) *coordinationv1.Lease {
		// The agent's own renewTime is its start, long ago: in this mode it does not count.
		old := metav1.NewMicroTime(heard.Add(-time.Hour))
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: AgentLeaseName("n1"), Annotations: annotations},
			Spec: coordinationv1.LeaseSpec{RenewTime: &old}}
	}
	onNodeLease := map[string]string{AnnotationFenceOnNodeLease: "45s", AnnotationAgentPod: "coroner-system/coroner-agent-x7k2p"}
	nodeLease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: NodeLeaseNamespace, Name: "n1"},
		Spec: coordinationv1.LeaseSpec{RenewTime: &metav1.MicroTime{Time: heard}}}
	neverRenewed := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: NodeLeaseNamespace, Name: "n1"}}
	ready := agentPod("n1", corev1.ConditionTrue, "", heard.Add(-time.Hour))
	// What the node lifecycle controller leaves: the kubelet's Ready=True turned False, no
	// reason, 50 s after the kubelet's last renewal.
	markedByNodeController := agentPod("n1", corev1.ConditionFalse, "", heard.Add(50*time.Second))
	cases := []struct {
		name    string
		ev      FenceEvidence
		now     time.Time
		want    bool
		wantWhy string
	}{
		{"fresh heartbeat", FenceEvidence{Node: "n1", Agent: agent(onNodeLease), NodeLease: nodeLease, AgentPod: ready}, heard.Add(10 * time.Second), false, "renewed 10s ago"},
		{"within the margin", FenceEvidence{Node: "n1", Agent: agent(onNodeLease), NodeLease: nodeLease, AgentPod: ready}, heard.Add(59 * time.Second), false, "renewed 59s ago"},
		{"fence-after plus margin", FenceEvidence{Node: "n1", Agent: agent(onNodeLease), NodeLease: nodeLease, AgentPod: ready}, heard.Add(60 * time.Second), true, "kube-node-lease/n1 has not been renewed for 1m0s"},
		{"agent marked not ready by the node controller", FenceEvidence{Node: "n1", Agent: agent(onNodeLease), NodeLease: nodeLease, AgentPod: markedByNodeController}, heard.Add(time.Hour), true, "fenced the node after 45s"},
		{"agent not ready by its kubelet", FenceEvidence{Node: "n1", Agent: agent(onNodeLease), NodeLease: nodeLease,
			AgentPod: agentPod("n1", corev1.ConditionFalse, "ContainersNotReady", heard.Add(-30*time.Second))}, heard.Add(time.Hour), false, "was not ready"},
		{"agent's pod unknown", FenceEvidence{Node: "n1", Agent: agent(onNodeLease), NodeLease: nodeLease}, heard.Add(time.Hour), false, "not found"},
		{"agent's pod on another node", FenceEvidence{Node: "n1", Agent: agent(onNodeLease), NodeLease: nodeLease, AgentPod: agentPod("n2", corev1.ConditionTrue, "", heard)}, heard.Add(time.Hour), false, "not on node n1"},
		{"node Lease unknown", FenceEvidence{Node: "n1", Agent: agent(onNodeLease), AgentPod: ready}, heard.Add(time.Hour), false, "kube-node-lease/n1 is not known"},
		{"node Lease never renewed", FenceEvidence{Node: "n1", Agent: agent(onNodeLease), NodeLease: neverRenewed, AgentPod: ready}, heard.Add(time.Hour), false, "never renewed"},
		{"invalid fence-after", FenceEvidence{Node: "n1", Agent: agent(map[string]string{AnnotationFenceOnNodeLease: "-3s"}), NodeLease: nodeLease, AgentPod: ready}, heard.Add(time.Hour), false, "invalid"},
		{"the node Lease wins over the agent-lease annotation", FenceEvidence{Node: "n1",
			Agent: agent(map[string]string{AnnotationFenceOnNodeLease: "45s", AnnotationFenceAfter: "45s"}), NodeLease: nodeLease, AgentPod: ready}, heard.Add(30 * time.Second), false, "renewed 30s ago"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := NodeFenced(tc.ev, tc.now, margin)
			wantSince := time.Time{}
			if tc.want {
				wantSince = heard.Add(45 * time.Second)
			}
			if got.Fenced != tc.want || !got.Since.Equal(wantSince) || !strings.Contains(got.Why, tc.wantWhy) {
				t.Errorf("NodeFenced = %+v, want fenced=%v since %v, why containing %q", got, tc.want, wantSince, tc.wantWhy)
			}
			deadline, ok := FenceDeadline(tc.ev, margin)
			if ok != (tc.want || tc.now.Before(deadline)) || (ok && tc.now.Before(deadline) == tc.want) {
				t.Errorf("FenceDeadline = %v, %v; disagrees with NodeFenced at %v", deadline, ok, tc.now)
			}
		})
	}
}

func TestAgentAlive(t *testing.T) {
	heard := time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC)
	deleting := agentPod("n1", corev1.ConditionTrue, "", heard)
	deleting.DeletionTimestamp = &metav1.Time{Time: heard}
	pending := agentPod("n1", corev1.ConditionFalse, "ContainersNotReady", heard)
	pending.Status.Phase = corev1.PodPending
	cases := []struct {
		name string
		pod  *corev1.Pod
		want bool
	}{
		{"ready", agentPod("n1", corev1.ConditionTrue, "", heard.Add(-time.Hour)), true},
		{"marked not ready after the kubelet went silent", agentPod("n1", corev1.ConditionFalse, "", heard.Add(41*time.Second)), true},
		{"marked at the very renewal", agentPod("n1", corev1.ConditionFalse, "", heard), true},
		{"not ready without reason before the last renewal", agentPod("n1", corev1.ConditionFalse, "", heard.Add(-time.Second)), false},
		{"not ready by the kubelet", agentPod("n1", corev1.ConditionFalse, "ContainersNotReady", heard.Add(time.Minute)), false},
		{"no Ready condition", agentPod("n1", "", "", heard), false},
		{"unknown", agentPod("n1", corev1.ConditionUnknown, "", heard), false},
		{"other node", agentPod("n2", corev1.ConditionTrue, "", heard), false},
		{"being deleted", deleting, false},
		{"pending", pending, false},
		{"missing", nil, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, why := AgentAlive(tc.pod, "n1", heard)
			if got != tc.want || (got == (why != "")) {
				t.Errorf("AgentAlive = %v, %q; want %v and a reason only when not alive", got, why, tc.want)
			}
		})
	}
}

func TestAgentPodName(t *testing.T) {
	for v, want := range map[string]string{
		"coroner-system/coroner-agent-x7k2p": "coroner-system/coroner-agent-x7k2p",
		"":                                   "",
		"coroner-agent-x7k2p":                "",
		"/coroner-agent-x7k2p":               "",
		"coroner-system/":                    "",
		"a/b/c":                              "",
	} {
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{AnnotationAgentPod: v}}}
		got, ok := AgentPodName(l)
		if ok != (want != "") || (ok && got.String() != want) {
			t.Errorf("AgentPodName(%q) = %v, %v; want %q", v, got, ok, want)
		}
	}
	if _, ok := AgentPodName(nil); ok {
		t.Error("AgentPodName(nil) is ok")
	}
}
