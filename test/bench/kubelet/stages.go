package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/coroner-dev/coroner/agent/classify"
)

// Where the time goes: the agent splits its own part of a stamp's latency in two
// histograms beside its detection latency (agent/metrics): from the runtime's event to
// its runtime watcher (observe), and from there to the successful patch (write). The
// bench reads them with the cost samples, from the agent's /metrics through the API
// server's proxy; their difference between the storm's first sample and its last is the
// storm's. The bench's own measurement, to the stamp seen through a watch, adds the
// watch's delivery.
//
// The agent's figures cover every stamp of the kind it wrote in the window, the bench's
// pods or not (n beside the bench's says whether others came in): ExitHistory for the
// exits, LimitOOM for the OOM kills. A LimitOOM stamp written from containerd's OOM
// event counts from that event's time, a little before the container's finishedAt, and
// has its stages only when the agent knew when its watcher had that event (see
// agent/stamps.go): the stages' n may be below the total's.

// The agent's latency histograms, with the label kind.
const (
	metricObserve   = "coroner_agent_observe_latency_seconds"
	metricWrite     = "coroner_agent_write_latency_seconds"
	metricDetection = "coroner_agent_detection_latency_seconds"
)

var stageMetrics = []string{metricObserve, metricWrite, metricDetection}

// histKey names a histogram series: the metric and its kind label.
type histKey struct{ name, kind string }

// histogram is a histogram series as exposed: cumulative counts by upper bound,
// ascending, the last +Inf.
type histogram struct {
	bounds []float64
	counts []float64
	sum    float64
}

// count is the number of samples.
func (h histogram) count() float64 {
	if len(h.counts) == 0 {
		return 0
	}
	return h.counts[len(h.counts)-1]
}

// parseHistograms reads the series of the named histograms, by name and kind, from a
// Prometheus text exposition; series that differ in labels other than kind and le are
// summed. The map is never nil.
func parseHistograms(text []byte, names ...string) map[histKey]histogram {
	type acc struct {
		buckets map[float64]float64
		sum     float64
	}
	accs := map[histKey]*acc{}
	get := func(k histKey) *acc {
		a := accs[k]
		if a == nil {
			a = &acc{buckets: map[float64]float64{}}
			accs[k] = a
		}
		return a
	}
	forEachSample(text, func(name string, labels map[string]string, value float64) {
		for _, n := range names {
			switch name {
			case n + "_bucket":
				le, err := strconv.ParseFloat(labels["le"], 64) // "+Inf" too
				if err != nil {
					continue
				}
				get(histKey{n, labels["kind"]}).buckets[le] += value
			case n + "_sum":
				get(histKey{n, labels["kind"]}).sum += value
			}
		}
	})
	out := map[histKey]histogram{}
	for k, a := range accs {
		h := histogram{sum: a.sum}
		for b := range a.buckets {
			h.bounds = append(h.bounds, b)
		}
		slices.Sort(h.bounds)
		for _, b := range h.bounds {
			h.counts = append(h.counts, a.buckets[b])
		}
		out[k] = h
	}
	return out
}

// forEachSample calls f with every sample of a Prometheus text exposition; comments and
// lines it cannot parse are skipped.
func forEachSample(text []byte, f func(name string, labels map[string]string, value float64)) {
	sc := bufio.NewScanner(bytes.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		if name, labels, value, ok := parseSample(line); ok {
			f(name, labels, value)
		}
	}
}

// parseSample splits a sample line of a text exposition: name{labels} value [timestamp].
func parseSample(line string) (name string, labels map[string]string, value float64, ok bool) {
	i := strings.IndexAny(line, "{ ")
	if i <= 0 {
		return "", nil, 0, false
	}
	name, rest := line[:i], line[i:]
	labels = map[string]string{}
	if rest[0] == '{' {
		rest = rest[1:]
		for {
			rest = strings.TrimLeft(rest, " ,")
			if rest == "" {
				return "", nil, 0, false
			}
			if rest[0] == '}' {
				rest = rest[1:]
				break
			}
			k, v, ok := strings.Cut(rest, `="`)
			if !ok {
				return "", nil, 0, false
			}
			var val strings.Builder
			j := 0
			for ; j < len(v) && v[j] != '"'; j++ {
				if v[j] == '\\' && j+1 < len(v) {
					j++
					if v[j] == 'n' {
						val.WriteByte('\n')
						continue
					}
				}
				val.WriteByte(v[j])
			}
			if j == len(v) {
				return "", nil, 0, false
			}
			labels[strings.TrimSpace(k)] = val.String()
			rest = v[j+1:]
		}
	}
	f := strings.Fields(rest)
	if len(f) == 0 {
		return "", nil, 0, false
	}
	value, err := strconv.ParseFloat(f[0], 64)
	return name, labels, value, err == nil
}

// minus returns h less before, the same series read earlier: the histogram of the
// samples in between. A before without buckets (the series did not exist yet) counts as
// empty. An error when the bucket layouts differ or a count went down: the agent
// restarted in between.
func (h histogram) minus(before histogram) (histogram, error) {
	out := histogram{bounds: slices.Clone(h.bounds), counts: slices.Clone(h.counts), sum: h.sum - before.sum}
	if len(before.bounds) == 0 {
		return out, nil
	}
	if !slices.Equal(h.bounds, before.bounds) {
		return histogram{}, errors.New("bucket layouts differ: the agent restarted with other buckets?")
	}
	for i := range out.counts {
		out.counts[i] -= before.counts[i]
		if out.counts[i] < 0 {
			return histogram{}, errors.New("counts went down: the agent restarted meanwhile")
		}
	}
	return out, nil
}

// quantile estimates the q-quantile (0 < q < 1) as Prometheus's histogram_quantile does:
// it finds the bucket holding the rank q x count and interpolates linearly within it,
// from the previous bucket's upper bound (0 for the first) to its own. A rank in the
// +Inf bucket gives the highest finite bound. false for an empty histogram or one
// without a +Inf bucket.
func (h histogram) quantile(q float64) (float64, bool) {
	n := len(h.bounds)
	if n == 0 || len(h.counts) != n || !math.IsInf(h.bounds[n-1], 1) || h.count() <= 0 {
		return 0, false
	}
	rank := q * h.count()
	i, _ := slices.BinarySearch(h.counts, rank) // the first bucket whose count reaches the rank
	i = min(i, n-1)
	if i == n-1 {
		if n == 1 {
			return 0, false
		}
		return h.bounds[n-2], true
	}
	lower, below := 0.0, 0.0
	if i > 0 {
		lower, below = h.bounds[i-1], h.counts[i-1]
	}
	return lower + (h.bounds[i]-lower)*(rank-below)/(h.counts[i]-below), true
}

// stageReport is one stage of the time from a container's finishedAt to coroner's stamp
// seen through a watch, for one kind of the bench's pods on one node.
type stageReport struct {
	// Pods: "exits" or "OOMs"; Stage: from where to where.
	Pods  string `json:"pods"`
	Stage string `json:"stage"`
	// Source is the agent's histogram (and its kind label) the figures come from,
	// p50 and p99 estimated from its buckets; "bench" for the bench's own measurement
	// (nearest rank over the timed pods).
	Source string  `json:"source"`
	N      int     `json:"n"`
	P50    float64 `json:"p50Ms"`
	P99    float64 `json:"p99Ms"`
}

// The stages, in order: the agent's two, its total, and the bench's.
const (
	stageObserve   = "finishedAt -> agent observed (runtime event + CRI status)"
	stageWrite     = "observed -> patch done (queue, classification, batch period, API)"
	stageDetection = "finishedAt -> patch done (agent's own)"
	stageWatch     = "finishedAt -> stamp seen through a watch"
)

// stagesOf is a node's breakdown, from the agent's histograms at the storm's start
// and end and the bench's own latencies; the note says what could not be had.
func stagesOf(start, end sample, exits, ooms kindReport) ([]stageReport, string) {
	var notes []string
	haveMetrics := true
	for _, s := range []struct {
		when string
		s    sample
	}{{"start", start}, {"end", end}} {
		if s.s.agentHist == nil {
			haveMetrics = false
			notes = append(notes, fmt.Sprintf("the agent's metrics not read at the storm's %s: %s", s.when, orNone(s.s.Agent.Err)))
		}
	}
	var out []stageReport
	agentStages := 0
	for _, k := range []struct {
		pods  string
		kind  classify.Kind
		bench kindReport
	}{{"exits", classify.KindExitHistory, exits}, {"OOMs", classify.KindLimitOOM, ooms}} {
		if k.bench.Pods == 0 {
			continue
		}
		if haveMetrics {
			for _, st := range []struct{ stage, metric string }{
				{stageObserve, metricObserve}, {stageWrite, metricWrite}, {stageDetection, metricDetection},
			} {
				key := histKey{st.metric, string(k.kind)}
				r := stageReport{Pods: k.pods, Stage: st.stage, Source: fmt.Sprintf("%s{kind=%q}", st.metric, k.kind)}
				h, err := end.agentHist[key].minus(start.agentHist[key])
				if err != nil {
					notes = append(notes, r.Source+": "+err.Error())
					continue
				}
				r.N = int(math.Round(h.count()))
				if p50, ok := h.quantile(0.5); ok {
					p99, _ := h.quantile(0.99)
					r.P50, r.P99 = 1000*p50, 1000*p99
				}
				if st.metric != metricDetection {
					agentStages += r.N
				}
				out = append(out, r)
			}
		}
		c := k.bench.Coroner
		out = append(out, stageReport{Pods: k.pods, Stage: stageWatch, Source: "bench", N: c.N, P50: c.P50, P99: c.P99})
	}
	if haveMetrics && agentStages == 0 {
		notes = append(notes, "no observe or write samples: an agent image from before "+metricObserve+"?")
	}
	return out, strings.Join(notes, "; ")
}

// printStages prints a node's breakdown.
func printStages(out io.Writer, n nodeReport) {
	if len(n.Stages) == 0 && n.StagesNote == "" {
		return
	}
	fmt.Fprintf(out, "%s (agent: %s):\n", n.Node, mode(n.AgentMode))
	w := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(w, "  pods\tstage\tp50\tp99\tn\tsource")
	for _, s := range n.Stages {
		p50, p99 := "-", "-"
		if s.N > 0 {
			p50, p99 = msText(s.P50), msText(s.P99)
		}
		fmt.Fprintf(w, "  %s\t%s\t%s\t%s\t%d\t%s\n", s.Pods, s.Stage, p50, p99, s.N, s.Source)
	}
	w.Flush()
	if n.StagesNote != "" {
		fmt.Fprintf(out, "  %s\n", n.StagesNote)
	}
}

// msText prints milliseconds: a tenth under 10.
func msText(v float64) string {
	if math.Abs(v) < 10 {
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.0f", v)
}
