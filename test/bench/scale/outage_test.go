package main

import (
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func outagePod(ns, job, index, uid, node string, phase corev1.PodPhase, deleting bool) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: job + "-" + index + "-" + uid, UID: types.UID(uid),
			Labels:      map[string]string{batchv1.JobNameLabel: job},
			Annotations: map[string]string{batchv1.JobCompletionIndexAnnotation: index}},
		Spec:   corev1.PodSpec{NodeName: node},
		Status: corev1.PodStatus{Phase: phase},
	}
	if deleting {
		p.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	}
	return p
}

// TestOutageState checks the outage's bookkeeping from a history of pod and node updates:
// which pods were lost, which replacement counts, and what counts as twice and spurious.
func TestOutageState(t *testing.T) {
	st := newOutageState()
	st.dark["dark-1"] = true
	const c, b, k = "outage-coroner", "outage-builtin", "outage-kueue"
	// Before the outage: five indexes Running, three of them on the dark node; a Pending pod
	// is nobody's slot yet.
	for _, p := range []*corev1.Pod{
		outagePod(c, "j", "0", "c0", "dark-1", corev1.PodRunning, false),
		outagePod(c, "j", "1", "c1", "live-1", corev1.PodRunning, false),
		outagePod(b, "j", "0", "b0", "dark-1", corev1.PodRunning, false),
		outagePod(b, "j", "1", "b1", "live-1", corev1.PodRunning, false),
		outagePod(b, "j", "2", "b2", "live-1", corev1.PodPending, false),
		outagePod(k, "j", "0", "k0", "dark-1", corev1.PodRunning, false),
		outagePod("other", "j", "0", "o0", "dark-1", corev1.PodRunning, false),
	} {
		st.pod(p)
	}
	if st.running[groupCoroner] != 2 || st.running[groupBuiltin] != 2 || st.running[groupKueue] != 1 {
		t.Fatalf("running before the outage = %v, want 2 coroner, 2 built-in and 1 kueue", st.running)
	}
	t0 := time.Now()
	st.t0 = t0
	st.node(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "dark-1"}, Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoSchedule}}}})
	st.node(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "live-1"}, Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoSchedule}}}})
	// After: coroner's lost index 0 gets one replacement, Pending then Running; the old
	// pod's updates change nothing. The built-in's lost index 0 gets a replacement that is
	// still Pending, and its terminating old pod stays. Built-in index 1, not lost, gets a
	// new pod anyway: spurious.
	st.pod(outagePod(c, "j", "0", "c0", "dark-1", corev1.PodRunning, true))
	st.pod(outagePod(c, "j", "0", "c0b", "live-2", corev1.PodPending, false))
	st.pod(outagePod(c, "j", "0", "c0b", "live-2", corev1.PodRunning, false))
	st.pod(outagePod(b, "j", "0", "b0", "dark-1", corev1.PodRunning, true))
	st.pod(outagePod(b, "j", "0", "b0b", "live-2", corev1.PodPending, false))
	st.pod(outagePod(b, "j", "1", "b1b", "live-2", corev1.PodRunning, false))
	// Kueue's: the taint eviction's NoExecute taint, then the lost pod deleted, failed
	// and replaced.
	st.node(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "dark-1"}, Spec: corev1.NodeSpec{Taints: []corev1.Taint{
		{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoSchedule}, {Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoExecute}}}})
	st.pod(outagePod(k, "j", "0", "k0", "dark-1", corev1.PodFailed, true))
	st.pod(outagePod(k, "j", "0", "k0b", "live-2", corev1.PodRunning, false))

	if got := st.replaced(); got[groupCoroner] != 1 || got[groupBuiltin] != 0 || got[groupKueue] != 1 {
		t.Errorf("replaced = %v, want coroner 1, built-in 0, kueue 1", got)
	}
	if first, last, noExec := st.taintTimes(); first < 0 || last < first || noExec != 1 || len(st.taints) != 1 {
		t.Errorf("taints: first %v last %v noExecute %d, %d nodes; want the dark node alone, NoSchedule then NoExecute", first, last, noExec, len(st.taints))
	}
	gc := st.group(groupCoroner, 1)
	if gc.Replaced != 1 || gc.WithinGoal != 1 || gc.Twice != 0 || gc.Spurious != 0 || gc.FromTaint[2] > 1 {
		t.Errorf("coroner = %+v, want 1 replaced within the goal, none twice or spurious", gc)
	}
	if gc.FromNoExecute[2] > 0 {
		t.Errorf("coroner from NoExecute = %v, want negative: replaced before the NoExecute taint", gc.FromNoExecute)
	}
	gb := st.group(groupBuiltin, 1)
	if gb.Replaced != 0 || gb.Twice != 0 || gb.Spurious != 1 {
		t.Errorf("built-in = %+v, want 0 replaced, 1 spurious", gb)
	}
	gk := st.group(groupKueue, 1)
	if gk.Replaced != 1 || gk.Twice != 0 || gk.Spurious != 0 || gk.FromNoExecute[2] < 0 || gk.FromNoExecute[2] > gk.FromTaint[2] || gk.LostNodes != 1 || gk.OnNoExecute != 1 {
		t.Errorf("kueue = %+v, want 1 replaced after its NoExecute taint, none twice or spurious", gk)
	}
	if !allReplaced(st.replaced(), map[string]int{groupCoroner: 1, groupKueue: 1}) || allReplaced(st.replaced(), map[string]int{groupCoroner: 1, groupBuiltin: 1}) {
		t.Errorf("allReplaced: want true for coroner and kueue, false with the built-in's lost pod")
	}
	// A second new pod for coroner's lost index counts it twice.
	st.pod(outagePod(c, "j", "0", "c0c", "live-3", corev1.PodPending, false))
	if gc := st.group(groupCoroner, 1); gc.Twice != 1 {
		t.Errorf("coroner after a second new pod: twice = %d, want 1", gc.Twice)
	}
}

func TestWritesOnly(t *testing.T) {
	all, err := parseRequests(`apiserver_request_total{code="200",resource="pods",subresource="",verb="LIST"} 7
apiserver_request_total{code="201",resource="pods",subresource="",verb="POST"} 3
apiserver_request_total{code="200",resource="pods",subresource="status",verb="PATCH"} 2
apiserver_request_total{code="0",resource="pods",subresource="",verb="WATCH"} 4
`)
	if err != nil {
		t.Fatal(err)
	}
	if total(all) != 16 {
		t.Errorf("every request: %v, want 16 in all", all)
	}
	w := writesOnly(all)
	if len(w) != 2 || w["POST pods"] != 3 || w["PATCH pods/status"] != 2 {
		t.Errorf("writes = %v, want POST pods 3 and PATCH pods/status 2", w)
	}
}
