// Command upstream runs upstream's own Job e2e specs (the "[sig-apps] Job" specs of
// k8s.io/kubernetes v1.36.3, test/e2e/apps/job.go) on the lab that is up, twice with the same
// seed: once with the built-in Job controller, once with every Job handed to coroner-shim
// (issue 19, item 2: `make e2e-upstream`). It never brings a lab up or down.
//
// The binary is test/tools/e2eapps, built by `test/tools/build.sh e2e-upstream` into
// _output/bin/e2e-apps.test. The specs are listed by a Ginkgo dry run; those that cannot
// apply on the lab (specs.go) are listed with their reason and not run. Each of the others
// runs in a process of its own (several specs wait 15 minutes for a Job when something is
// wrong) with a time limit, -parallel at a time.
//
// Before the passes, the images the specs name get second names of the lab's images on
// every node (labprep.go). The specs' pods run on the process nodes only: the VM node,
// when the lab has one, is QEMU TCG, 5-10x slower; the lab registers it with a NoSchedule
// taint (lab.coroner.dev/vm), and should it have none, the run adds one
// (coroner.dev/e2e-upstream=slow-vm) for its duration. For the coroner pass a MutatingAdmissionPolicyBinding
// coroner-job-opt-in-e2e binds the lab's opt-in policy coroner-job-opt-in to the e2e
// framework's namespaces (labelled e2e-framework: job); the built-in pass runs without it.
// Both are undone at the end, also when interrupted. A watch on every Job proves each pass
// is what it claims: every Job of the e2e namespaces had managedBy coroner.dev/shim in the
// coroner pass and none in the built-in pass.
//
// It prints the table spec -> built-in / coroner, writes it with every failure message to
// _output/e2e-upstream/results.json (each spec's log and Ginkgo report beside it, per
// pass), and exits 1 when a spec that passes under the built-in controller fails under
// coroner, or when a spec fails under the built-in controller (a broken baseline: the lab
// or a flake, said apart from regressions), or a pass handed the wrong controller a Job;
// 2 when it could not run.
//
//	go run ./test/upstream [-parallel 4] [-timeout 6m] [-seed 1] [-run REGEXP] [-passes built-in,coroner]
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/coroner-dev/coroner/test/lab"
)

type options struct {
	binary   string
	out      string
	parallel int
	timeout  time.Duration
	seed     int
	run      *regexp.Regexp
	passes   []string
	taintVM  bool
}

// The Job specs: everything under SIGDescribe("Job") (Ginkgo matches the suite's
// description, a space and the spec's text).
const jobFocus = `(^| )\[sig-apps\] Job `

func main() { os.Exit(run()) }

func run() int {
	cfg, err := lab.DefaultConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e-upstream:", err)
		return 2
	}
	var o options
	var runRE, passes string
	flag.StringVar(&o.binary, "binary", filepath.Join(cfg.BinDir, "e2e-apps.test"), "upstream's e2e test binary (test/tools/build.sh e2e-upstream)")
	flag.StringVar(&o.out, "out", filepath.Join(cfg.Root, "_output", "e2e-upstream"), "results, logs and Ginkgo reports")
	flag.IntVar(&o.parallel, "parallel", 4, "spec processes at a time")
	flag.DurationVar(&o.timeout, "timeout", 6*time.Minute, "time limit of each spec (Ginkgo's --timeout; its process is killed a minute later)")
	flag.IntVar(&o.seed, "seed", 1, "Ginkgo's seed, the same in both passes")
	flag.StringVar(&runRE, "run", "", "only the specs whose name matches this regexp (the others are listed as not run)")
	flag.StringVar(&passes, "passes", "built-in,coroner", "passes to run, in this order")
	flag.BoolVar(&o.taintVM, "taint-vm", true, "keep the specs off the VM node (a NoSchedule taint for the duration)")
	flag.Parse()
	if runRE != "" {
		if o.run, err = regexp.Compile(runRE); err != nil {
			fmt.Fprintln(os.Stderr, "e2e-upstream: -run:", err)
			return 2
		}
	}
	for _, p := range strings.Split(passes, ",") {
		if p = strings.TrimSpace(p); p != "built-in" && p != "coroner" {
			fmt.Fprintf(os.Stderr, "e2e-upstream: unknown pass %q (built-in, coroner)\n", p)
			return 2
		}
		o.passes = append(o.passes, strings.TrimSpace(p))
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "e2e-upstream: tagging images in the lab's containerds needs root")
		return 2
	}
	if _, err := os.Stat(o.binary); err != nil {
		fmt.Fprintf(os.Stderr, "e2e-upstream: %v: build it with test/tools/build.sh e2e-upstream\n", err)
		return 2
	}
	cfg.Out = os.Stderr
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	if up, err := cfg.IsUp(ctx); err != nil || !up {
		fmt.Fprintf(os.Stderr, "e2e-upstream: no healthy lab is up (%v): start one with `make lab`; this never brings a lab up or down\n", err)
		return 2
	}
	rest, err := cfg.RESTConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e-upstream:", err)
		return 2
	}
	cs, err := kubernetes.NewForConfig(rest)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e-upstream:", err)
		return 2
	}
	r := &runner{o: o, cfg: cfg, cs: cs, opt: optIn{cs: cs}}
	defer r.cleanup()
	s, err := r.runPasses(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e-upstream:", err)
		return 2
	}
	s.printTable(os.Stdout)
	path := filepath.Join(o.out, "results.json")
	if b, err := json.MarshalIndent(s, "", "  "); err == nil {
		err = os.WriteFile(path, append(b, '\n'), 0o644)
		if err != nil {
			fmt.Fprintln(os.Stderr, "e2e-upstream:", err)
		} else {
			fmt.Printf("results, with each spec's log and report: %s\n", cfg.Root+"/"+strings.TrimPrefix(path, cfg.Root+"/"))
		}
	}
	if ctx.Err() != nil {
		return 2
	}
	if len(s.Problems) > 0 {
		return 1
	}
	return 0
}

// runner holds what the passes share, and what cleanup must undo.
type runner struct {
	o   options
	cfg lab.Config
	cs  kubernetes.Interface
	opt optIn

	tainted string // the node slowTaint is on
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s  %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// cleanup removes what the run put on the lab: the binding, the VM node's taint, the probe
// namespace. With a context of its own: it also runs after an interrupt.
func (r *runner) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := r.opt.unbind(ctx); err != nil {
		logf("cleanup: %v", err)
	}
	if r.tainted != "" {
		if err := setTaint(ctx, r.cs, r.tainted, false); err != nil {
			logf("cleanup: the taint of %s: %v", r.tainted, err)
		} else {
			logf("taint %s removed from %s", slowTaint.Key, r.tainted)
		}
	}
	if err := r.opt.removeProbe(ctx); err != nil {
		logf("cleanup: %v", err)
	}
}

func (r *runner) runPasses(ctx context.Context) (summary, error) {
	start := time.Now()
	o := r.o
	s := summary{Seed: o.seed, Parallel: o.parallel, Timeout: o.timeout.String(),
		Census: map[string]jobCensus{}, Passes: map[string]string{}}
	if slices.Contains(o.passes, "coroner") {
		if err := r.opt.check(ctx); err != nil {
			return s, err
		}
	}
	// A binding left by an interrupted run would hand the built-in pass's Jobs to coroner.
	if err := r.opt.unbind(ctx); err != nil {
		return s, err
	}
	if err := waitE2ENamespacesGone(ctx, r.cs, 5*time.Minute); err != nil {
		return s, fmt.Errorf("namespaces of an earlier run: %w", err)
	}
	logf("tagging the specs' images on every node")
	if err := tagImages(ctx, r.cfg); err != nil {
		return s, err
	}
	if vm := lab.VMNode().Name; o.taintVM {
		n, err := r.cs.CoreV1().Nodes().Get(ctx, vm, metav1.GetOptions{})
		i := -1
		if err == nil {
			i = slices.IndexFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Effect == corev1.TaintEffectNoSchedule })
		}
		switch {
		case i >= 0:
			// The lab registers it with lab.coroner.dev/vm=true:NoSchedule.
			logf("%s (the VM node) is tainted %s=%s:%s: the specs' pods stay off it", vm, n.Spec.Taints[i].Key, n.Spec.Taints[i].Value, n.Spec.Taints[i].Effect)
		case err == nil:
			r.tainted = vm
			if err := setTaint(ctx, r.cs, vm, true); err != nil {
				return s, fmt.Errorf("taint %s: %w", vm, err)
			}
			logf("%s (the VM node) tainted %s=%s:%s for the run", vm, slowTaint.Key, slowTaint.Value, slowTaint.Effect)
		case !apierrors.IsNotFound(err):
			return s, err
		}
	}

	su := suite{binary: o.binary, kubeconfig: r.cfg.Kubeconfig(), seed: o.seed, timeout: o.timeout}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return s, err
	}
	all, err := su.list(ctx, jobFocus, o.out)
	if err != nil {
		return s, err
	}
	var specs []spec
	for _, sp := range all {
		row := row{Spec: sp.Name, Labels: sp.Labels, Skipped: excluded(sp)}
		if row.Skipped == "" && o.run != nil && !o.run.MatchString(sp.Name) {
			row.Skipped = "not selected by -run"
		}
		if row.Skipped == "" {
			specs = append(specs, sp)
		}
		s.Rows = append(s.Rows, row)
	}
	logf("%d Job specs listed, %d to run in each pass, %d at a time, %v each at most", len(all), len(specs), o.parallel, o.timeout)

	for _, pass := range o.passes {
		want := ""
		if pass == "coroner" {
			if err := r.opt.bind(ctx); err != nil {
				return s, err
			}
			logf("binding %s in effect: Jobs in namespaces labelled %s=%s get managedBy %s", e2eBinding, e2eNamespaceLabel, e2eNamespaceBase, shimName)
			want = shimName
		} else if err := r.opt.waitApplied(ctx, false); err != nil {
			return s, err
		}
		w, err := watchJobs(ctx, r.cs, want)
		if err != nil {
			return s, err
		}
		t0 := time.Now()
		logf("=== %s pass", pass)
		done := 0
		outs, runErr := su.runAll(ctx, specs, filepath.Join(o.out, pass), o.parallel, func(sp spec, out outcome) {
			done++
			logf("%s %2d/%d  %-11s %5s  %s", pass, done, len(specs), out.State, out.Took.Round(time.Second), short(sp.Name))
		})
		census, errs := w.finish()
		s.Passes[pass] = time.Since(t0).Round(time.Second).String()
		s.Census[pass] = census
		logf("=== %s pass done in %s: %d Jobs, managedBy %s", pass, s.Passes[pass], census.Total, managedByCounts(census))
		for i, sp := range specs {
			ri := slices.IndexFunc(s.Rows, func(r row) bool { return r.Spec == sp.Name })
			out := outs[i]
			if pass == "coroner" {
				s.Rows[ri].Coroner = &out
			} else {
				s.Rows[ri].BuiltIn = &out
			}
		}
		for _, e := range errs {
			s.Problems = append(s.Problems, pass+" pass: "+e)
		}
		if len(census.Wrong) > 0 {
			s.Problems = append(s.Problems, fmt.Sprintf("%s pass: %d Job(s) not handed to the pass's controller (want managedBy %q): %s",
				pass, len(census.Wrong), want, strings.Join(census.Wrong, ", ")))
		}
		if len(specs) > 0 && census.Total == 0 {
			s.Problems = append(s.Problems, pass+" pass: no Job seen in the e2e namespaces")
		}
		if runErr != nil {
			return s, runErr // cleanup unbinds
		}
		if pass == "coroner" {
			if err := r.opt.unbind(ctx); err != nil {
				return s, err
			}
		}
		if err := waitE2ENamespacesGone(ctx, r.cs, 5*time.Minute); err != nil {
			s.Problems = append(s.Problems, fmt.Sprintf("after the %s pass: %v", pass, err))
		}
	}
	s.judge()
	s.Took = time.Since(start).Round(time.Second).String()
	return s, nil
}
