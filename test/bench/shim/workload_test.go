package main

import (
	"flag"
	"maps"
	"slices"
	"testing"
)

func TestRangeString(t *testing.T) {
	cases := []struct {
		name string
		ixs  []int
		want string
	}{
		{name: "empty", want: ""},
		{name: "one", ixs: []int{4}, want: "4"},
		{name: "a pair stays two numbers, as the API writes it", ixs: []int{8, 9}, want: "8,9"},
		{name: "three or more make a range", ixs: []int{0, 1, 2, 3, 5, 7, 8, 10, 11, 12}, want: "0-3,5,7,8,10-12"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := rangeString(tc.ixs); got != tc.want {
				t.Errorf("rangeString(%v) = %q, want %q", tc.ixs, got, tc.want)
			}
			set, err := parseRanges(tc.want)
			if err != nil {
				t.Fatalf("parseRanges(%q): %v", tc.want, err)
			}
			if got := slices.Sorted(maps.Keys(set)); !slices.Equal(got, tc.ixs) && len(got)+len(tc.ixs) > 0 {
				t.Errorf("parseRanges(%q) = %v, want %v", tc.want, got, tc.ixs)
			}
		})
	}
}

func TestParseRangesErrors(t *testing.T) {
	for _, s := range []string{"a", "1-", "3-1", "1,,2"} {
		if _, err := parseRanges(s); err == nil {
			t.Errorf("parseRanges(%q): no error", s)
		}
	}
}

func TestParseRequestMetrics(t *testing.T) {
	body := `# HELP rest_client_requests_total [ALPHA] Number of HTTP requests
# TYPE rest_client_requests_total counter
rest_client_requests_total{code="200",host="127.0.0.1:6443",method="GET"} 12
rest_client_requests_total{code="201",host="127.0.0.1:6443",method="POST"} 7
rest_client_requests_total{code="409",host="127.0.0.1:6443",method="PUT"} 2
rest_client_requests_total{code="<error>",host="x,y",method="GET"} 1
rest_client_request_retries_total{code="429",host="127.0.0.1:6443",method="POST"} 3
rest_client_request_duration_seconds_count{host="127.0.0.1:6443",verb="GET"} 99
`
	c, found, err := parseRequestMetrics(body, "rest_client_requests_total", "rest_client_request_retries_total")
	if err != nil {
		t.Fatal(err)
	}
	if !found["rest_client_requests_total"] || !found["rest_client_request_retries_total"] {
		t.Errorf("found = %v, want both counters", found)
	}
	if got, want := c.total(), int64(25); got != want {
		t.Errorf("total = %d, want %d", got, want)
	}
	if got, want := c.method("POST"), int64(10); got != want {
		t.Errorf("POST = %d, want %d", got, want)
	}
	if got, want := c.code("409"), int64(2); got != want {
		t.Errorf("409 = %d, want %d", got, want)
	}
	if got, want := c.code("<error>"), int64(1); got != want {
		t.Errorf("<error> = %d, want %d", got, want)
	}
}

func TestWorkload(t *testing.T) {
	w := workload{jobs: 20, completions: 10, parallelism: 10, perIndex: 1, maxFailedIndexes: -1, failOncePct: 20, failIndexPct: 25}
	withFailedIndex := 0
	for j := range w.jobs {
		fi := w.failedIndex(j)
		if fi >= 0 {
			withFailedIndex++
			if fi >= w.completions {
				t.Errorf("Job %d: failed index %d out of range", j, fi)
			}
		}
		if d := w.doomIndex(j); d >= 0 {
			t.Errorf("Job %d: doomIndex %d without FailJob nor maxFailedIndexes 0", j, d)
		}
		want, _ := w.expected(j)
		if int(want.succeeded)+len(must(parseRanges(want.failedIndexes))) != w.completions {
			t.Errorf("Job %d: %d succeeded + failedIndexes %q != %d completions", j, want.succeeded, want.failedIndexes, w.completions)
		}
		for i := range w.completions {
			if got := w.exitCode(j, i, 1); got != 0 {
				t.Errorf("Job %d index %d: the second pod exits %d, want 0", j, i, got)
			}
		}
	}
	if withFailedIndex != 5 {
		t.Errorf("%d Jobs with a failed index, want 5 (25%% of 20)", withFailedIndex)
	}
	if n, ok := jobNumber(jobName(7)); !ok || n != 7 {
		t.Errorf("jobNumber(jobName(7)) = %d, %v", n, ok)
	}
	if _, ok := jobNumber(warmupJob); ok {
		t.Errorf("jobNumber(%q) is a Job number", warmupJob)
	}
}

// TestDoomedWorkload checks the failfast preset's Jobs: each has one index whose
// failure ends it, FailJob (exit 43) in half of them and FailIndex (exit 42) in the
// others, and every other pod succeeds (after the long run time).
func TestDoomedWorkload(t *testing.T) {
	c := defaultConfig()
	p, _ := presetByName("failfast")
	p.apply(&c)
	w := c.workload()
	kinds := map[string]int{}
	for j := range w.jobs {
		d := w.doomIndex(j)
		if d < 0 || d >= w.completions {
			t.Fatalf("Job %d: doomIndex %d", j, d)
		}
		want, skip := w.expected(j)
		kinds[want.terminal]++
		code := w.exitCode(j, d, 0)
		if wantCode := map[string]int32{"Failed/PodFailurePolicy": exitFailJob, "Failed/MaxFailedIndexesExceeded": exitFailIndex}[want.terminal]; code != wantCode {
			t.Errorf("Job %d: the doomed index exits %d, want %d for %s", j, code, wantCode, want.terminal)
		}
		for i := range w.completions {
			if i != d && w.exitCode(j, i, 0) != 0 {
				t.Errorf("Job %d index %d: exits %d, want 0", j, i, w.exitCode(j, i, 0))
			}
		}
		if want.pods != w.completions || want.deleted != w.completions-1 || !slices.Contains(skip, "failed") {
			t.Errorf("Job %d: expected %+v, skipping %v", j, want, skip)
		}
	}
	if kinds["Failed/PodFailurePolicy"] != 10 || kinds["Failed/MaxFailedIndexesExceeded"] != 10 {
		t.Errorf("terminal conditions %v, want 10 of each", kinds)
	}
}

// TestPresets checks that every preset makes a valid configuration and that the
// FailJob preset hits 10% of its Jobs.
func TestPresets(t *testing.T) {
	for _, p := range presets {
		c := defaultConfig()
		p.apply(&c)
		if err := c.validate(flag.NewFlagSet("x", flag.ContinueOnError)); err != nil {
			t.Errorf("preset %s: %v", p.name, err)
		}
	}
	for _, name := range allPresets {
		if _, ok := presetByName(name); !ok {
			t.Errorf("allPresets names %q, which is no preset", name)
		}
	}
	c := defaultConfig()
	p, _ := presetByName("failjob-500")
	p.apply(&c)
	w := c.workload()
	if got := countPlan(w, exitFailJob); got != 50 {
		t.Errorf("failjob-500: %d FailJob pods, want 50", got)
	}
}

func TestIntervals(t *testing.T) {
	iv, err := parseIntervals("0-3,5,7,8,10-12")
	if err != nil {
		t.Fatal(err)
	}
	want := map[int]bool{0: true, 1: true, 2: true, 3: true, 5: true, 7: true, 8: true, 10: true, 11: true, 12: true}
	for i := -1; i <= 14; i++ {
		if got := iv.has(i); got != want[i] {
			t.Errorf("has(%d) = %v, want %v", i, got, want[i])
		}
	}
	for _, s := range []string{"a", "3-1", "5,2"} {
		if _, err := parseIntervals(s); err == nil {
			t.Errorf("parseIntervals(%q): no error", s)
		}
	}
	if iv, err := parseIntervals(""); err != nil || iv.has(0) {
		t.Errorf("parseIntervals(\"\") = %v, %v", iv, err)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
