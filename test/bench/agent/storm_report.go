package main

// The storm mode's measurements: the agent's /metrics read every few seconds, the phases
// summed up, the table and the JSON report.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/coroner-dev/coroner/test/bench/measure"
)

// sample is one reading of the agent's /metrics.
type sample struct {
	AtSeconds  float64 `json:"atSeconds"` // since the agent was ready
	Phase      string  `json:"phase"`
	RSSBytes   float64 `json:"rssBytes"`
	Goroutines float64 `json:"goroutines"`
	HeapInuse  float64 `json:"heapInuseBytes"`
	OpenFDs    float64 `json:"openFDs"`
	CPUSeconds float64 `json:"cpuSeconds"`
	// The agent's counters (sums over their labels).
	AgentExits       float64 `json:"agentExits"`
	AgentStamps      float64 `json:"agentStamps"`
	AgentDropped     float64 `json:"agentDroppedEvents"`
	AgentWriteErrors float64 `json:"agentPodWriteErrors"`
	StreamDropped    float64 `json:"agentStreamDroppedEvents"`
	// LatencySum and LatencyCount are the agent's detection latency histogram's (every
	// kind): the mean latency between two samples is their differences' ratio.
	LatencySum        float64 `json:"agentLatencySumSeconds"`
	LatencyCount      float64 `json:"agentLatencyCount"`
	GeneratedExits    int64   `json:"generatedExits"` // by the bench, so far
	GeneratedOOMKills int64   `json:"generatedOOMKills"`
}

// agentMetrics maps the sample's fields to the agent's metric names.
var agentMetrics = map[string]func(*sample) *float64{
	"process_resident_memory_bytes":                     func(s *sample) *float64 { return &s.RSSBytes },
	"go_goroutines":                                     func(s *sample) *float64 { return &s.Goroutines },
	"go_memstats_heap_inuse_bytes":                      func(s *sample) *float64 { return &s.HeapInuse },
	"process_open_fds":                                  func(s *sample) *float64 { return &s.OpenFDs },
	"process_cpu_seconds_total":                         func(s *sample) *float64 { return &s.CPUSeconds },
	"coroner_agent_container_exits_total":               func(s *sample) *float64 { return &s.AgentExits },
	"coroner_agent_stamps_total":                        func(s *sample) *float64 { return &s.AgentStamps },
	"coroner_agent_dropped_events_total":                func(s *sample) *float64 { return &s.AgentDropped },
	"coroner_agent_pod_write_errors_total":              func(s *sample) *float64 { return &s.AgentWriteErrors },
	"coroner_agent_runtime_stream_dropped_events_total": func(s *sample) *float64 { return &s.StreamDropped },
	"coroner_agent_detection_latency_seconds_sum":       func(s *sample) *float64 { return &s.LatencySum },
	"coroner_agent_detection_latency_seconds_count":     func(s *sample) *float64 { return &s.LatencyCount },
}

// phaseReport sums up the samples of one phase.
type phaseReport struct {
	Name       string  `json:"name"`
	Seconds    float64 `json:"seconds"`
	Samples    int     `json:"samples"`
	RSS        minMax  `json:"rssBytes"`
	Goroutines minMax  `json:"goroutines"`
	HeapInuse  minMax  `json:"heapInuseBytes"`
	OpenFDs    minMax  `json:"openFDs"`
	CPUSeconds float64 `json:"cpuSeconds"` // the agent's CPU time during the phase
	// MachineBusy is the fraction of the machine's CPU time (all CPUs) not idle during
	// the phase: near 1, the storm's rate is the machine's limit.
	MachineBusy float64 `json:"machineBusy"`
	Exits       int64   `json:"exitsGenerated"`
	OOMKills    int64   `json:"oomKillsGenerated"`
}

type minMax struct {
	Min  float64 `json:"min"`
	Max  float64 `json:"max"`
	Last float64 `json:"last"`
}

// outcome counts one kind of event: generated, stamped as expected, stamped with the
// wrong verdict, not stamped at all, and the latencies finishedAt -> watch.
type outcome struct {
	Generated int     `json:"generated"`
	Stamped   int     `json:"stamped"`
	Wrong     int     `json:"wrongVerdict"`
	Lost      int     `json:"lost"`
	P50Ms     float64 `json:"stampLatencyP50Ms"`
	P99Ms     float64 `json:"stampLatencyP99Ms"`
	MaxMs     float64 `json:"stampLatencyMaxMs"`
	latencies []time.Duration
	examples  []string
}

type stormReport struct {
	Finished       time.Time      `json:"finished"`
	KubeAPIServer  string         `json:"kubeAPIServer"`
	Containerd     string         `json:"containerd"`
	Workload       map[string]any `json:"workload"`
	CPUs           int            `json:"cpus"`
	ExitsPerMinute float64        `json:"exitsPerMinuteAchieved"`
	// OOMReasonMissing: OOM kills (memhog's exit 137) the runtime did not give the reason
	// OOMKilled; OOMNotKilled: memhog containers that exited otherwise (counted as exits).
	OOMReasonMissing int                 `json:"oomKillsWithoutRuntimeReason"`
	OOMNotKilled     int                 `json:"oomContainersNotKilled"`
	Steps            map[string]stepTime `json:"generatorSteps"`
	LoadAvg          string              `json:"loadAvgAtEnd"`
	StampedEvents    int                 `json:"stampedEvents"`
	CleanupErrors    []string            `json:"cleanupErrors,omitempty"`
	Pods             int64               `json:"pods"`
	TotalSeconds     float64             `json:"totalSeconds"`
	Exits            *outcome            `json:"exits"`
	OOMKills         *outcome            `json:"oomKills"`
	Phases           []phaseReport       `json:"phases"`
	Samples          []sample            `json:"samples"`
	Failures         []string            `json:"failures,omitempty"`
	AgentStoppedErr  string              `json:"agentStopError,omitempty"`
}

// stepTime is how long a step of the generator (the kubelet's part) took.
type stepTime struct {
	N     int     `json:"n"`
	P50Ms float64 `json:"p50Ms"`
	P99Ms float64 `json:"p99Ms"`
}

// cpuTimes reads the machine's busy and total CPU time (all CPUs, in USER_HZ ticks)
// from /proc/stat; idle and iowait are not busy.
func cpuTimes() (busy, total uint64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	fields := strings.Fields(line)
	for i, f := range fields[1:] {
		v, _ := strconv.ParseUint(f, 10, 64)
		total += v
		if i != 3 && i != 4 { // idle, iowait
			busy += v
		}
	}
	return busy, total
}

// loadAvg is the machine's 1, 5 and 15 minute load averages.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

// sample reads the agent's /metrics once.
func (s *storm) sample(ctx context.Context) error {
	if done, err := s.agent.Exited(); done {
		return fmt.Errorf("the agent exited (%v); its log ends: %s", err, s.agent.LogTail(2000))
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	values, err := scrape(ctx, "http://"+s.addr+"/metrics")
	if err != nil {
		return fmt.Errorf("reading the agent's /metrics: %w", err)
	}
	smp := sample{AtSeconds: time.Since(s.ready).Seconds(), Phase: s.phase.Load().(string),
		GeneratedExits: s.genExits.Load(), GeneratedOOMKills: s.genOOMs.Load()}
	for name, field := range agentMetrics {
		*field(&smp) = values[name]
	}
	for _, name := range []string{"process_resident_memory_bytes", "go_goroutines", "process_open_fds"} {
		if _, ok := values[name]; !ok {
			return fmt.Errorf("the agent's /metrics has no %s", name)
		}
	}
	s.mu.Lock()
	s.samples = append(s.samples, smp)
	s.mu.Unlock()
	return nil
}

func (s *storm) summarize(name string, d time.Duration, first int) phaseReport {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.samples[first:]
	r := phaseReport{Name: name, Seconds: d.Seconds(), Samples: len(ss)}
	if len(ss) == 0 {
		return r
	}
	span := func(f func(sample) float64) minMax {
		m := minMax{Min: f(ss[0]), Max: f(ss[0]), Last: f(ss[len(ss)-1])}
		for _, x := range ss {
			m.Min, m.Max = min(m.Min, f(x)), max(m.Max, f(x))
		}
		return m
	}
	r.RSS = span(func(x sample) float64 { return x.RSSBytes })
	r.Goroutines = span(func(x sample) float64 { return x.Goroutines })
	r.HeapInuse = span(func(x sample) float64 { return x.HeapInuse })
	r.OpenFDs = span(func(x sample) float64 { return x.OpenFDs })
	// The phase's first sample is taken as it starts.
	first0, last := ss[0], ss[len(ss)-1]
	r.CPUSeconds = last.CPUSeconds - first0.CPUSeconds
	r.Exits = last.GeneratedExits - first0.GeneratedExits
	r.OOMKills = last.GeneratedOOMKills - first0.GeneratedOOMKills
	return r
}

// scrape reads a Prometheus text exposition and sums each metric's samples over their
// labels (histograms' and summaries' series keep their _bucket, _sum, _count names).
func scrape(ctx context.Context, url string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest := line, ""
		if i := strings.IndexAny(line, "{ "); i >= 0 {
			name, rest = line[:i], line[i:]
		}
		if strings.HasPrefix(rest, "{") {
			j := strings.LastIndexByte(rest, '}')
			if j < 0 {
				continue
			}
			rest = rest[j+1:]
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			continue
		}
		out[name] += v
	}
	return out, sc.Err()
}

// report prints the table, writes the JSON and says what failed.
func (s *storm) report(phases []phaseReport, apiVersion, criVersion string, agentErr error, total time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, o := range []*outcome{&s.exits, &s.ooms} {
		o.P50Ms = msf(measure.Percentile(o.latencies, 50))
		o.P99Ms = msf(measure.Percentile(o.latencies, 99))
		o.MaxMs = msf(measure.Percentile(o.latencies, 100))
	}
	var during phaseReport
	for _, p := range phases {
		if p.Name == "storm" {
			during = p
		}
	}
	rate := float64(s.exits.Generated) / s.c.duration.Seconds() * 60

	mib := func(b float64) string { return fmt.Sprintf("%.1f", b/(1<<20)) }
	tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "phase\tseconds\tRSS MiB min/max/last\theap MiB max/last\tgoroutines min/max/last\tfds min/max/last\tagent CPU s\tmachine busy\texits\tOOM kills\t")
	for _, p := range phases {
		fmt.Fprintf(tw, "%s\t%.0f\t%s/%s/%s\t%s/%s\t%.0f/%.0f/%.0f\t%.0f/%.0f/%.0f\t%.1f\t%.0f%%\t%d\t%d\t\n", p.Name, p.Seconds,
			mib(p.RSS.Min), mib(p.RSS.Max), mib(p.RSS.Last), mib(p.HeapInuse.Max), mib(p.HeapInuse.Last),
			p.Goroutines.Min, p.Goroutines.Max, p.Goroutines.Last, p.OpenFDs.Min, p.OpenFDs.Max, p.OpenFDs.Last,
			p.CPUSeconds, 100*p.MachineBusy, p.Exits, p.OOMKills)
	}
	tw.Flush()
	fmt.Println()
	tw = tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "event\tgenerated\tstamped\twrong verdict\tlost\tstamp p50\tp99\tmax\t")
	for _, x := range []struct {
		name string
		o    *outcome
	}{{"exit", &s.exits}, {"OOM kill", &s.ooms}} {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%.0fms\t%.0fms\t%.0fms\t\n", x.name, x.o.Generated, x.o.Stamped, x.o.Wrong, x.o.Lost, x.o.P50Ms, x.o.P99Ms, x.o.MaxMs)
	}
	tw.Flush()
	var last sample
	if len(s.samples) > 0 {
		last = s.samples[len(s.samples)-1]
	}
	fmt.Printf("\nexits: %.0f/min achieved of %d/min asked (%d in %v, %d pods of at most %d exits, %d at once); OOM kills: %d of %d asked",
		rate, s.c.exitRate, s.exits.Generated, s.c.duration, s.podSeq.Load(), s.c.exitsPerPod, s.c.pods, s.ooms.Generated, s.c.ooms)
	if s.oomReasonMissing > 0 {
		fmt.Printf(" (%d of them exit 137 without the runtime's reason OOMKilled)", s.oomReasonMissing)
	}
	if s.oomNotKilled > 0 {
		fmt.Printf(" (%d memhog containers exited otherwise than by SIGKILL, counted as exits)", s.oomNotKilled)
	}
	fmt.Printf("\nthe agent's counters at the end: %.0f exits, %.0f stamps, %.0f dropped events, %.0f pod write errors, %.0f runtime stream events dropped; its CPU during the storm %.1fs (%.0f%% of a core)\n",
		last.AgentExits, last.AgentStamps, last.AgentDropped, last.AgentWriteErrors, last.StreamDropped, during.CPUSeconds, 100*during.CPUSeconds/max(during.Seconds, 1))
	var windows []string
	var from *sample
	for j := range s.samples {
		b := &s.samples[j]
		switch {
		case b.Phase != "storm":
			continue
		case from == nil:
			from = b
			continue
		}
		lastOfStorm := j+1 == len(s.samples) || s.samples[j+1].Phase != "storm"
		if b.AtSeconds-from.AtSeconds < 30 && !lastOfStorm {
			continue
		}
		if n := b.LatencyCount - from.LatencyCount; n > 0 {
			windows = append(windows, fmt.Sprintf("%.1fs", (b.LatencySum-from.LatencySum)/n))
		} else {
			windows = append(windows, "-")
		}
		from = b
	}
	fmt.Printf("the agent's own mean detection latency (finishedAt -> patch) per 30 s of the storm: %s; Stamped Events posted: %d\n", strings.Join(windows, " "), s.stampedEvents)
	fmt.Printf("stamp latency: container finishedAt (containerd) -> the exit history entry delivered by a watch; lost: no entry within %v of the pod's last exit\n", s.c.timeout)
	steps := map[string]stepTime{}
	var parts []string
	for _, name := range []string{"create pod", "start container", "wait for exit", "write status", "remove container"} {
		ds := s.steps[name]
		if len(ds) == 0 {
			continue
		}
		st := stepTime{N: len(ds), P50Ms: msf(measure.Percentile(ds, 50)), P99Ms: msf(measure.Percentile(ds, 99))}
		steps[name] = st
		parts = append(parts, fmt.Sprintf("%s %.0f/%.0fms", name, st.P50Ms, st.P99Ms))
	}
	fmt.Printf("the kubelet's part (the storm's generator), p50/p99: %s; load average at the end %s\n", strings.Join(parts, ", "), loadAvg())
	if len(s.cleanupErrors) > 0 {
		// Not the agent's failure; containerd's Stop removes what is left.
		fmt.Printf("warning: %d pods not removed after their storm (the after phase is then not idle): %s\n", len(s.cleanupErrors), strings.Join(s.cleanupErrors[:min(len(s.cleanupErrors), 3)], "; "))
	}

	var failures []string
	for _, x := range []struct {
		name string
		o    *outcome
	}{{"exits", &s.exits}, {"OOM kills", &s.ooms}} {
		if x.o.Lost > 0 || x.o.Wrong > 0 {
			failures = append(failures, fmt.Sprintf("%s: %d not stamped, %d with the wrong OOM verdict (%s)", x.name, x.o.Lost, x.o.Wrong, strings.Join(x.o.examples, "; ")))
		}
	}
	if len(phases) == 3 {
		before, after := phases[0], phases[2]
		if after.Goroutines.Last > before.Goroutines.Last+float64(s.c.goroutineSlack) {
			failures = append(failures, fmt.Sprintf("goroutines: %.0f after the storm, %.0f before (slack %d)", after.Goroutines.Last, before.Goroutines.Last, s.c.goroutineSlack))
		}
		if after.RSS.Last > s.c.rssFactor*before.RSS.Last {
			failures = append(failures, fmt.Sprintf("resident memory: %s MiB after the storm, more than %.1fx the %s MiB before", mib(after.RSS.Last), s.c.rssFactor, mib(before.RSS.Last)))
		}
	}
	if agentErr != nil {
		failures = append(failures, fmt.Sprintf("the agent's stop: %v", agentErr))
	}

	rep := stormReport{
		Finished: time.Now().UTC(), KubeAPIServer: apiVersion, Containerd: criVersion, CPUs: runtime.NumCPU(),
		Workload: map[string]any{
			"stormSeconds": s.c.duration.Seconds(), "exitsPerMinuteAsked": s.c.exitRate, "oomKillsAsked": s.c.ooms,
			"podsAtOnce": s.c.pods, "exitsPerPod": s.c.exitsPerPod, "kubeletStatus": s.c.kubeletStatus,
			"idleBeforeSeconds": s.c.idleBefore.Seconds(), "idleAfterSeconds": s.c.idleAfter.Seconds(),
			"agentArgs": s.c.agentArgs, // beyond the node, kubeconfig, endpoint and metrics address: the production defaults otherwise
		},
		StampedEvents: s.stampedEvents, CleanupErrors: s.cleanupErrors, ExitsPerMinute: rate, OOMReasonMissing: s.oomReasonMissing, OOMNotKilled: s.oomNotKilled, Steps: steps, LoadAvg: loadAvg(), Pods: s.podSeq.Load(), TotalSeconds: total.Seconds(),
		Exits: &s.exits, OOMKills: &s.ooms, Phases: phases, Samples: s.samples, Failures: failures,
	}
	if agentErr != nil {
		rep.AgentStoppedErr = agentErr.Error()
	}
	out, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(s.c.jsonPath, append(out, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Printf("json: %s; total %v\n", s.c.jsonPath, total.Round(time.Second))
	if len(failures) > 0 {
		return errors.New(strings.Join(failures, "\n"))
	}
	return nil
}

func msf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
