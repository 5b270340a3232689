package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/coroner-dev/coroner/test/bench/measure"
	"github.com/coroner-dev/coroner/test/host"
)

// The goals of issue 14 for coroner / built-in.
const (
	goalThroughput   = 1.0  // at least
	goalCallsPerPod  = 1.02 // at most
	goalCPUAndMemory = 0.7  // at most, CPU per pod and peak RSS
)

// jsonReport is what report writes to _output/bench/shim-<preset>.json.
type jsonReport struct {
	Preset        string             `json:"preset"`
	Finished      time.Time          `json:"finished"`
	Mode          string             `json:"mode"`
	KubeAPIServer string             `json:"kubeAPIServer"`
	Workload      map[string]any     `json:"workload"`
	Machine       machine            `json:"machine"`
	Controllers   []controllerReport `json:"controllers"`
	// Ratios are coroner / built-in, by the controllerReport's JSON field name.
	Ratios        map[string]float64 `json:"ratios"`
	Goals         []goal             `json:"goals"`
	OutcomesAgree bool               `json:"outcomesAgree"`
	Problems      []string           `json:"problems,omitempty"`
}

type controllerReport struct {
	Name                  string           `json:"name"`
	Jobs                  int              `json:"jobs"`
	PodsFinished          int              `json:"podsFinished"`
	PodFailures           int              `json:"podFailures"`
	WallSeconds           float64          `json:"wallSeconds"`
	PodsPerSecond         float64          `json:"podsPerSecond"`
	JobDurationP50Seconds float64          `json:"jobDurationP50Seconds"`
	JobDurationMaxSeconds float64          `json:"jobDurationMaxSeconds"`
	APICalls              int64            `json:"apiCalls"`
	APICallsByMethod      map[string]int64 `json:"apiCallsByMethod"`
	Conflicts             int64            `json:"conflicts"`
	CallsPerPod           float64          `json:"callsPerPod"`
	CallsPerFailure       float64          `json:"callsPerFailure"`
	SyncLatencyP50Ms      float64          `json:"syncLatencyP50Ms"`
	SyncLatencyP99Ms      float64          `json:"syncLatencyP99Ms"`
	// CPU and memory of the controller's process; absent when unknown (in-process).
	CPUSeconds            *float64 `json:"cpuSeconds,omitempty"`
	CPUSecondsPer1000Pods *float64 `json:"cpuSecondsPer1000Pods,omitempty"`
	PeakRSSMiB            *float64 `json:"peakRSSMiB,omitempty"`
	// Jobs ended by one pod's failure: failure -> FailureTarget, -> last other pod
	// deleted, and the pod-seconds the other pods ran after the failure.
	DoomedJobs                  int     `json:"doomedJobs,omitempty"`
	FailureToTargetP50Ms        float64 `json:"failureToTargetP50Ms,omitempty"`
	FailureToTargetMaxMs        float64 `json:"failureToTargetMaxMs,omitempty"`
	FailureToLastDeletionP50Ms  float64 `json:"failureToLastDeletionP50Ms,omitempty"`
	FailureToLastDeletionMaxMs  float64 `json:"failureToLastDeletionMaxMs,omitempty"`
	WastedPodSeconds            float64 `json:"wastedPodSeconds,omitempty"`
	WastedPodSecondsPerJobP50   float64 `json:"wastedPodSecondsPerJobP50,omitempty"`
	FailJobPods, FailIndexPods  int     `json:"-"`
	latencyP50, latencyP99      time.Duration
	failureToTarget, toDeletion []time.Duration
}

type goal struct {
	What  string  `json:"what"`
	Want  string  `json:"want"`
	Ratio float64 `json:"ratio"`
	Met   bool    `json:"met"`
}

type machine struct {
	CPUs         int     `json:"cpus"`
	CPUModel     string  `json:"cpuModel"`
	MemTotalGiB  float64 `json:"memTotalGiB"`
	Kernel       string  `json:"kernel"`
	LoadAvgStart string  `json:"loadAvgStart"`
	LoadAvgEnd   string  `json:"loadAvgEnd"`
	Go           string  `json:"go"`
	Note         string  `json:"note,omitempty"`
}

// loadAvgAtStart is /proc/loadavg when the run began (run sets it).
var loadAvgAtStart string

func loadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

func machineInfo() machine {
	m := machine{CPUs: runtime.NumCPU(), Go: runtime.Version(), LoadAvgStart: loadAvgAtStart, LoadAvgEnd: loadAvg()}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	if kb := procField("/proc/meminfo", "MemTotal:"); kb > 0 {
		m.MemTotalGiB = float64(kb) / (1 << 20)
	}
	return m
}

// procField reads a "Name:   123 kB" line of a /proc file, as a number.
func procField(path, name string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, name); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				n, _ := strconv.ParseInt(f[0], 10, 64)
				return n
			}
		}
	}
	return 0
}

// peakRSS is the peak resident set size (VmHWM) of process pid in bytes; 0 when unknown.
func peakRSS(pid int) int64 {
	if pid <= 0 {
		return 0
	}
	return procField(fmt.Sprintf("/proc/%d/status", pid), "VmHWM:") * 1024
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func summarize(t *target) controllerReport {
	r := t.res
	counted := slices.Concat(r.lat[podSucceeded], r.lat[podFailIndex], r.lat[podFailJob])
	cr := controllerReport{
		Name:                  t.name,
		Jobs:                  r.jobs,
		PodsFinished:          r.podsFinished,
		PodFailures:           r.podFailures,
		WallSeconds:           r.wall().Seconds(),
		PodsPerSecond:         perSec(r.podsFinished, r.wall()),
		JobDurationP50Seconds: measure.Percentile(r.jobTimes, 50).Seconds(),
		JobDurationMaxSeconds: measure.Percentile(r.jobTimes, 100).Seconds(),
		APICalls:              r.calls.total(),
		APICallsByMethod:      map[string]int64{},
		Conflicts:             r.calls.code("409"),
		CallsPerPod:           per(r.calls.total(), r.podsFinished),
		CallsPerFailure:       per(r.calls.total(), r.podFailures),
		latencyP50:            measure.Percentile(counted, 50),
		latencyP99:            measure.Percentile(counted, 99),
	}
	cr.SyncLatencyP50Ms, cr.SyncLatencyP99Ms = ms(cr.latencyP50), ms(cr.latencyP99)
	for k, v := range r.calls {
		cr.APICallsByMethod[k.method] += v
	}
	if t.cpuOK {
		cpu := (t.cpuAfter - t.cpuBefore).Seconds()
		cr.CPUSeconds = &cpu
		if r.podsFinished > 0 {
			per1000 := cpu / float64(r.podsFinished) * 1000
			cr.CPUSecondsPer1000Pods = &per1000
		}
	}
	if t.peakRSS > 0 {
		mib := float64(t.peakRSS) / (1 << 20)
		cr.PeakRSSMiB = &mib
	}
	if len(r.doomed) > 0 {
		var wasted []time.Duration
		var total time.Duration
		for _, d := range r.doomed {
			cr.failureToTarget = append(cr.failureToTarget, d.toTarget)
			cr.toDeletion = append(cr.toDeletion, d.toLastDeletion)
			wasted = append(wasted, d.wasted)
			total += d.wasted
		}
		cr.DoomedJobs = len(r.doomed)
		cr.FailureToTargetP50Ms = ms(measure.Percentile(cr.failureToTarget, 50))
		cr.FailureToTargetMaxMs = ms(measure.Percentile(cr.failureToTarget, 100))
		cr.FailureToLastDeletionP50Ms = ms(measure.Percentile(cr.toDeletion, 50))
		cr.FailureToLastDeletionMaxMs = ms(measure.Percentile(cr.toDeletion, 100))
		cr.WastedPodSeconds = total.Seconds()
		cr.WastedPodSecondsPerJobP50 = measure.Percentile(wasted, 50).Seconds()
	}
	return cr
}

// report prints both controllers side by side with the ratios coroner / built-in and
// the goals, and writes the JSON report.
func report(c config, w workload, ts []*target, mode, version string, problems []string) error {
	a, b := ts[0], ts[1]
	ra, rb := summarize(a), summarize(b)
	ratios := map[string]float64{}
	ratio := func(key string, x, y float64) string {
		if x == 0 {
			return "n/a"
		}
		if key != "" {
			ratios[key] = y / x
		}
		return fmt.Sprintf("%.2f", y/x)
	}

	tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "preset %s\t%s\t%s\t%s/%s\t\n", c.preset, a.name, b.name, b.name, a.name)
	row := func(label, va, vb, r string) { fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t\n", label, va, vb, r) }
	num := func(label, key string, x, y float64, format string) {
		row(label, fmt.Sprintf(format, x), fmt.Sprintf(format, y), ratio(key, x, y))
	}
	dur := func(label, key string, x, y time.Duration) {
		row(label, fmtDur(x), fmtDur(y), ratio(key, float64(x), float64(y)))
	}
	callRow := func(label string, f func(cs calls) int64) {
		x, y := f(a.res.calls), f(b.res.calls)
		row(label, fmt.Sprint(x), fmt.Sprint(y), ratio("", float64(x), float64(y)))
	}
	num("Jobs", "", float64(ra.Jobs), float64(rb.Jobs), "%.0f")
	num("pods finished", "", float64(ra.PodsFinished), float64(rb.PodsFinished), "%.0f")
	num("  of which failed", "", float64(ra.PodFailures), float64(rb.PodFailures), "%.0f")
	dur("wall time", "wallSeconds", a.res.wall(), b.res.wall())
	num("throughput (pods/s)", "podsPerSecond", ra.PodsPerSecond, rb.PodsPerSecond, "%.2f")
	dur("Job duration p50", "", measure.Percentile(a.res.jobTimes, 50), measure.Percentile(b.res.jobTimes, 50))
	dur("Job duration max", "", measure.Percentile(a.res.jobTimes, 100), measure.Percentile(b.res.jobTimes, 100))
	callRow("API calls", calls.total)
	for _, m := range []string{"GET", "POST", "PUT", "PATCH", "DELETE"} {
		callRow("  "+m, func(cs calls) int64 { return cs.method(m) })
	}
	callRow("  JobRecord calls", calls.jobRecords)
	callRow("  answered 409 Conflict", func(cs calls) int64 { return cs.code("409") })
	num("API calls per pod", "callsPerPod", ra.CallsPerPod, rb.CallsPerPod, "%.2f")
	num("API calls per pod failure", "callsPerFailure", ra.CallsPerFailure, rb.CallsPerFailure, "%.2f")
	optional := func(label, key string, x, y *float64, format string) {
		if x == nil || y == nil {
			row(label, "n/a", "n/a", "n/a")
			return
		}
		num(label, key, *x, *y, format)
	}
	optional("controller CPU time (s)", "cpuSeconds", ra.CPUSeconds, rb.CPUSeconds, "%.1f")
	optional("  CPU s per 1,000 pods", "cpuSecondsPer1000Pods", ra.CPUSecondsPer1000Pods, rb.CPUSecondsPer1000Pods, "%.2f")
	optional("controller peak RSS (MiB)", "peakRSSMiB", ra.PeakRSSMiB, rb.PeakRSSMiB, "%.0f")
	dur("sync latency p50", "syncLatencyP50Ms", ra.latencyP50, rb.latencyP50)
	dur("sync latency p99", "syncLatencyP99Ms", ra.latencyP99, rb.latencyP99)
	for _, k := range []struct {
		kind  podKind
		label string
	}{{podSucceeded, "succeeded pods"}, {podFailIndex, "FailIndex pods (exit 42)"}, {podFailJob, "FailJob pods (exit 43)"}, {podRetried, "retried pods (exit 1), with backoff"}} {
		if len(a.res.lat[k.kind])+len(b.res.lat[k.kind]) == 0 {
			continue
		}
		num("  "+k.label, "", float64(len(a.res.lat[k.kind])), float64(len(b.res.lat[k.kind])), "%.0f")
		dur("    p50", "", measure.Percentile(a.res.lat[k.kind], 50), measure.Percentile(b.res.lat[k.kind], 50))
		dur("    p99", "", measure.Percentile(a.res.lat[k.kind], 99), measure.Percentile(b.res.lat[k.kind], 99))
	}
	if len(a.res.replaceLat)+len(b.res.replaceLat) > 0 {
		dur("    failure -> replacement p50", "", measure.Percentile(a.res.replaceLat, 50), measure.Percentile(b.res.replaceLat, 50))
		dur("    failure -> replacement p99", "", measure.Percentile(a.res.replaceLat, 99), measure.Percentile(b.res.replaceLat, 99))
	}
	if ra.DoomedJobs+rb.DoomedJobs > 0 {
		num("Jobs ended by one pod's failure", "", float64(ra.DoomedJobs), float64(rb.DoomedJobs), "%.0f")
		dur("  failure -> FailureTarget p50", "failureToTargetP50Ms", measure.Percentile(ra.failureToTarget, 50), measure.Percentile(rb.failureToTarget, 50))
		dur("  failure -> FailureTarget max", "failureToTargetMaxMs", measure.Percentile(ra.failureToTarget, 100), measure.Percentile(rb.failureToTarget, 100))
		dur("  failure -> other pods deleted p50", "failureToLastDeletionP50Ms", measure.Percentile(ra.toDeletion, 50), measure.Percentile(rb.toDeletion, 50))
		dur("  failure -> other pods deleted max", "failureToLastDeletionMaxMs", measure.Percentile(ra.toDeletion, 100), measure.Percentile(rb.toDeletion, 100))
		num("  wasted pod-seconds, total", "wastedPodSeconds", ra.WastedPodSeconds, rb.WastedPodSeconds, "%.1f")
		num("  wasted pod-seconds per Job p50", "wastedPodSecondsPerJobP50", ra.WastedPodSecondsPerJobP50, rb.WastedPodSecondsPerJobP50, "%.2f")
	}
	tw.Flush()
	fmt.Println()

	goals := []goal{
		{What: "throughput (pods/s)", Want: fmt.Sprintf(">= %.2f", goalThroughput), Ratio: ratios["podsPerSecond"]},
		{What: "API calls per pod", Want: fmt.Sprintf("<= %.2f", goalCallsPerPod), Ratio: ratios["callsPerPod"]},
	}
	goals[0].Met = goals[0].Ratio >= goalThroughput
	goals[1].Met = goals[1].Ratio <= goalCallsPerPod
	for _, g := range []struct{ what, key string }{{"CPU seconds per 1,000 pods", "cpuSecondsPer1000Pods"}, {"peak RSS", "peakRSSMiB"}} {
		if r, ok := ratios[g.key]; ok {
			goals = append(goals, goal{What: g.what, Want: fmt.Sprintf("<= %.2f", goalCPUAndMemory), Ratio: r, Met: r <= goalCPUAndMemory})
		}
	}
	var gs []string
	for _, g := range goals {
		state := "met"
		if !g.Met {
			state = "MISSED"
		}
		gs = append(gs, fmt.Sprintf("%s %.2f (want %s) %s", g.What, g.Ratio, g.Want, state))
	}
	fmt.Printf("goals, coroner / built-in: %s\n", strings.Join(gs, "; "))
	fmt.Printf("run: preset %s, %s; %d Jobs x %d completions (parallelism %d) per controller; backoffLimitPerIndex %s, maxFailedIndexes %s; indexes failing once with exit 1: %d, FailIndex (exit 42): %d, FailJob (exit 43): %d; pods Running after %v, finished after %v more (the other pods of a Job ended by one failure: %v); both controllers with client QPS %v, burst %d, %d workers\n",
		c.preset, mode, w.jobs, w.completions, min(w.parallelism, w.completions), optInt(w.perIndex), optInt(w.maxFailedIndexes),
		countPlan(w, exitFailOnce), countPlan(w, exitFailIndex), countPlan(w, exitFailJob), c.startDelay, c.runTime, c.longRunTime, c.qps, c.burst, c.workers)
	fmt.Println("ratios: coroner / built-in; above 1 means coroner's number is higher (better for throughput, worse for time, calls, CPU, memory and latency)")
	fmt.Println("wall time: first Job created -> last Job seen finished by a watch; throughput: pods finished / wall time")
	fmt.Printf("API calls: every request of the controller's client in the window (first Job created -> %v after the last Job of the round finished); built-in: kube-controller-manager's rest_client_requests_total + rest_client_request_retries_total from its /metrics; coroner: a counting RoundTripper on its client; per pod failure: calls / pod failures of the workload\n", settle)
	fmt.Println("CPU: user+system time of the controller's process over the same window (/proc/PID/stat); peak RSS: VmHWM of /proc/PID/status at the end (kube-controller-manager runs only its Job controller)")
	fmt.Println("sync latency: terminal pod status write acknowledged -> a watch delivers the Job whose status counts the pod (its index in completedIndexes; for a failure, status.failed after the pod's UID left uncountedTerminatedPods.failed); p50/p99 over succeeded, FailIndex and FailJob pods; a retried pod (exit 1) is counted only once its replacement exists, after the per-index backoff (KEP-3850), so its latency is shown apart")
	if ra.DoomedJobs+rb.DoomedJobs > 0 {
		fmt.Println("Jobs ended by one pod's failure (FailJob, or FailIndex with maxFailedIndexes 0): from the acknowledged terminal status of that pod to a watch delivering the Job with FailureTarget True, and to the last of its other pods seen with a deletionTimestamp; wasted pod-seconds: the time the other pods ran on after the failure, summed")
	}
	for _, t := range ts {
		if t.res.early > 0 {
			fmt.Printf("note: %s: %d pods counted before their write was acknowledged (latency 0)\n", t.name, t.res.early)
		}
		if t.res.late > 0 {
			fmt.Printf("note: %s: %d failed pods were seen counted only when every failure of their Job was (the watch restarted and missed a status); their latency is an upper bound\n", t.name, t.res.late)
		}
	}

	rep := jsonReport{
		Preset:        c.preset,
		Finished:      time.Now().UTC(),
		Mode:          mode,
		KubeAPIServer: version,
		Workload: map[string]any{
			"jobs": w.jobs, "completions": w.completions, "parallelism": min(w.parallelism, w.completions),
			"backoffLimitPerIndex": w.perIndex, "maxFailedIndexes": w.maxFailedIndexes,
			"failOnceIndexes": countPlan(w, exitFailOnce), "failIndexIndexes": countPlan(w, exitFailIndex), "failJobPods": countPlan(w, exitFailJob),
			"startDelaySeconds": c.startDelay.Seconds(), "runTimeSeconds": c.runTime.Seconds(), "longRunTimeSeconds": c.longRunTime.Seconds(),
			"qps": c.qps, "burst": c.burst, "workers": c.workers, "coroner": c.coroner,
		},
		Machine:       machineInfo(),
		Controllers:   []controllerReport{ra, rb},
		Ratios:        ratios,
		Goals:         goals,
		OutcomesAgree: len(problems) == 0,
		Problems:      problems,
	}
	rep.Machine.Note = c.machineNote
	dir := c.jsonDir
	if dir == "" {
		root, err := host.RepoRoot()
		if err != nil {
			return err
		}
		dir = filepath.Join(root, "_output", "bench")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	out, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	path := filepath.Join(dir, "shim-"+c.preset+".json")
	if err := os.WriteFile(path, append(out, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Printf("json: %s\n", path)
	return nil
}

func optInt(n int) string {
	if n < 0 {
		return "unset"
	}
	return strconv.Itoa(n)
}
