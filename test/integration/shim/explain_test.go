package shim_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/cmd/coronerctl/explain"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/controller"
	"github.com/coroner-dev/coroner/shim/metrics"
	"github.com/coroner-dev/coroner/test/wrappers"
)

// TestExplainThousandPods (issue 21): a Job of real size, 1,000 indexes, whose story has
// every kind of end: 100 counted failures (exit 1) retried, 50 ignored disruptions
// replaced, 700 successes, 10 FailIndex exits that exceed maxFailedIndexes and fail the
// Job, and the 140 pods still running then deleted by the shim; afterwards the failed pods
// are deleted, as PodGC would. coronerctl explain must tell every one of the 1,150 pods,
// with its cause and the decision, although most are gone and client-go's event correlator
// let through only a few dozen of the Job's Events. The cost of the record is logged.
func TestExplainThousandPods(t *testing.T) {
	if testing.Short() {
		t.Skip("a 1,000-pod Job")
	}
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	f := newFixture(t, controller.Config{Metrics: m, Workers: 5})
	const n = 1000
	job := f.createJob(wrappers.MakeJob("big", f.ns).Indexed().Completions(n).Parallelism(n).
		BackoffLimitPerIndex(1).MaxFailedIndexes(9).PodFailurePolicy(
		wrappers.OnPodCondition(batchv1.PodFailurePolicyActionIgnore, corev1.DisruptionTarget),
		wrappers.OnExitCodes(batchv1.PodFailurePolicyActionFailIndex, batchv1.PodFailurePolicyOnExitCodesOpIn, 42).InContainer("main"),
	))
	start := time.Now()
	first := f.waitActive(job, n, 2*time.Minute)
	t.Logf("%d pods active after %v", n, time.Since(start).Round(time.Millisecond))
	byIndex := map[int]*corev1.Pod{}
	for _, p := range first {
		byIndex[podIndex(p)] = p
	}

	// The kubelet's moves, 8 at a time.
	each := func(from, to int, act func(p *corev1.Pod)) {
		var wg sync.WaitGroup
		sem := make(chan struct{}, 8)
		for ix := from; ix < to; ix++ {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer func() { <-sem; wg.Done() }()
				act(byIndex[ix])
			}()
		}
		wg.Wait()
	}
	each(0, 100, func(p *corev1.Pod) { f.failPod(p, 1) })
	each(100, 150, func(p *corev1.Pod) { f.failPod(p, 137, disruption(conditions.ReasonPreemptionByScheduler)) })
	each(150, 850, func(p *corev1.Pod) { f.succeedPod(p) })

	// Indexes 0-149 are replaced (per-index backoff: fastBackoff); the replacements succeed.
	var replacements []*corev1.Pod
	f.waitJob(job, 2*time.Minute, "150 replacements", func(_ *batchv1.Job, pods []*corev1.Pod) bool {
		replacements = replacements[:0]
		for _, p := range activePods(pods) {
			if ix := podIndex(p); ix < 150 && p.UID != byIndex[ix].UID {
				replacements = append(replacements, p)
			}
		}
		return len(replacements) == 150
	})
	for _, p := range replacements {
		byIndex[podIndex(p)] = p
	}
	each(0, 150, func(p *corev1.Pod) { f.succeedPod(p) })
	f.waitJob(job, 2*time.Minute, "850 succeeded, 100 failed, 150 active", func(j *batchv1.Job, _ []*corev1.Pod) bool {
		return j.Status.Succeeded == 850 && j.Status.Failed == 100 && j.Status.Active == 150
	})

	// Ten FailIndex exits: one more failed index than maxFailedIndexes allows.
	each(850, 860, func(p *corev1.Pod) { f.failPod(p, 42) })
	done := f.waitFinished(job, batchv1.JobFailed, 2*time.Minute)
	if c := findCondition(done.Status.Conditions, batchv1.JobFailed); c == nil || c.Reason != batchv1.JobReasonMaxFailedIndexesExceeded {
		t.Fatalf("Job failed with %+v, want MaxFailedIndexesExceeded", c)
	}
	if done.Status.Failed != 250 {
		t.Errorf("status.failed = %d, want 250: 100 exits, 10 FailIndex exits, 140 running pods deleted as the Job failed", done.Status.Failed)
	}
	// PodGC's part: the failed pods go.
	ctx := context.Background()
	for _, p := range f.mirror.podsOf(job) {
		if p.Status.Phase == corev1.PodFailed {
			if err := f.client.CoreV1().Pods(f.ns).Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	records := f.mirror.records(job)
	if len(records) != n+150 {
		t.Fatalf("%d pods seen, want %d", len(records), n+150)
	}
	waitFor(t, settle, "the failed pods gone", func() (bool, error) {
		list, err := f.client.CoreV1().Pods(f.ns).List(ctx, metav1.ListOptions{})
		return err == nil && len(list.Items) == 850, err
	}, func() string { return "" })

	took := time.Now()
	r, err := explain.JobReport(ctx, explain.Client{Interface: f.client, Dynamic: dynamic.NewForConfigOrDie(f.env.Config)}, f.ns, job.Name)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("explain read the Job in %v", time.Since(took).Round(time.Millisecond))

	// Every pod, once, with a cause; the gone ones as the shim recorded them.
	reports := map[string]explain.PodReport{}
	for _, p := range r.Pods {
		if _, twice := reports[p.Name]; twice {
			t.Errorf("pod %s told twice", p.Name)
		}
		reports[p.Name] = p
		if p.Cause == "" {
			t.Errorf("pod %s has no cause", p.Name)
		}
	}
	count := map[string]int{}
	for _, rec := range records {
		p := rec.first
		pr, ok := reports[p.Name]
		if !ok {
			t.Errorf("pod %s (index %d) is not explained", p.Name, podIndex(p))
			continue
		}
		ix := podIndex(p)
		var kind, wantCause, wantRule, wantAction string
		wantState := explain.StateDeleted
		switch {
		case ix < 100 && p.UID == first[indexOfPod(first, ix)].UID:
			kind, wantCause, wantRule, wantAction = "exit 1", "container main exited 1", "no rule matched", fmt.Sprintf("index %d failure 1 of 2 allowed", ix)
		case ix < 150 && p.UID == first[indexOfPod(first, ix)].UID:
			kind, wantCause, wantRule, wantAction = "disrupted", "disrupted (DisruptionTarget PreemptionByScheduler); container main exited 137", "rule 0 (Ignore)", "not counted, the pod will be replaced"
		case ix < 850:
			kind, wantState, wantCause = "succeeded", explain.StateSucceeded, "every container exited 0"
		case ix < 860:
			kind, wantCause, wantRule, wantAction = "FailIndex", "container main exited 42", "rule 1 (FailIndex)", fmt.Sprintf("index %d failed", ix)
		default:
			kind, wantCause, wantRule, wantAction = "deleted", "deleted by coroner-shim (job failed: MaxFailedIndexesExceeded)", "no rule matched", "counted as failed: the Job failed (MaxFailedIndexesExceeded) while it ran"
		}
		count[kind]++
		if pr.State != wantState || pr.Cause != wantCause || pr.Rule != wantRule || pr.Action != wantAction {
			t.Errorf("%s pod %s (index %d): state %s, cause %q, rule %q, action %q; want %s, %q, %q, %q",
				kind, p.Name, ix, pr.State, pr.Cause, pr.Rule, pr.Action, wantState, wantCause, wantRule, wantAction)
		}
		if pr.Index == nil || *pr.Index != ix {
			t.Errorf("pod %s: index %v, want %d", p.Name, pr.Index, ix)
		}
	}
	want := map[string]int{"exit 1": 100, "disrupted": 50, "succeeded": 850, "FailIndex": 10, "deleted": 140}
	for k, v := range want {
		if count[k] != v {
			t.Errorf("%d %s pods, want %d", count[k], k, v)
		}
	}
	for _, n := range r.Notes {
		if strings.Contains(n, "record") || strings.Contains(n, "status.failed") {
			t.Errorf("explain's note %q: every pod is told", n)
		}
	}
	// Every pod that left the Job but the successes is recorded.
	if !r.Record.Found || r.Record.Entries != 300 || len(r.Record.Dropped) != 0 {
		t.Errorf("record: %+v, want 300 entries (100 exits, 50 disruptions, 10 FailIndex, 140 deleted), none dropped", r.Record)
	}

	// What the record cost: API writes and request bytes, per pod that left the Job.
	u, err := dynamic.NewForConfigOrDie(f.env.Config).Resource(v1alpha1.GroupVersionResource).Namespace(f.ns).Get(ctx, job.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	stored, _ := json.Marshal(u.Object)
	writes := testutil.ToFloat64(m.JobRecordWrites.WithLabelValues("create", metrics.ResultSuccess)) + testutil.ToFloat64(m.JobRecordWrites.WithLabelValues("patch", metrics.ResultSuccess))
	conflicts := testutil.ToFloat64(m.JobRecordWrites.WithLabelValues("patch", "conflict"))
	bytes := testutil.ToFloat64(m.JobRecordBytes.WithLabelValues("create")) + testutil.ToFloat64(m.JobRecordBytes.WithLabelValues("patch"))
	var entries float64
	for _, o := range []v1alpha1.Outcome{v1alpha1.OutcomeSucceeded, v1alpha1.OutcomeFailed, v1alpha1.OutcomeIgnored, v1alpha1.OutcomeDeleted} {
		entries += testutil.ToFloat64(m.JobRecordEntries.WithLabelValues(string(o)))
	}
	pods := float64(len(records))
	t.Logf("record cost: %d pods, %.0f entries written in %.0f writes (%.0f conflicts): %.3f writes and %.0f request bytes per pod; the stored record %d bytes (%d per entry)",
		len(records), entries, writes, conflicts, writes/pods, bytes/pods, len(stored), len(stored)/max(r.Record.Entries, 1))
	if conflicts > 0 {
		// One shim writes the record: a patch refused for its resourceVersion means the
		// copy it kept after its last patch is not what the server stores.
		t.Errorf("%.0f of the record's patches refused as conflicts with a single writer", conflicts)
	}
	if writes/pods > 0.5 {
		t.Errorf("%.2f record writes per pod: the record is written per pod, not per sync", writes/pods)
	}
	if bytes/pods > 1024 {
		t.Errorf("%.0f request bytes per pod: the writes send more than the new entries", bytes/pods)
	}
	if perEntry := len(stored) / max(r.Record.Entries, 1); perEntry*controller.MaxRecordMaxPods > 1400<<10 {
		t.Errorf("%d stored bytes per entry: a record of %d entries would near etcd's 1.5 MiB", perEntry, controller.MaxRecordMaxPods)
	}
	if !strings.Contains(string(stored), `"jobUID":"`+string(job.UID)+`"`) {
		t.Errorf("the stored record is not this Job's")
	}
}

// indexOfPod is the position in pods (the first round, one per index) of index ix.
func indexOfPod(pods []*corev1.Pod, ix int) int {
	for i, p := range pods {
		if podIndex(p) == ix {
			return i
		}
	}
	return -1
}
