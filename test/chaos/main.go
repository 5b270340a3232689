// Command chaos is coroner's fault suite (issue 12, item 4: `make chaos-test`). On the lab
// that is up (`make lab`; it never brings one up or takes one down) it runs storms of Jobs
// handed to coroner-shim and bare pods watched by coroner-agent while it injects faults:
// SIGKILLs of the shim's leader, kube-apiserver restarts, etcd paused, the agent
// DaemonSet rolled to a new image tag, containerd restarted, a node partitioned with and
// without fencing, bad annotations, CRI containers the API server does not know, 429s
// from the API server's priority and fairness, and requests with coroner's own
// ServiceAccount tokens. Each scenario checks, against what the pods themselves recorded
// on this machine (truth.go), that no failure was lost or counted twice, that no index
// ran twice at once, and that every Job ended as it does without faults. It prints a
// table and exits 1 when a bar is missed, 2 when it could not run.
//
//	go run ./test/chaos [-scenarios a,b] [-completions 200] [-kills 20] [-keep]
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/coroner-dev/coroner/test/lab"
)

type options struct {
	scenarios   []string
	completions int
	parallelism int
	kills       int
	keep        bool
	seed        uint64
}

// scenario is one row of the table.
type scenario struct {
	name string
	run  func(context.Context, *env, options) result
}

var allScenarios = []scenario{
	{"security", security},
	{"bad-input", badInput},
	{"shim-leader-kill", shimFailover},
	{"control-plane", controlPlane},
	{"agent-rollout", agentRollout},
	{"containerd-restart", containerdRestart},
	{"partition", partition},
	{"device-storm", deviceStorm},
}

// result is what a scenario found.
type result struct {
	Name     string
	Faults   string
	Jobs     int
	Pods     int
	Lost     int
	Double   int
	Overlap  float64
	Failover string
	Problems []string
	Notes    []string
	Took     time.Duration
}

func (r *result) problem(format string, args ...any) {
	r.Problems = append(r.Problems, fmt.Sprintf(format, args...))
}

func (r *result) note(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

// fail ends the scenario with an error that kept it from checking.
func (r result) fail(err error) result {
	r.problem("could not run: %v", err)
	return r
}

// add counts one checked Job.
func (r *result) add(c jobCheck, jobs int) {
	r.Jobs += jobs
	r.Lost += c.Lost
	r.Double += c.Double
	r.Overlap = max(r.Overlap, c.Overlap)
	r.Problems = append(r.Problems, c.Problems...)
	r.Notes = append(r.Notes, c.Notes...)
}

func main() { os.Exit(run()) }

func run() int {
	var o options
	var scen string
	names := make([]string, len(allScenarios))
	for i, s := range allScenarios {
		names[i] = s.name
	}
	flag.StringVar(&scen, "scenarios", strings.Join(names, ","), "scenarios to run, in this order")
	flag.IntVar(&o.completions, "completions", 200, "completions of the shim-leader-kill storm Job")
	flag.IntVar(&o.parallelism, "parallelism", 12, "parallelism of the shim-leader-kill storm Job")
	flag.IntVar(&o.kills, "kills", 20, "SIGKILLs of the shim leader")
	flag.BoolVar(&o.keep, "keep", false, "keep the namespaces and truth files of scenarios that passed")
	flag.Uint64Var(&o.seed, "seed", uint64(time.Now().UnixNano()), "random seed (failing indexes, kill times)")
	flag.Parse()
	for _, s := range strings.Split(scen, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		if !slices.Contains(names, s) {
			fmt.Fprintf(os.Stderr, "chaos: unknown scenario %q (known: %s)\n", s, strings.Join(names, ", "))
			return 2
		}
		o.scenarios = append(o.scenarios, s)
	}

	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "chaos: the lab's faults need root")
		return 2
	}
	cfg, err := lab.DefaultConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 2
	}
	cfg.Out = os.Stderr
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	up, err := cfg.IsUp(ctx)
	if err != nil || !up {
		fmt.Fprintf(os.Stderr, "chaos: no healthy lab is up (%v): start one with `make lab`; this suite never brings a lab up or down\n", err)
		return 2
	}
	e := &env{cfg: cfg, keep: o.keep, rng: rand.New(rand.NewPCG(o.seed, o.seed>>1|1))}
	if e.rest, err = cfg.RESTConfig(); err == nil {
		e.cs, err = kubernetes.NewForConfig(e.rest)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 2
	}
	e.runID = time.Now().UTC().Format("20060102-150405")
	e.truthRoot = filepath.Join(cfg.Root, "_output", "chaos", e.runID)
	e.logf("chaos: run %s, seed %d, truth in %s", e.runID, o.seed, e.truthRoot)
	if err := preflight(ctx, e); err != nil {
		fmt.Fprintf(os.Stderr, "chaos: the lab is not fit for the suite: %v\n", err)
		return 2
	}
	defer e.runUndos(context.Background())
	logsCtx, stopLogs := context.WithCancel(ctx)
	logsDir := filepath.Join(e.truthRoot, "coroner-logs")
	waitLogs := e.followLogs(logsCtx, logsDir)
	defer func() { stopLogs(); waitLogs() }()

	start := time.Now()
	baseline, _ := e.restartCounts(ctx)
	var results []result
	for _, name := range o.scenarios {
		i := slices.IndexFunc(allScenarios, func(s scenario) bool { return s.name == name })
		e.logf("=== %s", name)
		t0 := time.Now()
		r := allScenarios[i].run(ctx, e, o)
		r.Name, r.Took = name, time.Since(t0)
		e.runUndos(context.Background())
		if ctx.Err() != nil {
			r.problem("interrupted")
		}
		e.logf("=== %s: %d problem(s) in %v", name, len(r.Problems), r.Took.Round(time.Second))
		results = append(results, r)
		if ctx.Err() != nil {
			break
		}
		if err := settle(ctx, e); err != nil {
			r := result{Name: "lab health after " + name}
			r.problem("%v", err)
			results = append(results, r)
			break
		}
	}

	// No panic anywhere in coroner's logs during the run.
	logs := e.coronerLogs(context.Background(), start)
	if p := panics(logs); len(p) > 0 {
		r := result{Name: "coroner logs"}
		r.problem("panics: %v", p)
		results = append(results, r)
	}
	after, _ := e.restartCounts(context.Background())
	printTable(os.Stdout, results, time.Since(start))
	fmt.Printf("coroner's logs, every container of the run: %s\n", logsDir)
	fmt.Printf("coroner containers restarted or replaced during the run (kills and rollouts do this on purpose): %v\n", orNone(restartsSince(baseline, after)))
	for _, r := range results {
		if len(r.Problems) > 0 {
			return 1
		}
	}
	return 0
}

// preflight checks the lab is whole: every node Ready and connected, both shim replicas
// and every agent ready, a leader.
func preflight(ctx context.Context, e *env) error {
	for _, n := range e.cfg.Nodes {
		if cut, err := e.cfg.Partitioned(n.Name); err != nil || cut {
			return fmt.Errorf("%s is partitioned (coronerctl chaos heal %s) %v", n.Name, n.Name, err)
		}
	}
	return settle(ctx, e)
}

// settle waits until the lab is whole again after a scenario: nodes Ready, coroner's
// pods ready, a shim leader renewing.
func settle(ctx context.Context, e *env) error {
	var why string
	err := lab.Poll(ctx, 3*time.Minute, "the lab to be whole (nodes Ready, coroner ready)", func() (bool, error) {
		nodes, err := e.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			why = err.Error()
			return false, nil
		}
		for _, n := range nodes.Items {
			ready := false
			for _, c := range n.Status.Conditions {
				ready = ready || c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue
			}
			if !ready || len(n.Spec.Taints) > 0 && hasUnreachable(n) {
				why = n.Name + " not Ready"
				return false, nil
			}
		}
		pods, err := e.coronerPods(ctx)
		if err != nil {
			why = err.Error()
			return false, nil
		}
		ready, agents, shims := 0, 0, 0
		for _, p := range pods {
			if p.DeletionTimestamp != nil {
				continue
			}
			switch {
			case strings.HasPrefix(p.Name, "coroner-agent"):
				agents++
			case strings.HasPrefix(p.Name, "coroner-shim"):
				shims++
			}
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		if agents < len(e.cfg.Nodes) || shims != 2 || ready != agents+shims {
			why = fmt.Sprintf("%d agents, %d shims, %d ready", agents, shims, ready)
			return false, nil
		}
		h, renew, err := lab.LeaseHolder(ctx, e.cs, lab.ShimNamespace, lab.ShimLease)
		if err != nil || h == "" || time.Since(renew) > 10*time.Second {
			why = "no shim leader renewing"
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("%w (%s)", err, why)
	}
	return nil
}

func hasUnreachable(n corev1.Node) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == corev1.TaintNodeUnreachable || t.Key == corev1.TaintNodeNotReady {
			return true
		}
	}
	return false
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

func printTable(w *os.File, rs []result, took time.Duration) {
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SCENARIO\tFAULTS INJECTED\tJOBS (PODS) CHECKED\tFAILURES LOST\tDOUBLE COUNTS\tMAX OVERLAP S\tFAILOVER S\tTOOK\tRESULT")
	for _, r := range rs {
		res := "ok"
		if len(r.Problems) > 0 {
			res = fmt.Sprintf("FAIL (%d)", len(r.Problems))
		}
		fo := r.Failover
		if fo == "" {
			fo = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d (%d)\t%d\t%d\t%.2f\t%s\t%s\t%s\n", r.Name, r.Faults, r.Jobs, r.Pods, r.Lost, r.Double, r.Overlap, fo, r.Took.Round(time.Second), res)
	}
	tw.Flush()
	fmt.Fprintf(w, "total %v\n", took.Round(time.Second))
	for _, r := range rs {
		for _, n := range r.Notes {
			fmt.Fprintf(w, "  note  %s: %s\n", r.Name, n)
		}
		for _, p := range r.Problems {
			fmt.Fprintf(w, "  FAIL  %s: %s\n", r.Name, p)
		}
	}
}
