package shim_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	ctlquarantine "github.com/coroner-dev/coroner/cmd/coronerctl/quarantine"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim"
	"github.com/coroner-dev/coroner/shim/controller"
	"github.com/coroner-dev/coroner/shim/metrics"
	"github.com/coroner-dev/coroner/shim/quarantine"
	"github.com/coroner-dev/coroner/test/wrappers"
)

// TestQuarantine (issue 38, part 2): with the quarantine on (2 deaths within a minute, at
// most 1 node, lifted after 8s), two node OOMs on node a taint it
// coroner.dev/quarantined=node-oom:NoSchedule with a NodeQuarantined Event naming the
// pods, and leave its running pod alone; two on node b then spare b (one node is the
// most), with a QuarantineSpared Event naming a; a is lifted 8s after its last death
// (NodeQuarantineLifted), which frees the place b takes; b lifted by hand (as coronerctl
// quarantine lift) is not tainted again by the deaths it was quarantined for. The deaths
// are counted by node and cause.
func TestQuarantine(t *testing.T) {
	if builtinTarget {
		t.Skip("the quarantine is coroner's own")
	}
	// Not parallel: the most quarantined at once is over every node of the API server, and
	// a quarantine controller lifts any taint of its key, so two of them must not run at
	// once (the other tests' shims run theirs off).
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	const liftAfter = 8 * time.Second
	f := newShimFixture(t, shim.Config{
		Jobs: controller.Config{Metrics: m},
		Quarantine: quarantine.Config{Enabled: true, Options: quarantine.Options{
			Deaths: 2, Window: time.Minute, For: liftAfter, Max: quarantine.Max{N: 1},
		}},
	})
	a, b := f.node("qa"), f.node("qb")
	job := f.createJob(wrappers.MakeJob("quarantine", f.ns).Parallelism(5).Completions(5).BackoffLimit(0).
		PodFailurePolicy(wrappers.OnPodCondition(batchv1.PodFailurePolicyActionIgnore, corev1.DisruptionTarget)))
	pods := f.waitActive(job, 5, settle)
	for i, p := range pods {
		node := a
		if i >= 3 {
			node = b
		}
		f.bindPod(p, node)
		f.runPod(p, true)
	}
	nodeOOM := disruption(conditions.ReasonNodeOOMKill)

	// Two node OOMs on a: quarantined.
	f.failPod(pods[0], 137, nodeOOM)
	f.failPod(pods[1], 137, nodeOOM)
	f.waitTaint(a, "node-oom")
	f.waitNodeEvent(a, corev1.EventTypeWarning, conditions.ReasonNodeQuarantined,
		"2 pod deaths blamed on this node within 1m0s", f.ns+"/"+pods[0].Name+" (node-oom, ", f.ns+"/"+pods[1].Name+" (node-oom, ",
		"coroner.dev/quarantined=node-oom:NoSchedule")
	if got := testutil.ToFloat64(m.NodeBlamedDeaths.WithLabelValues(a, "node-oom")); got != 2 {
		t.Errorf("coroner_node_blamed_deaths_total{node=%s,cause=node-oom} = %v, want 2", a, got)
	}
	// The pod still running on a stays: the taint is NoSchedule.
	running, err := f.client.CoreV1().Pods(f.ns).Get(context.Background(), pods[2].Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if running.DeletionTimestamp != nil || running.Status.Phase != corev1.PodRunning {
		t.Errorf("the running pod on the quarantined node was disturbed: phase %s, deletion %v", running.Status.Phase, running.DeletionTimestamp)
	}

	// Two on b: spared, a holds the one place.
	f.failPod(pods[3], 137, nodeOOM)
	f.failPod(pods[4], 137, nodeOOM)
	f.waitNodeEvent(b, corev1.EventTypeWarning, conditions.ReasonQuarantineSpared,
		"Not quarantined though 2 pod deaths were blamed on node "+b, "nodes quarantined already: 1 ("+a+"), the most --quarantine-max=1 allows")
	if n := f.taint(b); n != nil {
		t.Errorf("node %s tainted %v though the most nodes were quarantined", b, n)
	}
	if got := testutil.ToFloat64(m.NodeQuarantinesSpared); got != 1 {
		t.Errorf("coroner_node_quarantines_spared_total = %v, want 1", got)
	}

	// a lifted after liftAfter without a death; b takes its place.
	f.waitNoTaint(a, liftAfter+settle)
	f.waitNodeEvent(a, corev1.EventTypeNormal, conditions.ReasonNodeQuarantineLifted, "no pod death blamed on this node for 8s")
	f.waitTaint(b, "node-oom")
	if got := testutil.ToFloat64(m.NodeQuarantines.WithLabelValues("node-oom")); got != 2 {
		t.Errorf("coroner_node_quarantines_total = %v, want 2", got)
	}

	// b lifted by hand: not tainted again by the deaths it was quarantined for, still in
	// the window.
	// As coronerctl quarantine list and lift do it.
	rows, err := ctlquarantine.List(context.Background(), f.client)
	if err != nil {
		t.Fatal(err)
	}
	if i := slices.IndexFunc(rows, func(r ctlquarantine.Row) bool { return r.Node == b }); i < 0 || rows[i].Cause != "node-oom" || rows[i].Schedules != "no" || rows[i].Since.IsZero() {
		t.Errorf("coronerctl quarantine list: %+v, want %s quarantined for node-oom", rows, b)
	}
	var out strings.Builder
	if err := ctlquarantine.Lift(context.Background(), f.client, &out, b); err != nil {
		t.Fatal(err)
	}
	t.Logf("coronerctl quarantine lift %s: %s", b, out.String())
	deadline := time.Now().Add(4 * time.Second)
	for time.Now().Before(deadline) {
		if tt := f.taint(b); tt != nil {
			t.Fatalf("node %s tainted again after a hand lift: %v", b, tt)
		}
		time.Sleep(pollInterval)
	}
	if got := testutil.ToFloat64(m.NodeQuarantinesLifted); got != 1 {
		t.Errorf("coroner_node_quarantines_lifted_total = %v, want 1 (a hand lift is not the shim's)", got)
	}
	if got := testutil.ToFloat64(m.NodesQuarantined); got != 0 {
		t.Errorf("coroner_nodes_quarantined = %v, want 0", got)
	}
}

// taint returns the node's quarantine taint, nil when it has none.
func (f *fixture) taint(node string) *corev1.Taint {
	f.t.Helper()
	n, err := f.client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	return quarantine.TaintOf(n)
}

// waitTaint waits for the node's quarantine taint with the cause and effect NoSchedule.
func (f *fixture) waitTaint(node, cause string) {
	f.t.Helper()
	var last *corev1.Taint
	waitFor(f.t, settle, fmt.Sprintf("node %s tainted %s=%s:NoSchedule", node, conditions.QuarantineTaintKey, cause), func() (bool, error) {
		last = f.taint(node)
		return last != nil && last.Value == cause && last.Effect == corev1.TaintEffectNoSchedule && last.TimeAdded != nil, nil
	}, func() string { return fmt.Sprintf("taint %+v", last) })
}

// waitNoTaint waits for the node's quarantine taint to go.
func (f *fixture) waitNoTaint(node string, timeout time.Duration) {
	f.t.Helper()
	var last *corev1.Taint
	waitFor(f.t, timeout, fmt.Sprintf("node %s without the taint %s", node, conditions.QuarantineTaintKey), func() (bool, error) {
		last = f.taint(node)
		return last == nil, nil
	}, func() string { return fmt.Sprintf("taint %+v", last) })
}

// waitNodeEvent waits for an Event of the type and reason on the node whose message holds
// every part.
func (f *fixture) waitNodeEvent(node, typ, reason string, parts ...string) {
	f.t.Helper()
	var seen []string
	sel := fields.Set{"involvedObject.kind": "Node", "involvedObject.name": node}.AsSelector().String()
	waitFor(f.t, settle, fmt.Sprintf("a %s Event %s on node %s", typ, reason, node), func() (bool, error) {
		list, err := f.client.CoreV1().Events(metav1.NamespaceAll).List(context.Background(), metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			return false, err
		}
		seen = seen[:0]
		for _, e := range list.Items {
			seen = append(seen, fmt.Sprintf("%s %s %q", e.Type, e.Reason, e.Message))
			if e.Type != typ || e.Reason != reason {
				continue
			}
			all := true
			for _, p := range parts {
				all = all && strings.Contains(e.Message, p)
			}
			if all {
				return true, nil
			}
		}
		return false, nil
	}, func() string { return "Events on the node:\n  " + strings.Join(seen, "\n  ") })
}

// TestQuarantineAfterRestart: the deaths are in the shim's memory, so a node found
// quarantined at the start (by an earlier leader, here added two hours ago) keeps its taint
// --quarantine-for from the start, not from the taint's timeAdded: a restart never lifts
// early. Then it is lifted.
func TestQuarantineAfterRestart(t *testing.T) {
	if builtinTarget {
		t.Skip("the quarantine is coroner's own")
	}
	// Not parallel, as TestQuarantine.
	const liftAfter = 6 * time.Second
	f := newShimFixture(t, shim.Config{
		Quarantine: quarantine.Config{Enabled: true, Options: quarantine.Options{Deaths: 2, Window: time.Minute, For: liftAfter, Max: quarantine.Max{N: 1}}},
	})
	f.stopController()
	long := quarantine.Taint("device", time.Now().Add(-2*time.Hour))
	a := f.node("qr", long)
	started := time.Now()
	f.startController()
	f.waitNoTaint(a, liftAfter+settle)
	if took := time.Since(started); took < liftAfter-time.Second {
		t.Errorf("the taint added 2h ago was lifted %v after the start, before --quarantine-for (%v) from it", took, liftAfter)
	} else {
		t.Logf("lifted %v after the start", took.Round(time.Millisecond))
	}
	f.waitNodeEvent(a, corev1.EventTypeNormal, conditions.ReasonNodeQuarantineLifted, "no pod death blamed on this node for 6s")
}
