package metrics

import (
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/coroner-dev/coroner/shim/observe"
)

// samples returns every counter and gauge sample of reg as "name{l1=v1,...} value",
// except coroner_leader's (TestLeader checks it).
func samples(t *testing.T, reg *prometheus.Registry) []string {
	t.Helper()
	return allSamples(t, reg, append([]string{"coroner_leader"}, quarantineScalars...)...)
}

// quarantineScalars are the node quarantine's metrics without labels, served (at 0) by
// every leader; samples leaves them out, TestNodeBlame checks them.
var quarantineScalars = []string{"coroner_nodes_quarantined", "coroner_node_quarantines_spared_total", "coroner_node_quarantines_lifted_total"}

// allSamples is samples with only the metrics named in skip left out.
func allSamples(t *testing.T, reg *prometheus.Registry, skip ...string) []string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		if slices.Contains(skip, mf.GetName()) {
			continue
		}
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			var v float64
			switch {
			case m.GetCounter() != nil:
				v = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				v = m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				v = float64(m.GetHistogram().GetSampleCount())
			}
			out = append(out, mf.GetName()+"{"+strings.Join(labels, ",")+"} "+strconv.FormatFloat(v, 'g', -1, 64))
		}
	}
	sort.Strings(out)
	return out
}

func TestRecord(t *testing.T) {
	cases := []struct {
		name         string
		obs          observe.Observations
		mode         string
		backoffLimit string
		want         []string
	}{
		{
			name: "nothing observed",
			mode: "NonIndexed", backoffLimit: BackoffLimitGlobal,
			want: []string{"coroner_managed_jobs{} 0"},
		},
		{
			name: "failures by action, finished pods",
			obs: observe.Observations{
				PodFailures:  map[string]int{"Ignore": 2, "Count": 1, "None": 0},
				PodsFinished: map[string]int{"failed": 1, "succeeded": 3},
			},
			mode: "NonIndexed", backoffLimit: BackoffLimitGlobal,
			want: []string{
				"coroner_job_pods_finished_total{completion_mode=NonIndexed,result=failed} 1",
				"coroner_job_pods_finished_total{completion_mode=NonIndexed,result=succeeded} 3",
				"coroner_managed_jobs{} 0",
				"coroner_pod_failures_handled_by_failure_policy_total{action=Count} 1",
				"coroner_pod_failures_handled_by_failure_policy_total{action=Ignore} 2",
			},
		},
		{
			name: "indexes finished, Job failed",
			obs: observe.Observations{
				PodFailures:     map[string]int{"FailIndex": 1},
				FinishedIndexes: map[string]int{"failed": 1, "succeeded": 2},
				JobFinished:     &observe.JobFinished{Reason: "FailedIndexes"},
			},
			mode: "Indexed", backoffLimit: BackoffLimitPerIndex,
			want: []string{
				"coroner_job_finished_indexes_total{backoff_limit=perIndex,status=failed} 1",
				"coroner_job_finished_indexes_total{backoff_limit=perIndex,status=succeeded} 2",
				"coroner_jobs_finished_total{completion_mode=Indexed,reason=FailedIndexes,result=failed} 1",
				"coroner_managed_jobs{} 0",
				"coroner_pod_failures_handled_by_failure_policy_total{action=FailIndex} 1",
			},
		},
		{
			name: "device verdicts",
			obs: observe.Observations{
				PodFailures:    map[string]int{"Ignore": 1, "None": 2},
				DeviceFailures: map[observe.DeviceFailure]int{{Resource: "nvidia.com/gpu", Action: "Ignore"}: 1},
				DeviceVerdicts: []observe.DeviceVerdict{{Verdict: observe.VerdictDeviceFailure, Seconds: 0.4}, {Verdict: observe.VerdictMissing, Seconds: 31}, {Verdict: observe.VerdictNoDeviceFailure, Seconds: 11}},
			},
			mode: "Indexed", backoffLimit: BackoffLimitPerIndex,
			want: []string{
				"coroner_job_device_failures_total{action=Ignore,resource=nvidia.com/gpu} 1",
				"coroner_job_device_verdict_wait_seconds{verdict=DeviceFailure} 1",
				"coroner_job_device_verdict_wait_seconds{verdict=Missing} 1",
				"coroner_job_device_verdict_wait_seconds{verdict=NoDeviceFailure} 1",
				"coroner_managed_jobs{} 0",
				"coroner_pod_failures_handled_by_failure_policy_total{action=Ignore} 1",
				"coroner_pod_failures_handled_by_failure_policy_total{action=None} 2",
			},
		},
		{
			name: "Job completed",
			obs:  observe.Observations{JobFinished: &observe.JobFinished{Succeeded: true, Reason: "CompletionsReached"}},
			mode: "NonIndexed", backoffLimit: BackoffLimitGlobal,
			want: []string{
				"coroner_jobs_finished_total{completion_mode=NonIndexed,reason=CompletionsReached,result=succeeded} 1",
				"coroner_managed_jobs{} 0",
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			m := New(reg)
			m.Record(tc.obs, tc.mode, tc.backoffLimit)
			if diff := cmp.Diff(tc.want, samples(t, reg)); diff != "" {
				t.Errorf("samples (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPodsCreatedAndSyncDuration(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	m.PodsCreated(observe.CreateNew, Succeeded, 3)
	m.PodsCreated(observe.CreateRecreateFailed, Failed, 1)
	m.PodsCreated(observe.CreateNew, Failed, 0)
	m.JobSyncDuration.WithLabelValues("Indexed", ResultSuccess, ActionPodsCreated).Observe(0.01)
	m.TerminatedPodsTrackingFinalizer.WithLabelValues(EventAdd).Inc()
	want := []string{
		"coroner_job_pods_creation_total{reason=new,status=succeeded} 3",
		"coroner_job_pods_creation_total{reason=recreate_failed,status=failed} 1",
		"coroner_job_sync_duration_seconds{action=pods_created,completion_mode=Indexed,result=success} 1",
		"coroner_managed_jobs{} 0",
		"coroner_terminated_pods_tracking_finalizer_total{event=add} 1",
	}
	if diff := cmp.Diff(want, samples(t, reg)); diff != "" {
		t.Errorf("samples (-want +got):\n%s", diff)
	}
}

// TestRegistries checks that metrics live on the registry they were given: two sets on
// two registries do not collide, and nothing lands on the default registry.
func TestRegistries(t *testing.T) {
	a, b := prometheus.NewRegistry(), prometheus.NewRegistry()
	New(a).ManagedJobs.Set(1)
	New(b).ManagedJobs.Set(2)
	if got := samples(t, a); !cmp.Equal(got, []string{"coroner_managed_jobs{} 1"}) {
		t.Errorf("registry a: %v", got)
	}
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), Namespace+"_") {
			t.Errorf("%s is on the default registry", mf.GetName())
		}
	}
	defer func() {
		if recover() == nil {
			t.Errorf("registering twice on one registry did not panic")
		}
	}()
	New(a)
}

// TestLeader checks that only the leader serves the Job metrics: a standby serves
// coroner_leader 0 and nothing else of coroner's, and what the Job metrics hold survives
// a standby period.
func TestLeader(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	m.ManagedJobs.Set(3)
	m.PodsCreated(observe.CreateNew, Succeeded, 2)
	leading := []string{
		"coroner_job_pods_creation_total{reason=new,status=succeeded} 2",
		"coroner_leader{} 1",
		"coroner_managed_jobs{} 3",
		"coroner_node_quarantines_lifted_total{} 0",
		"coroner_node_quarantines_spared_total{} 0",
		"coroner_nodes_quarantined{} 0",
	}
	for _, step := range []struct {
		name    string
		leading bool
		want    []string
	}{
		{name: "new: leads", leading: true, want: leading},
		{name: "standing by", leading: false, want: []string{"coroner_leader{} 0"}},
		{name: "leading again", leading: true, want: leading},
	} {
		if step.name != "new: leads" {
			m.SetLeader(step.leading)
		}
		if diff := cmp.Diff(step.want, allSamples(t, reg)); diff != "" {
			t.Errorf("%s: samples (-want +got):\n%s", step.name, diff)
		}
	}
	// The standby's registry still describes every metric: registering them again fails.
	m.SetLeader(false)
	defer func() {
		if recover() == nil {
			t.Errorf("registering the metrics twice on one registry did not panic while standing by")
		}
	}()
	New(reg)
}

func TestNilMetrics(t *testing.T) {
	var m *Metrics
	m.SetLeader(true)
	m.Record(observe.Observations{PodsFinished: map[string]int{"failed": 1}}, "NonIndexed", BackoffLimitGlobal)
	m.PodsCreated(observe.CreateNew, Succeeded, 1)
}

// TestNodeBlame checks the node quarantine's metrics: their labels, and that only the
// leader serves them, as the Job metrics.
func TestNodeBlame(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	m.NodeBlamedDeaths.WithLabelValues("node-a", "device").Inc()
	m.NodeBlamedDeaths.WithLabelValues("node-a", "node-oom").Add(2)
	m.NodesQuarantined.Set(1)
	m.NodeQuarantines.WithLabelValues("node-oom").Inc()
	m.NodeQuarantinesSpared.Inc()
	want := []string{
		"coroner_node_blamed_deaths_total{cause=device,node=node-a} 1",
		"coroner_node_blamed_deaths_total{cause=node-oom,node=node-a} 2",
		"coroner_node_quarantines_lifted_total{} 0",
		"coroner_node_quarantines_spared_total{} 1",
		"coroner_node_quarantines_total{cause=node-oom} 1",
		"coroner_nodes_quarantined{} 1",
	}
	if diff := cmp.Diff(want, allSamples(t, reg, "coroner_leader", "coroner_managed_jobs")); diff != "" {
		t.Errorf("samples (-want +got):\n%s", diff)
	}
	m.SetLeader(false)
	if got := allSamples(t, reg, "coroner_leader"); len(got) != 0 {
		t.Errorf("a standby serves %v", got)
	}
}
