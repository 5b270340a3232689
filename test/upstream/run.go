package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"
)

// suite runs upstream's e2e binary (test/tools/e2eapps, built by build.sh e2e-upstream).
type suite struct {
	binary     string
	kubeconfig string
	seed       int
	// timeout is Ginkgo's limit per spec process (--ginkgo.timeout); the process is
	// signalled a minute after it if still there, and killed a minute later.
	timeout time.Duration
}

// args are the flags of every run: the lab notes' set (no cloud provider, no waiting for
// nodes or system pods, no image pre-pulling) and the seed.
func (s suite) args(focus, report string) []string {
	return []string{
		"--provider=skeleton",
		"--kubeconfig=" + s.kubeconfig,
		"--ginkgo.focus=" + focus,
		"--allowed-not-ready-nodes=-1",
		"--prepull-images=false",
		"--minStartupPods=0",
		fmt.Sprintf("--ginkgo.seed=%d", s.seed),
		"--ginkgo.json-report=" + report,
		"--ginkgo.no-color",
	}
}

// list asks Ginkgo which specs focus selects (a dry run: nothing touches the cluster).
func (s suite) list(ctx context.Context, focus, dir string) ([]spec, error) {
	report := filepath.Join(dir, "list.json")
	args := append(s.args(focus, report), "--ginkgo.dry-run")
	out, err := exec.CommandContext(ctx, s.binary, args...).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("%s --ginkgo.dry-run: %w\n%s", s.binary, err, tail(string(out), 2000))
	}
	reports, err := readReport(report)
	if err != nil {
		return nil, err
	}
	var specs []spec
	for _, r := range reports {
		if r.State == "skipped" || r.State == "pending" {
			continue // not selected by focus
		}
		specs = append(specs, spec{Name: r.name(), Labels: r.labels()})
	}
	if len(specs) == 0 {
		return nil, fmt.Errorf("the dry run with --ginkgo.focus=%s selected no spec", focus)
	}
	return specs, nil
}

// outcome is one spec's run in one pass.
type outcome struct {
	// State is Ginkgo's: passed, failed, timedout, interrupted, panicked, ...; or "error"
	// when the process left no report.
	State    string        `json:"state"`
	Took     time.Duration `json:"tookNs"`
	Failure  string        `json:"failure,omitempty"`
	Location string        `json:"location,omitempty"`
	Log      string        `json:"log"`
}

func (o outcome) passed() bool { return o.State == "passed" }

// run runs one spec (the i-th) in a process of its own; its output goes to
// dir/<i>-<slug>.log, Ginkgo's report to .json beside it.
func (s suite) run(ctx context.Context, i int, sp spec, dir string) outcome {
	slug := fmt.Sprintf("%02d-%s", i+1, slugify(sp.Name))
	report := filepath.Join(dir, slug+".json")
	logPath := filepath.Join(dir, slug+".log")
	o := outcome{Log: logPath}
	_ = os.Remove(report)
	logf, err := os.Create(logPath)
	if err != nil {
		return outcome{State: "error", Failure: err.Error()}
	}
	defer logf.Close()
	args := append(s.args(sp.focus(), report), "--ginkgo.v", "--ginkgo.timeout="+s.timeout.String())
	pctx, cancel := context.WithTimeout(ctx, s.timeout+time.Minute)
	defer cancel()
	cmd := exec.CommandContext(pctx, s.binary, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Interrupted (ours or the parent's), Ginkgo runs the spec's cleanup (the namespace's
	// deletion) before it exits; a minute later it is killed.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = time.Minute
	start := time.Now()
	runErr := cmd.Run()
	o.Took = time.Since(start)
	all, err := readReport(report)
	// The report lists the suite's every spec; the others were skipped by the focus.
	var reports []ginkgoSpecReport
	ran := 0
	for _, r := range all {
		if r.name() == sp.Name {
			reports = append(reports, r)
		}
		if r.State != "skipped" {
			ran++
		}
	}
	switch {
	case err != nil:
		o.State, o.Failure = "error", fmt.Sprintf("no report (%v; exit: %v)", err, runErr)
	case len(reports) != 1 || ran > 1:
		o.State, o.Failure = "error", fmt.Sprintf("the report has %d specs of this name and %d run, want 1 and at most 1", len(reports), ran)
	default:
		r := reports[0]
		o.State = r.State
		if r.Failure != nil {
			o.Failure = firstLines(r.Failure.Message, 3)
			o.Location = fmt.Sprintf("%s:%d", filepath.Base(r.Failure.Location.FileName), r.Failure.Location.LineNumber)
		}
		if pctx.Err() != nil && ctx.Err() == nil {
			o.Failure = strings.TrimSpace(o.Failure + " (process killed after " + (s.timeout + time.Minute).String() + ")")
		}
	}
	if ctx.Err() != nil && !o.passed() {
		o.State = "interrupted"
	}
	return o
}

// runAll runs the specs, parallel at a time, and returns their outcomes in the specs' order.
// progress is called as each one ends.
func (s suite) runAll(ctx context.Context, specs []spec, dir string, parallel int, progress func(spec, outcome)) ([]outcome, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	out := make([]outcome, len(specs))
	next := make(chan int)
	var wg sync.WaitGroup
	var mu sync.Mutex
	for range max(parallel, 1) {
		wg.Go(func() {
			for i := range next {
				o := s.run(ctx, i, specs[i], dir)
				out[i] = o
				mu.Lock()
				progress(specs[i], o)
				mu.Unlock()
			}
		})
	}
	for i := range specs {
		if ctx.Err() != nil {
			break
		}
		next <- i
	}
	close(next)
	wg.Wait()
	for i := range out {
		if out[i].State == "" {
			out[i].State = "not run"
		}
	}
	if err := ctx.Err(); err != nil {
		return out, errors.Join(errors.New("interrupted"), err)
	}
	return out, nil
}

var nonWord = regexp.MustCompile(`[^a-z0-9]+`)

// slugify makes a file name of a spec's text.
func slugify(name string) string {
	s := strings.Trim(nonWord.ReplaceAllString(strings.ToLower(strings.TrimPrefix(name, "[sig-apps] Job ")), "-"), "-")
	if len(s) > 80 {
		s = s[:80]
	}
	return s
}

func firstLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = append(lines[:n], "...")
	}
	return strings.Join(lines, " / ")
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}
