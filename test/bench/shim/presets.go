package main

import (
	"fmt"
	"strings"
	"time"
)

// preset is a named workload (--preset).
type preset struct {
	name, about string
	apply       func(*config)
}

// presetAll runs allPresets one after the other.
const presetAll = "all"

// allPresets are the presets `make bench` runs (--preset all), in order.
var allPresets = []string{"small", "failfast", "failjob-500", "indexed-10k"}

// scaleQPS and scaleBurst are the client rates of both controllers in the presets of
// issue 14's sizes: upstream's own figure for a 10,000-pod Job (~225 s) is at 100 QPS.
const (
	scaleQPS   = 100
	scaleBurst = 200
)

var presets = []preset{
	{
		name:  "small",
		about: "20 Indexed Jobs x 10 completions, backoffLimitPerIndex 1, 20% of indexes failing once, 25% of Jobs losing one index to FailIndex; QPS 50",
		apply: func(*config) {},
	},
	{
		name:  "indexed-10k",
		about: "one Indexed Job, 10,000 completions, parallelism 500, backoffLimitPerIndex 2, 30% of indexes failing once then succeeding; QPS 100",
		apply: func(c *config) {
			c.jobs, c.completions, c.parallelism = 1, 10000, 500
			c.perIndex, c.failOncePct, c.failIndexPct = 2, 30, 0
			c.qps, c.burst = scaleQPS, scaleBurst
			c.timeout = 15 * time.Minute
		},
	},
	{
		name:  "failjob-500",
		about: "500 Indexed Jobs x 5 pods (all at once), FailJob on exit 43 hit by 10% of the Jobs, whose other pods must be stopped; QPS 100",
		apply: func(c *config) {
			c.jobs, c.completions, c.parallelism = 500, 5, 5
			c.perIndex, c.failOncePct, c.failIndexPct, c.failJobPct = -1, 0, 0, 10
			c.qps, c.burst = scaleQPS, scaleBurst
			c.timeout = 10 * time.Minute
		},
	},
	{
		name:  "indexed-100k",
		about: "one Indexed Job, 100,000 completions, parallelism 1,000, that succeeds; QPS 100; not in all: at the 36 pods/s per controller measured side by side on 2 shared cores it takes about 46 minutes",
		apply: func(c *config) {
			c.jobs, c.completions, c.parallelism = 1, 100000, 1000
			c.perIndex, c.failOncePct, c.failIndexPct = -1, 0, 0
			c.qps, c.burst = scaleQPS, scaleBurst
			c.timeout = 90 * time.Minute
		},
	},
	{
		name:  "failfast",
		about: "20 Indexed Jobs x 10 pods (all at once), each ended by one pod's failure after 10s (the creations are over by then): FailJob (exit 43) in half, FailIndex (exit 42) with maxFailedIndexes 0 in the others; the other pods would run 60s",
		apply: func(c *config) {
			c.jobs, c.completions, c.parallelism = 20, 10, 10
			c.perIndex, c.maxFailedIndexes = 0, 0
			c.failOncePct, c.failIndexPct, c.failJobPct = 0, 50, 50
			c.runTime, c.longRunTime = 10*time.Second, time.Minute
		},
	},
}

func presetByName(name string) (preset, bool) {
	for _, p := range presets {
		if p.name == name {
			return p, true
		}
	}
	return preset{}, false
}

func presetNames() string {
	var names []string
	for _, p := range presets {
		names = append(names, p.name)
	}
	return strings.Join(names, "|")
}

func presetHelp() string {
	var b strings.Builder
	for _, p := range presets {
		fmt.Fprintf(&b, "\n  %-13s %s", p.name, p.about)
	}
	fmt.Fprintf(&b, "\n  %-13s %s", presetAll, strings.Join(allPresets, ", ")+", one after the other (make bench)")
	return b.String()
}
