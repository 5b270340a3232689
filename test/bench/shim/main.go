// Command shim is the P1 benchmark, run by `make bench-shim`: coroner's Job controller
// (package shim/controller) against the built-in Job controller of kube-controller-manager
// v1.36.3, on one real API server (test/harness), with the same workload, in one run. It
// is not a test.
//
// Both controllers run at the same time by default, each on its own namespace of the same
// API server: the noise of the machine (other processes, CPU frequency, etcd's compaction
// and a growing etcd) then hits both alike, and the ratios printed at the end compare two
// runs that saw the same conditions. The price is that they compete for the API server
// and the CPU, so the competition is made fair: the same client rate limits, the same
// number of workers, the Jobs of both created at the same moment, one simulated kubelet
// that serves both, and each controller in a process of its own. --sequential runs the
// built-in controller's workload first, then coroner's, for comparison.
//
// The controllers:
//
//   - built-in: kube-controller-manager with --controllers=job, started by this program
//     with the flags of harness.Env.StartControllerManager plus its client's rate limits
//     (--kube-api-qps, --kube-api-burst) and access to /metrics, which that helper does
//     not offer (nor does it say its port). Its Jobs have no spec.managedBy.
//   - coroner: shim.NewControllers(ctx, client, shim.Config{Jobs: controller.Config{Workers:
//     5, Records}}).Run (the Job controller with its JobRecords unless -no-job-records, and
//     node-failure recovery, as coroner-shim runs them), otherwise with coroner-shim's
//     defaults (managedBy coroner.dev/shim, 1s pod event batching, 10s
//     doubling pod backoff); its Jobs have spec.managedBy coroner.dev/shim. By default it
//     runs in a child process, this program started again (childMain), like
//     kube-controller-manager in a process of its own; --coroner=in-process runs it inside
//     this program instead, where it shares the Go runtime and two cores with the
//     simulated kubelet, which handles both controllers' pods, and falls behind in bursts:
//     the API server then closes its pod watch for unresponsiveness more often than
//     kube-controller-manager's (seen as extra GETs: the re-established watches).
//
// Both get the same client QPS and burst (coroner-shim's defaults, 50 and 100, rather
// than kube-controller-manager's 20 and 30) and the same number of workers
// (--concurrent-job-syncs), so that the comparison measures the controllers, not their
// settings.
//
// The workload: --jobs Indexed Jobs per controller, each with --completions completions
// and as much parallelism, backoffLimitPerIndex 1 and the podFailurePolicy
// [FailIndex on exit code 42, Ignore on DisruptionTarget]. There is no scheduler and no
// kubelet: this program binds every new pod to the Node bench-node (which it creates, so
// that nothing takes the pods for orphans), moves it to Running after --start-delay, and
// after --run-time to Succeeded or Failed, through strategic merge patches of the status
// as the kubelet writes them. The exit code of a pod is a function of the Job's number,
// its index and how many pods of that index ran before, so both controllers see the same
// pod histories: about --fail-once-pct percent of the indexes fail once with exit code 1
// (no rule matches: counted against backoffLimitPerIndex, replaced after the 10s
// per-index backoff, then succeeding), and --fail-index-pct percent of the Jobs lose one
// index to exit code 42 (FailIndex: the Job ends Failed with reason FailedIndexes once
// every other index is done). Before measuring, one single-pod warm-up Job per
// controller runs to completion, so that both are known to be up with warm caches.
//
// What is measured, per controller:
//
//   - wall time from just before its first Job is created to the moment a watch delivers
//     its last Job with a terminal condition (Complete or Failed); throughput is pods
//     finished (terminal status written by the simulated kubelet) per second of it.
//   - API calls: every request the controller's client sends during the measured window
//     (from just before the first Job is created to 2s after the last Job of the round
//     finished), by HTTP method and status code. For coroner, a counting
//     http.RoundTripper wraps its client's transport (rest.Config.Wrap) and counts every
//     attempt. For kube-controller-manager, its /metrics is scraped at both ends of the
//     window: rest_client_requests_total (a request's final attempt) plus
//     rest_client_request_retries_total (the attempts before it), over every label, which
//     counts what client-go sends the way the RoundTripper does. The API server's
//     apiserver_request_total would be one method for both but has no user-agent label,
//     so it cannot tell the controllers from each other or from this program. "Per pod
//     failure" divides by the pod failures of the workload (the same for both), so its
//     ratio is the ratio of the totals. The CPU time of each controller's process over
//     the window is shown too (from /proc; not available with --coroner=in-process).
//   - sync latency: from the moment the API server acknowledged a pod's terminal status
//     written by the simulated kubelet to the moment a watch delivers the Job with a
//     status that counts the pod: its index in status.completedIndexes for a success;
//     for a failure, status.failed after the pod's UID has left
//     status.uncountedTerminatedPods.failed (the job-tracking protocol: the UID is
//     recorded there, the finalizer removed, then the pod moves to the counter). Both
//     controllers batch pod events for 1s before a sync, which sets the floor. A retried
//     pod (exit 1) is counted only once its replacement exists (KEP-3850), after the 10s
//     per-index backoff, so its latency is shown apart, with the time from its failure
//     to its replacement.
//
// Presets (--preset) set the workload and the client rates for the sizes batch users run
// (issue 14); flags given beside a preset override its values. --preset all runs each
// preset of the set `make bench` uses, one after the other, each on a fresh API server:
//
//   - small: the workload above, 20 Jobs x 10 completions (the default).
//   - indexed-10k: one Indexed Job of 10,000 completions, parallelism 500,
//     backoffLimitPerIndex 2, 30% of the indexes failing once then succeeding.
//   - failjob-500: 500 Jobs of 5 pods, a FailJob rule (exit 43) hit by 10% of the Jobs;
//     the other pods of such a Job run long and must be stopped by the controller.
//   - indexed-100k: one Indexed Job of 100,000 completions that succeeds, parallelism
//     1,000. Not in "all": at the ~36 pods/s per controller measured with both side by
//     side on 2 shared cores it would take about 46 minutes; indexed-10k (6 minutes there)
//     is the largest that fits a few minutes on such a machine.
//   - failfast: 20 Jobs x 10 pods, each ended by one pod's failure, FailJob in half of
//     them and FailIndex with maxFailedIndexes 0 in the others: the time from the failure
//     to FailureTarget and to the deletion of the other pods, and the pod-seconds those
//     pods ran on.
//
// Also measured: each controller process's CPU time per 1,000 pods and peak RSS (VmHWM);
// with --profile-dir, coroner's CPU profile and both processes' heap profiles. Every
// run writes its figures to _output/bench/shim-<preset>.json (--json-dir).
//
// Finally the outcomes are compared: for every Job number, the final Job of each
// controller (terminal condition type and reason, every True condition, succeeded,
// failed, active, ready, terminating, completedIndexes, failedIndexes,
// uncountedTerminatedPods, pods run, pods deleted) must agree with the other
// controller's and with what the workload implies; a mismatch is an error (exit status
// 1) after the table is printed.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/coroner-dev/coroner/test/bench/measure"
)

func main() {
	if spec := os.Getenv(childEnv); spec != "" {
		os.Exit(childMain(spec))
	}
	// Two passes: the first learns the preset, the second applies the flags given over
	// the preset's values.
	probe := defaultConfig()
	fs := flagSet(&probe)
	fs.Usage = func() { usage(fs) }
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	names := []string{probe.preset}
	if probe.preset == presetAll {
		names = allPresets
	}
	var configs []config
	for _, name := range names {
		c := defaultConfig()
		p, ok := presetByName(name)
		if !ok {
			fmt.Fprintf(os.Stderr, "bench-shim: --preset=%q: want one of %s\n", name, presetNames())
			os.Exit(2)
		}
		p.apply(&c)
		c.preset = name
		fs := flagSet(&c)
		_ = fs.Parse(os.Args[1:])
		c.preset = name
		if err := c.validate(fs); err != nil {
			fmt.Fprintf(os.Stderr, "bench-shim: preset %s: %v\n", name, err)
			os.Exit(2)
		}
		configs = append(configs, c)
	}
	if probe.coroner == coronerInProcess {
		measure.QuietKlog(probe.logFile, probe.logV)
	} else {
		measure.QuietKlog("", 0) // the child process writes coroner's logs to --log-file
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	var failed []string
	for i, c := range configs {
		if len(configs) > 1 {
			fmt.Printf("== preset %s (%d of %d)\n", c.preset, i+1, len(configs))
		}
		start := time.Now()
		err := run(ctx, c)
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench-shim: preset %s: %s\n", c.preset, strings.ReplaceAll(err.Error(), "\n", "\n  "))
			failed = append(failed, c.preset)
			if ctx.Err() != nil {
				break
			}
		}
		fmt.Printf("preset %s took %v\n\n", c.preset, time.Since(start).Round(time.Second))
	}
	cancel()
	klog.Flush()
	if len(failed) > 0 {
		fmt.Fprintf(os.Stderr, "bench-shim: failed: %s\n", strings.Join(failed, ", "))
		os.Exit(1)
	}
}

func flagSet(c *config) *flag.FlagSet {
	fs := flag.NewFlagSet("bench-shim", flag.ContinueOnError)
	fs.StringVar(&c.preset, "preset", c.preset, "workload preset: "+presetNames()+"; "+presetAll+" runs "+strings.Join(allPresets, ", ")+" one after the other; flags given beside it override the preset's values")
	fs.IntVar(&c.jobs, "jobs", c.jobs, "Indexed Jobs per controller (N)")
	fs.IntVar(&c.completions, "completions", c.completions, "completions of each Job (C)")
	fs.IntVar(&c.parallelism, "parallelism", c.parallelism, "parallelism of each Job; 0: as many as completions")
	fs.IntVar(&c.perIndex, "backoff-limit-per-index", c.perIndex, "spec.backoffLimitPerIndex of each Job; negative: unset (global backoffLimit 6, no FailIndex rule)")
	fs.IntVar(&c.maxFailedIndexes, "max-failed-indexes", c.maxFailedIndexes, "spec.maxFailedIndexes of each Job; negative: unset")
	fs.IntVar(&c.failOncePct, "fail-once-pct", c.failOncePct, "percentage of indexes whose first pod fails with exit code 1 (retried once, then succeeds)")
	fs.IntVar(&c.failIndexPct, "fail-index-pct", c.failIndexPct, "percentage of Jobs with one index whose pod fails with exit code 42 (FailIndex; the Job ends Failed)")
	fs.IntVar(&c.failJobPct, "fail-job-pct", c.failJobPct, "percentage of Jobs with one pod failing with exit code 43 (FailJob)")
	fs.DurationVar(&c.startDelay, "start-delay", c.startDelay, "how long a bound pod stays Pending before the simulated kubelet makes it Running")
	fs.DurationVar(&c.runTime, "run-time", c.runTime, "how long a pod stays Running before it finishes")
	fs.DurationVar(&c.longRunTime, "long-run-time", c.longRunTime, "how long the other pods of a Job ended by one pod's failure would run: the controller must stop them")
	fs.Float64Var(&c.qps, "kube-api-qps", c.qps, "client QPS of both controllers")
	fs.IntVar(&c.burst, "kube-api-burst", c.burst, "client burst of both controllers")
	fs.BoolVar(&c.noJobRecords, "no-job-records", c.noJobRecords, "run coroner's controller without its JobRecords (--job-records=false), to measure what they cost")
	fs.IntVar(&c.workers, "workers", c.workers, "Jobs synced concurrently by each controller (coroner's Workers, kube-controller-manager's --concurrent-job-syncs)")
	fs.StringVar(&c.coroner, "coroner", c.coroner, "where coroner's controller runs: \"process\", a child process of its own (this program again), like kube-controller-manager; or \"in-process\", inside this program, next to the simulated kubelet")
	fs.BoolVar(&c.sequential, "sequential", c.sequential, "run the built-in controller's workload first, then coroner's, instead of both at the same time")
	fs.DurationVar(&c.timeout, "timeout", c.timeout, "how long the Jobs of a controller may take to finish before the run fails")
	fs.DurationVar(&c.startTimeout, "start-timeout", c.startTimeout, "how long the warm-up (both controllers up, one Job each) may take")
	fs.StringVar(&c.logFile, "log-file", c.logFile, "write coroner's controller logs (klog) to this file; default: no logs (kube-controller-manager logs to the harness's directory, kept with CORONER_HARNESS_KEEP=1)")
	fs.IntVar(&c.logV, "log-v", c.logV, "klog verbosity of coroner's controller logs")
	fs.StringVar(&c.jsonDir, "json-dir", c.jsonDir, "where to write shim-<preset>.json; default <repository>/_output/bench")
	fs.StringVar(&c.profileDir, "profile-dir", c.profileDir, "write coroner's CPU profile (coroner-cpu.pprof) and both controllers' heap profiles at the end of the round (<name>-heap.pprof) here")
	fs.StringVar(&c.machineNote, "machine-note", c.machineNote, "a note on the machine's state for the JSON report (say, other load)")
	return fs
}

func usage(fs *flag.FlagSet) {
	out := fs.Output()
	// To stderr, before exiting 2: nowhere else to tell a failed write.
	_, _ = fmt.Fprint(out, `Usage: go run ./test/bench/shim [flags]

P1: coroner's Job controller vs the built-in Job controller of kube-controller-manager
v1.36.3, on one real etcd + kube-apiserver (test/harness; binaries from `+"`make tools`"+` in
_output/bin or $CORONER_BIN_DIR), with the same workload, by default at the same time.

The program plays the kubelet for N Indexed Jobs per controller (completions C,
podFailurePolicy FailIndex on exit 42 when backoffLimitPerIndex is set, FailJob on exit 43,
Ignore on DisruptionTarget); the same pods fail once (exit 1), fail their index (exit 42)
or fail the Job (exit 43) under both controllers. It prints, side by side, wall time and
throughput (pods finished per second), API calls made by each controller (per pod and per
pod failure), each controller process's CPU time per 1,000 pods and peak RSS, the sync
latency from a pod's terminal status write to the Job status counting it (p50, p99), and
for Jobs ended by one failure the time to FailureTarget and to the other pods' deletion,
with the ratios coroner / built-in, and writes them to _output/bench/shim-<preset>.json.
Both controllers' final Jobs must agree with each other and with the workload, else the
run fails. Exit status 0 on success, 1 on an error or a mismatch, 2 on bad flags.

Presets: `+presetHelp()+`

Flags:
`)
	fs.PrintDefaults()
}

// config is the benchmark's settings, from a preset and flags.
type config struct {
	preset                                string
	jobs, completions, parallelism        int
	perIndex, maxFailedIndexes            int
	failOncePct, failIndexPct, failJobPct int
	startDelay, runTime, longRunTime      time.Duration
	qps                                   float64
	burst, workers                        int
	noJobRecords                          bool
	sequential                            bool
	coroner                               string
	timeout, startTimeout                 time.Duration
	logFile                               string
	logV                                  int
	jsonDir, profileDir, machineNote      string
}

func defaultConfig() config {
	return config{
		preset:           "small",
		jobs:             20,
		completions:      10,
		perIndex:         1,
		maxFailedIndexes: -1,
		failOncePct:      20,
		failIndexPct:     25,
		startDelay:       100 * time.Millisecond,
		runTime:          time.Second,
		longRunTime:      time.Minute,
		qps:              50,
		burst:            100,
		workers:          5,
		coroner:          coronerProcess,
		timeout:          4 * time.Minute,
		startTimeout:     2 * time.Minute,
	}
}

func (c config) workload() workload {
	par := c.parallelism
	if par <= 0 {
		par = c.completions
	}
	return workload{jobs: c.jobs, completions: c.completions, parallelism: par, perIndex: c.perIndex,
		maxFailedIndexes: c.maxFailedIndexes, failOncePct: c.failOncePct, failIndexPct: c.failIndexPct, failJobPct: c.failJobPct}
}

// maxCompletionsPerIndex is the API server's limit on completions for a Job with
// backoffLimitPerIndex; maxCompletions the benchmark's own otherwise.
const (
	maxCompletionsPerIndex = 100000
	maxCompletions         = 100000
)

func (c config) validate(fs *flag.FlagSet) error {
	var errs []error
	if fs.NArg() > 0 {
		errs = append(errs, fmt.Errorf("unexpected arguments %q", fs.Args()))
	}
	if c.jobs < 1 || c.jobs > 999 {
		errs = append(errs, fmt.Errorf("--jobs=%d: want 1 to 999", c.jobs))
	}
	if c.completions < 1 || c.completions > maxCompletions {
		errs = append(errs, fmt.Errorf("--completions=%d: want 1 to %d", c.completions, maxCompletions))
	}
	if c.parallelism < 0 {
		errs = append(errs, fmt.Errorf("--parallelism=%d: must not be negative", c.parallelism))
	}
	if c.failOncePct < 0 || c.failOncePct > 100 || c.failIndexPct < 0 || c.failIndexPct > 100 || c.failJobPct < 0 || c.failJobPct > 100 {
		errs = append(errs, fmt.Errorf("--fail-once-pct=%d, --fail-index-pct=%d, --fail-job-pct=%d: want percentages, 0 to 100", c.failOncePct, c.failIndexPct, c.failJobPct))
	}
	if c.failIndexPct > 0 && c.perIndex < 0 {
		errs = append(errs, fmt.Errorf("--fail-index-pct=%d needs --backoff-limit-per-index (FailIndex rules need it)", c.failIndexPct))
	}
	w := c.workload()
	doomed := false
	for j := range c.jobs {
		doomed = doomed || w.doomIndex(j) >= 0
	}
	if doomed && (w.parallelism < w.completions || c.failOncePct > 0) {
		errs = append(errs, fmt.Errorf("a Job ended by one pod's failure (FailJob, or FailIndex with --max-failed-indexes=0) needs parallelism = completions and --fail-once-pct=0, so that its pods' history does not depend on timing"))
	}
	if c.startDelay < 0 || c.runTime < 0 || c.longRunTime < 0 {
		errs = append(errs, fmt.Errorf("--start-delay=%v, --run-time=%v, --long-run-time=%v: must not be negative", c.startDelay, c.runTime, c.longRunTime))
	}
	if c.qps <= 0 || float64(c.burst) < c.qps {
		errs = append(errs, fmt.Errorf("--kube-api-qps=%v, --kube-api-burst=%d: need 0 < qps <= burst", c.qps, c.burst))
	}
	if c.workers < 1 {
		errs = append(errs, fmt.Errorf("--workers=%d: want at least 1", c.workers))
	}
	if c.coroner != coronerProcess && c.coroner != coronerInProcess {
		errs = append(errs, fmt.Errorf("--coroner=%q: want %q or %q", c.coroner, coronerProcess, coronerInProcess))
	}
	if c.timeout <= 0 || c.startTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--timeout=%v, --start-timeout=%v: must be positive", c.timeout, c.startTimeout))
	}
	return errors.Join(errs...)
}
