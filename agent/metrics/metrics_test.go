package metrics

import (
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
)

func names(t *testing.T, reg *prometheus.Registry) []string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		out = append(out, mf.GetName())
	}
	sort.Strings(out)
	return out
}

func TestNames(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	m.Stamped("LimitOOM", "MemoryLimitExceeded", 0.2)
	m.Observed("LimitOOM", 0.05)
	m.Written("LimitOOM", 0.15)
	m.Exit("")
	m.Dropped(DroppedOtherNode)
	m.DeviceVerdict("nvidia.com/gpu", "driver")
	m.DeviceStamped("driver", 0.1)
	want := []string{
		"coroner_agent_container_exits_total",
		"coroner_agent_detection_latency_seconds",
		"coroner_agent_device_verdict_latency_seconds",
		"coroner_agent_device_verdicts_total",
		"coroner_agent_dropped_events_total",
		"coroner_agent_fence_stopped_containers_total",
		"coroner_agent_fenced",
		"coroner_agent_ignored_containers_total",
		"coroner_agent_observe_latency_seconds",
		"coroner_agent_pod_write_errors_total",
		"coroner_agent_pod_writes_total",
		"coroner_agent_runtime_connected",
		"coroner_agent_stamps_total",
		"coroner_agent_unknown_oom_total",
		"coroner_agent_write_latency_seconds",
	}
	if diff := cmp.Diff(want, names(t, reg)); diff != "" {
		t.Errorf("metric names (-want +got):\n%s", diff)
	}
	for _, n := range names(t, reg) {
		if !strings.HasPrefix(n, "coroner_agent_") {
			t.Errorf("%s lacks the prefix", n)
		}
	}
}

func TestRecording(t *testing.T) {
	m := New(prometheus.NewRegistry())
	m.Stamped("LimitOOM", "MemoryLimitExceeded", 0.2)
	m.Stamped("LimitOOM", "MemoryLimitExceeded", -1) // clock skew: recorded as 0
	m.Observed("ExitHistory", 0.01)
	m.Written("ExitHistory", 0.12)
	m.Written("LimitOOM", 0.3)
	m.Exit("")
	m.Exit("NodeOOM")
	m.Unknown()
	m.WriteFailed()
	m.SetRuntimeConnected(true)
	m.AddIgnored(3)
	m.AddIgnored(0)
	m.SetFenced(true)
	m.SetFenced(false)
	m.SetFenced(true)
	m.FenceStopped()
	m.FenceStopped()
	for _, tc := range []struct {
		name string
		c    prometheus.Collector
		want float64
	}{
		{"stamps", m.Stamps.WithLabelValues("LimitOOM", "MemoryLimitExceeded"), 2},
		{"latency samples", m.DetectionLatency, 2},
		{"observe samples", m.ObserveLatency, 1},
		{"write samples", m.WriteLatency, 2},
		{"ExitHistory write samples", m.WriteLatency.WithLabelValues("ExitHistory").(prometheus.Histogram), 1},
		{"NotOOM exits", m.ContainerExits.WithLabelValues(VerdictNotOOM), 1},
		{"all exits", m.ContainerExits, 2},
		{"unknown", m.UnknownOOM, 1},
		{"write errors", m.WriteErrors, 1},
		{"connected", m.RuntimeConnected, 1},
		{"ignored", m.IgnoredContainers, 3},
		{"fenced", m.Fenced, 1},
		{"fence stops", m.FenceStoppedContainers, 2},
	} {
		if got := Value(tc.c); got != tc.want {
			t.Errorf("%s = %v, want %v", tc.name, got, tc.want)
		}
	}
	var nilM *Metrics
	nilM.Stamped("x", "y", 1) // a nil *Metrics records nothing and does not panic
	nilM.Observed("x", 1)
	nilM.Written("x", 1)
	nilM.Exit("")
	nilM.SetRuntimeConnected(true)
	nilM.SetFenced(true)
	nilM.FenceStopped()
}

// TestLatencyBuckets: ascending, from 5 ms, with a bound at P2's 200 ms goal, up to the
// terminal phase's tens of seconds.
func TestLatencyBuckets(t *testing.T) {
	b := LatencyBuckets
	if !sort.Float64sAreSorted(b) || b[0] != 0.005 || b[len(b)-1] < 60 {
		t.Errorf("LatencyBuckets = %v: want ascending from 0.005 to at least 60", b)
	}
	if i := sort.SearchFloat64s(b, 0.2); i == len(b) || b[i] != 0.2 {
		t.Errorf("LatencyBuckets = %v: no bound at 0.2", b)
	}
}
