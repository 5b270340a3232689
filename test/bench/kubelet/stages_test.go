package main

import (
	"io"
	"math"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/coroner-dev/coroner/agent/metrics"
)

var inf = math.Inf(1)

// TestHistogramWindow: the storm's histogram is the end's less the start's, and its
// quantiles are interpolated linearly within the bucket that holds the rank.
func TestHistogramWindow(t *testing.T) {
	bounds := []float64{0.01, 0.05, 0.1, 0.2, inf}
	h := func(counts ...float64) histogram { return histogram{bounds: bounds, counts: counts} }
	cases := []struct {
		name          string
		before, after histogram
		wantErr       bool
		wantCount     float64
		wantSum       float64
		// want maps q to the estimate; absent when the histogram is empty.
		want map[float64]float64
	}{{
		// In the window: 0 up to 10 ms, 20 in (10, 50], 60 in (50, 100], 20 in (100, 200].
		name:   "samples before the window are left out",
		before: histogram{bounds: bounds, counts: []float64{2, 4, 4, 5, 5}, sum: 0.1},
		after:  histogram{bounds: bounds, counts: []float64{2, 24, 84, 105, 105}, sum: 9.1},
		// p10: rank 10 of the 20 in (10, 50]: 10 + 40 x 10/20 = 30 ms. p50: rank 50, the
		// 30th of the 60 in (50, 100]: 50 + 50 x 30/60 = 75 ms. p99: rank 99, the 19th of
		// the 20 in (100, 200]: 100 + 100 x 19/20 = 195 ms.
		wantCount: 100, wantSum: 9,
		want: map[float64]float64{0.1: 0.03, 0.5: 0.075, 0.99: 0.195},
	}, {
		name:      "a series new in the window is all of it",
		after:     h(10, 10, 10, 10, 10),
		wantCount: 10,
		// All in the first bucket, from 0: p50 is half way to 10 ms.
		want: map[float64]float64{0.5: 0.005, 0.99: 0.0099},
	}, {
		name:      "a rank in the +Inf bucket gives the highest finite bound",
		before:    h(0, 0, 0, 0, 0),
		after:     h(0, 0, 0, 90, 100),
		wantCount: 100,
		want:      map[float64]float64{0.5: 0.1 + 0.1*50/90, 0.99: 0.2},
	}, {
		name:      "the rank on a bucket's upper bound gives that bound",
		after:     h(0, 50, 100, 100, 100),
		wantCount: 100,
		want:      map[float64]float64{0.5: 0.05},
	}, {
		name:   "nothing in the window",
		before: h(1, 2, 3, 4, 5),
		after:  h(1, 2, 3, 4, 5),
	}, {
		name:    "a count went down: the agent restarted",
		before:  h(1, 2, 3, 4, 5),
		after:   h(0, 1, 1, 1, 1),
		wantErr: true,
	}, {
		name:    "other buckets",
		before:  histogram{bounds: []float64{0.01, inf}, counts: []float64{1, 1}},
		after:   h(1, 2, 3, 4, 5),
		wantErr: true,
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.after.minus(tc.before)
			if (err != nil) != tc.wantErr {
				t.Fatalf("minus: error %v, want an error: %v", err, tc.wantErr)
			}
			if err != nil {
				return
			}
			if got.count() != tc.wantCount || math.Abs(got.sum-tc.wantSum) > 1e-9 {
				t.Errorf("window: count %v sum %v, want %v and %v", got.count(), got.sum, tc.wantCount, tc.wantSum)
			}
			if _, ok := got.quantile(0.5); ok != (len(tc.want) > 0) {
				t.Errorf("quantile ok = %v, want %v", ok, len(tc.want) > 0)
			}
			for q, want := range tc.want {
				if v, ok := got.quantile(q); !ok || math.Abs(v-want) > 1e-9 {
					t.Errorf("quantile(%v) = %v, %v; want %v", q, v, ok, want)
				}
			}
		})
	}
}

// scrape returns the text exposition of reg as promhttp serves it, as the agent does.
func scrape(t *testing.T, reg *prometheus.Registry) []byte {
	t.Helper()
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	b, err := io.ReadAll(rec.Result().Body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestStagesOf reads the agent's own metrics, before and after a storm, as the bench
// does. The agent's buckets have bounds at 10, 20, 100 and 150 ms.
func TestStagesOf(t *testing.T) {
	for _, b := range []float64{0.01, 0.02, 0.1, 0.15} {
		if !slices.Contains(metrics.LatencyBuckets, b) {
			t.Fatalf("the agent's buckets %v have no bound at %v: the test's figures assume them", metrics.LatencyBuckets, b)
		}
	}
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	// Before the storm: an exit, and another pod's terminal phase.
	m.Observed("ExitHistory", 0.5)
	m.Written("ExitHistory", 0.5)
	m.Stamped("ExitHistory", "Recorded", 1)
	m.Stamped("TerminalPhase", "Failed", 30)
	start := sample{agentHist: parseHistograms(scrape(t, reg), stageMetrics...)}
	// The storm: three exits, observed after 12, 15 and 18 ms, written 110, 120 and
	// 130 ms later; one limit OOM without its observation time.
	for _, d := range []struct{ observe, write float64 }{{0.012, 0.11}, {0.015, 0.12}, {0.018, 0.13}} {
		m.Observed("ExitHistory", d.observe)
		m.Written("ExitHistory", d.write)
		m.Stamped("ExitHistory", "Recorded", d.observe+d.write)
	}
	m.Stamped("LimitOOM", "MemoryLimitExceeded", 0.3)
	end := sample{agentHist: parseHistograms(scrape(t, reg), stageMetrics...)}

	exits := kindReport{Pods: 3, Coroner: stats{N: 3, P50: 180, P99: 210}}
	ooms := kindReport{Pods: 1, Coroner: stats{N: 1, P50: 400, P99: 400}}
	got, note := stagesOf(start, end, exits, ooms)
	type row struct {
		pods, stage string
		n           int
		p50, p99    float64 // ms
	}
	want := []row{
		// All three in (10, 20]: rank 1.5 of 3 is half way, rank 2.97 99% of the way.
		{"exits", stageObserve, 3, 15, 19.9},
		// All three in (100, 150].
		{"exits", stageWrite, 3, 125, 149.5},
		// 122, 135 and 148 ms: in (100, 150] too.
		{"exits", stageDetection, 3, 125, 149.5},
		{"exits", stageWatch, 3, 180, 210},
		{"OOMs", stageObserve, 0, 0, 0},
		{"OOMs", stageWrite, 0, 0, 0},
		// 300 ms: in (200, 300].
		{"OOMs", stageDetection, 1, 250, 299},
		{"OOMs", stageWatch, 1, 400, 400},
	}
	if len(got) != len(want) {
		t.Fatalf("%d stages, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		g := got[i]
		if g.Pods != w.pods || g.Stage != w.stage || g.N != w.n || math.Abs(g.P50-w.p50) > 1e-6 || math.Abs(g.P99-w.p99) > 1e-6 {
			t.Errorf("stage %d = %+v, want %+v", i, g, w)
		}
	}
	if note != "" {
		t.Errorf("note %q, want none", note)
	}
	if !strings.Contains(got[0].Source, `coroner_agent_observe_latency_seconds{kind="ExitHistory"}`) || got[3].Source != "bench" {
		t.Errorf("sources %q, %q", got[0].Source, got[3].Source)
	}

	// The agent's metrics unread at the end: the bench's own figures, and why.
	got, note = stagesOf(start, sample{Agent: usage{Err: "proxy error"}}, exits, kindReport{})
	if len(got) != 1 || got[0].Stage != stageWatch || !strings.Contains(note, "storm's end: proxy error") {
		t.Errorf("without the end's metrics: %+v, note %q", got, note)
	}
}

func TestParseSample(t *testing.T) {
	cases := []struct {
		line       string
		wantName   string
		wantLabels map[string]string
		wantValue  float64
		wantOK     bool
	}{
		{`x_bucket{kind="LimitOOM",le="0.1"} 3`, "x_bucket", map[string]string{"kind": "LimitOOM", "le": "0.1"}, 3, true},
		{`x_bucket{le="+Inf",kind="A"} 7 1700000000000`, "x_bucket", map[string]string{"kind": "A", "le": "+Inf"}, 7, true},
		{`x_sum 1.5e-3`, "x_sum", map[string]string{}, 0.0015, true},
		{`x{msg="a \"b\", c}",kind="K",} 2`, "x", map[string]string{"msg": `a "b", c}`, "kind": "K"}, 2, true},
		{`x{kind="K" 2`, "", nil, 0, false},
		{`x{kind="K"}`, "", nil, 0, false},
	}
	for _, tc := range cases {
		name, labels, v, ok := parseSample(tc.line)
		if ok != tc.wantOK || name != tc.wantName || v != tc.wantValue || len(labels) != len(tc.wantLabels) {
			t.Errorf("parseSample(%q) = %q %v %v %v, want %q %v %v %v", tc.line, name, labels, v, ok, tc.wantName, tc.wantLabels, tc.wantValue, tc.wantOK)
			continue
		}
		for k, want := range tc.wantLabels {
			if labels[k] != want {
				t.Errorf("parseSample(%q): label %s = %q, want %q", tc.line, k, labels[k], want)
			}
		}
	}
}
