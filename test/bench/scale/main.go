// Command bench-scale measures coroner at the sizes of real clusters by simulation (issue
// 23, make bench-scale): a real etcd and kube-apiserver v1.36.3 (test/harness), thousands
// of Nodes kept alive by kwok (sigs.k8s.io/kwok, built from its module by
// test/tools/build.sh kwok) the way kubelets keep theirs, and coroner's parts run with
// their own code where they load the API server.
//
// Scenario "outage" (first): a zone goes dark. On the same control plane, with
// kube-scheduler, kube-controller-manager's Job, node lifecycle, taint eviction and pod GC
// controllers, and coroner-shim (the binary, as in production), --pods pods of Indexed Jobs
// handed to coroner (opted in to the recovery of their pods, podFailurePolicy Ignore on
// DisruptionTarget), --builtin-pods of the same Jobs left to the built-in controller
// (podReplacementPolicy TerminatingOrFailed) and --kueue-pods of them left to the built-in
// controller with podReplacementPolicy Failed, their pods opted in to Kueue's failure
// recovery (Kueue v0.17.0's manager, built by test/tools/build.sh kueue, run as a host
// process with its FailureRecoveryPolicy gate on: kueue.go) run on the kwok nodes (kwok's
// fast pod stages make them Running), each node with a fencing agent (fence.Fencer, as
// coroner-agent runs it). Then the first --down nodes (zone-00) and their agents stop at once: those
// nodes have a kwok of their own (a label selects them), which is stopped, so their Leases
// lapse and nothing confirms their pods' end (kwok keeps managing a node whose annotation
// is taken off). Measured per controller: how many pods were lost, the time from the outage and
// from the node's unreachable taint to each replacement Running (p50, p99, max), how many
// within 90 s of the taint (the goal), indexes replaced twice, replacements of
// pods that were not lost, the API server's requests/s at rest and over the storm, and
// coroner-shim's and Kueue's own.
//
// Scenario "load": the API writes coroner's agents add at rest beside the kubelets'. kwok
// renews each node's Lease in kube-node-lease every 10 s (the kubelet's renew interval, a
// quarter of the 40 s lease) and reports node status every 150-450 s (the kubelet reports
// an unchanged status every 5 min; the stage file of kwok's module says 10 min, which
// would understate the kubelets). Measured first alone over --window (the kubelets'
// writes, from the API server's apiserver_request_total), then with one agent per node
// in this process, one window per mode (--agents), each agent coroner-agent's own fencing
// code (fence.Fencer, on a node without containers):
//   - agent-lease: the first design (--fence-signal=agent-lease), the Lease
//     coroner-agent-<node> in coroner-system renewed every fence.RenewPeriod(--fence-after);
//   - node-lease: the default (--fence-signal=node-lease), a watch of the kubelet's own
//     Lease in kube-node-lease, the agent's Lease written once at its start (no write at
//     rest).
//
// The agents' requests are counted by their clients; the API server's count of writes
// over the window less the kubelets' checks that figure; the API server's and etcd's CPU
// are read from /proc. The load scenario's agents share a client and its connection 50 at
// a time (agentsPerConnection says why), the outage scenario's have one each, as each
// coroner-agent has (agentClient says why they must not all share one); none has a
// client-side rate limit.
//
// Every figure is printed side by side with the ratios, and written to
// _output/bench/scale-<scenario>.json (scale-outage.json, scale-load.json).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/test/bench/measure"
	"github.com/coroner-dev/coroner/test/host"
)

type config struct {
	scenarios  []string
	nodes      int
	window     time.Duration
	fenceAfter time.Duration
	modes      []string
	// fenceSignal is the outage's agents' --fence-signal.
	fenceSignal string
	binDir      string
	jsonDir     string
	keep        bool
	// The outage scenario's.
	outageNodes int
	down        int
	pods        int
	builtinPods int
	kueuePods   int
	// kueueToleration is the kueue group's pods' toleration of the NoExecute unreachable
	// taint; 0 leaves the API server's default (300 s).
	kueueToleration time.Duration
	shimQPS         int
	// shimRecoverPods is coroner-shim's --recover-pods.
	shimRecoverPods string
	outageWait      time.Duration
}

// The scenarios, in the order they run.
var allScenarios = []string{"outage", "load"}

func main() {
	root, err := host.RepoRoot()
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench-scale: %v\n", err)
		os.Exit(1)
	}
	c := config{nodes: 5000, window: 4 * time.Minute, fenceAfter: 2 * time.Minute,
		binDir: filepath.Join(root, "_output", "bin"), jsonDir: filepath.Join(root, "_output", "bench"),
		outageNodes: 600, down: 100, pods: 1000, builtinPods: 200, kueuePods: 200, shimQPS: 50, shimRecoverPods: "managed", outageWait: 4 * time.Minute}
	fs := flag.NewFlagSet("bench-scale", flag.ContinueOnError)
	scenariosFlag := fs.String("scenarios", strings.Join(allScenarios, ","), "scenarios to run, in this order: outage (a zone of nodes and their agents stop at once: pods replaced by coroner, by the built-in controller, and with Kueue's failure recovery), load (the agents' API writes at rest beside the kubelets')")
	fs.IntVar(&c.outageNodes, "outage-nodes", c.outageNodes, "outage: simulated nodes (the issue's 5,000, with -down 500 -pods 10000 -builtin-pods 2000, saturated this 2-core machine's API server before the outage: docs/performance.md)")
	fs.IntVar(&c.down, "down", c.down, "outage: nodes that stop at once (the first ones: zone-00's, then the next zone's)")
	fs.IntVar(&c.pods, "pods", c.pods, "outage: pods of the Jobs handed to coroner (Indexed Jobs of 100, opted in to recovery)")
	fs.IntVar(&c.builtinPods, "builtin-pods", c.builtinPods, "outage: pods of the built-in controller's Jobs (podReplacementPolicy TerminatingOrFailed); 0 runs none")
	fs.IntVar(&c.kueuePods, "kueue-pods", c.kueuePods, "outage: pods of the built-in controller's Jobs with podReplacementPolicy Failed, opted in to Kueue's failure recovery (Kueue's manager runs, FailureRecoveryPolicy on); 0 runs none, and no Kueue")
	fs.DurationVar(&c.kueueToleration, "kueue-toleration", 0, "outage: the kueue group's pods' tolerationSeconds for the NoExecute unreachable taint; 0: the API server's default (300s), as the other groups'")
	fs.IntVar(&c.shimQPS, "shim-qps", c.shimQPS, "outage: coroner-shim's --kube-api-qps (its default 50; burst twice that)")
	fs.StringVar(&c.shimRecoverPods, "shim-recover-pods", c.shimRecoverPods, "outage: coroner-shim's --recover-pods: managed (only its Jobs' pods); all (every opted-in pod, whose other controllers' pods it watches per node tainted unreachable: one list and watch per dark node; needs --kueue-pods=0, or the shim would recover the kueue group's opted-in pods too)")
	fs.DurationVar(&c.outageWait, "outage-wait", c.outageWait, "outage: how long after the outage to wait for the replacements")
	fs.IntVar(&c.nodes, "nodes", c.nodes, "load: simulated nodes (kwok)")
	fs.DurationVar(&c.window, "window", c.window, "each measuring window of the load scenario (the kubelets alone, then with the agents); at least 1m")
	fs.DurationVar(&c.fenceAfter, "fence-after", c.fenceAfter, "the agents' --fence-after (coroner-agent's default: 2m)")
	modesFlag := fs.String("agents", strings.Join(allModes, ","), "load: agent modes (coroner-agent's --fence-signal), one window each: agent-lease (renewing its own Lease), node-lease (watching the kubelet's)")
	fs.StringVar(&c.fenceSignal, "fence-signal", conditions.FenceSignalNodeLease, "outage: the agents' --fence-signal (node-lease: the shim reads the kubelets' Leases and the agents' pods, which the outage makes; agent-lease)")
	fs.StringVar(&c.binDir, "bin-dir", c.binDir, "where test/tools/build.sh put etcd, kube-apiserver and kwok")
	fs.StringVar(&c.jsonDir, "json-dir", c.jsonDir, "where to write scale-<scenario>.json")
	fs.BoolVar(&c.keep, "keep", false, "keep the API server's working directory (logs, etcd data)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	var bad []string
	for _, sc := range strings.Split(*scenariosFlag, ",") {
		if !slices.Contains(allScenarios, sc) {
			bad = append(bad, fmt.Sprintf("--scenarios: unknown scenario %q (want some of %s)", sc, strings.Join(allScenarios, ",")))
		}
		c.scenarios = append(c.scenarios, sc)
	}
	for _, m := range strings.Split(*modesFlag, ",") {
		if !slices.Contains(allModes, m) {
			bad = append(bad, fmt.Sprintf("--agents: unknown mode %q (want some of %s)", m, strings.Join(allModes, ",")))
		}
		c.modes = append(c.modes, m)
	}
	if c.fenceSignal != conditions.FenceSignalNodeLease && c.fenceSignal != conditions.FenceSignalAgentLease {
		bad = append(bad, fmt.Sprintf("--fence-signal=%q: want %s or %s", c.fenceSignal, conditions.FenceSignalNodeLease, conditions.FenceSignalAgentLease))
	}
	if c.nodes < 1 || c.nodes > 20000 {
		bad = append(bad, fmt.Sprintf("--nodes=%d: want 1 to 20000", c.nodes))
	}
	if c.window < time.Minute {
		bad = append(bad, fmt.Sprintf("--window=%v: want at least 1m (node status comes every 150-450 s)", c.window))
	}
	if c.fenceAfter < 10*time.Second {
		bad = append(bad, fmt.Sprintf("--fence-after=%v: the agent takes at least 10s", c.fenceAfter))
	}
	if c.outageNodes < 1 || c.outageNodes > 20000 {
		bad = append(bad, fmt.Sprintf("--outage-nodes=%d: want 1 to 20000", c.outageNodes))
	}
	if c.down < 1 || c.down > c.outageNodes {
		bad = append(bad, fmt.Sprintf("--down=%d: want 1 to --outage-nodes (%d)", c.down, c.outageNodes))
	}
	if c.pods < 1 || c.builtinPods < 0 || c.kueuePods < 0 {
		bad = append(bad, fmt.Sprintf("--pods=%d --builtin-pods=%d --kueue-pods=%d: want at least 1, 0 and 0", c.pods, c.builtinPods, c.kueuePods))
	}
	if c.kueueToleration < 0 || c.kueueToleration%time.Second != 0 {
		bad = append(bad, fmt.Sprintf("--kueue-toleration=%v: want whole seconds, 0 or more", c.kueueToleration))
	}
	if c.shimRecoverPods != "managed" && c.shimRecoverPods != "all" {
		bad = append(bad, fmt.Sprintf("--shim-recover-pods=%q: want managed or all", c.shimRecoverPods))
	}
	if c.shimRecoverPods == "all" && c.kueuePods > 0 {
		bad = append(bad, fmt.Sprintf("--shim-recover-pods=all with --kueue-pods=%d: the shim would recover the kueue group's opted-in pods too; set --kueue-pods=0", c.kueuePods))
	}
	if c.shimQPS < 1 {
		bad = append(bad, fmt.Sprintf("--shim-qps=%d: want at least 1", c.shimQPS))
	}
	if c.outageWait < time.Minute {
		bad = append(bad, fmt.Sprintf("--outage-wait=%v: want at least 1m (the node controller taints after about 50 s)", c.outageWait))
	}
	if len(bad) > 0 {
		for _, b := range bad {
			fmt.Fprintln(os.Stderr, "bench-scale: "+b)
		}
		os.Exit(2)
	}
	measure.QuietKlog("", 0)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	run := map[string]func(context.Context, config) error{"outage": runOutage, "load": runLoad}
	for _, sc := range allScenarios {
		if !slices.Contains(c.scenarios, sc) {
			continue
		}
		if err := run[sc](ctx, c); err != nil {
			stop()
			fmt.Fprintf(os.Stderr, "bench-scale %s: %v\n", sc, err)
			os.Exit(1)
		}
	}
}
