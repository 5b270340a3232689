// Command kubelet measures requirement P2 against the kubelet on the lab that is up (issue
// 14, items 3 and 4; `make bench-p2`): on each node configuration of the lab at the same
// time, -exits container exits and -ooms limit OOM kills, and for each the time from the
// container's finishedAt (asked of the node's containerd over CRI, in nanoseconds) to
//
//   - coroner's stamp visible through a watch: an entry of coroner.dev/exit-history for
//     an exit (restartPolicy OnFailure, exit code 3 once, then the container sleeps), the
//     condition coroner.dev/OOMKilled (MemoryLimitExceeded) for a limit OOM (memhog over a
//     24Mi limit, restartPolicy Never);
//   - the kubelet's terminated status of the same container visible through the same
//     watch (state.terminated or lastState.terminated, whichever shows first).
//
// The nodes: lab-node-1 (containerd 2.x, the agent in events mode), lab-node-2
// (containerd 1.6: the agent relists every second and follows containerd's event
// service), lab-node-3 (containerd 1.7: the agent relists, as on 1.6, since 1.7's CRI
// event channel is shared) and, when the lab has it, the VM node lab-node-4 (systemd,
// cgroup v2, containerd 2.x in QEMU; -vm-exits and -vm-ooms, since it is emulated and
// 10-20x slower).
//
// Pacing: pods are created on each node at -rate a second (-vm-rate on the VM), exits and
// OOM pods interleaved, each container running -run-for before it exits or starts
// allocating, so that the terminations come at about that rate. The default, 0.5 pods a
// second per process node (0.4 exits and 0.1 OOM kills; 200 + 50 in about 8 minutes),
// makes the agent write about 0.6 requests a second (a pod patch per exit; a status patch
// and a Stamped Event per OOM kill), far under its default client limit of 5 QPS, burst
// 10, and the kubelet's 50: neither client's rate limiter is what is measured. The
// machine is the limit: the lab's nodes, its control plane and the QEMU VM (which takes
// a core whenever its guest is busy) share the host's CPUs, and on the 2-CPU machine the
// bench was written on, 2.5 pods a second on two nodes saturated it (the kubelet reported
// exits 14 s after them at p50) and 1 a second still built a backlog (7 s at p50 by the
// end); at 0.5 the host kept up (16 live shims at most). -rate 2.5 keeps the agent at 3
// writes a second, for a bigger machine. The VM node gets 0.1 pods a second and at most
// 3 alive: with 6 its first pods did not even start within the timeout. At most -max-live
// of the bench's pods are alive on a node (the kubelet admits 110): a pod is deleted
// (grace 0) as soon as both reports and its finishedAt are in.
//
// Beside the latencies, the agent's and the kubelet's resident memory and CPU (their Go
// process metrics, read from /metrics through the API server's proxy) and containerd's
// (/proc of its process on this machine; in the VM's guest over ssh), idle for -idle
// before the storm and during it, with this machine's CPU use. It prints tables, writes
// _output/bench/p2.json, and deletes its namespace. Exit status 1 when an exit or an OOM
// kill was never stamped (or stamped wrong), or on an error; 2 on bad flags.
//
// It runs on the lab that is up and never brings one up or down. Root.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/coroner-dev/coroner/test/bench/measure"
)

// options are the benchmark's settings, from flags.
type options struct {
	nodes                []string // the process nodes to run on; the VM node is added when present
	vm                   bool     // run on the VM node when the lab has it
	exits, ooms          int      // per process node
	vmExits, vmOOMs      int      // on the VM node
	rate, vmRate         float64  // pods created per second per node
	maxLive, vmMaxLive   int      // the bench's pods alive on a node at most
	runFor, vmRunFor     time.Duration
	podTimeout           time.Duration // from a pod's creation to both reports; x3 on the VM
	idle, sampleInterval time.Duration
	memoryLimit          string
	namespace            string
	jsonPath             string
}

func defaultOptions() options {
	return options{
		nodes: []string{"lab-node-1", "lab-node-2", "lab-node-3"}, vm: true,
		exits: 200, ooms: 50,
		vmExits: 20, vmOOMs: 5,
		rate: 0.5, vmRate: 0.1,
		maxLive: 60, vmMaxLive: 3,
		runFor: 2 * time.Second, vmRunFor: 5 * time.Second,
		podTimeout:     90 * time.Second,
		idle:           20 * time.Second,
		sampleInterval: 5 * time.Second,
		memoryLimit:    "24Mi",
		namespace:      "bench-p2",
	}
}

func (o *options) flags(fs *flag.FlagSet) {
	measure.NodesFlag(fs, &o.nodes, "comma-separated process nodes to run on")
	fs.BoolVar(&o.vm, "vm", o.vm, "also run on the VM node lab-node-4 when the lab has it")
	fs.IntVar(&o.exits, "exits", o.exits, "container exits per process node")
	fs.IntVar(&o.ooms, "ooms", o.ooms, "limit OOM kills per process node")
	fs.IntVar(&o.vmExits, "vm-exits", o.vmExits, "container exits on the VM node")
	fs.IntVar(&o.vmOOMs, "vm-ooms", o.vmOOMs, "limit OOM kills on the VM node")
	fs.Float64Var(&o.rate, "rate", o.rate, "pods created per second on each process node (exits and OOMs interleaved); the agent writes ~1.2 requests per pod")
	fs.Float64Var(&o.vmRate, "vm-rate", o.vmRate, "pods created per second on the VM node")
	fs.IntVar(&o.maxLive, "max-live", o.maxLive, "the bench's pods alive on a process node at most (the kubelet admits 110)")
	fs.IntVar(&o.vmMaxLive, "vm-max-live", o.vmMaxLive, "the bench's pods alive on the VM node at most")
	fs.DurationVar(&o.runFor, "run-for", o.runFor, "how long a container runs before it exits or starts allocating")
	fs.DurationVar(&o.vmRunFor, "vm-run-for", o.vmRunFor, "-run-for on the VM node")
	fs.DurationVar(&o.podTimeout, "pod-timeout", o.podTimeout, "how long after its creation a pod may take to exit and be reported by both (3x on the VM node)")
	fs.DurationVar(&o.idle, "idle", o.idle, "idle period measured before the storm")
	fs.DurationVar(&o.sampleInterval, "sample-interval", o.sampleInterval, "how often the processes' memory and CPU are read during the storm")
	fs.StringVar(&o.memoryLimit, "memory-limit", o.memoryLimit, "memory limit of the OOM pods' container")
	fs.StringVar(&o.namespace, "namespace", o.namespace, "namespace of the bench's pods (deleted at the end)")
	fs.StringVar(&o.jsonPath, "json", o.jsonPath, "where to write the report; default <repository>/_output/bench/p2.json")
}

func (o *options) validate() error {
	var errs []error
	if len(o.nodes) == 0 && !o.vm {
		errs = append(errs, errors.New("no node to run on"))
	}
	if o.exits < 0 || o.ooms < 0 || o.vmExits < 0 || o.vmOOMs < 0 || o.exits+o.ooms == 0 {
		errs = append(errs, fmt.Errorf("-exits=%d -ooms=%d -vm-exits=%d -vm-ooms=%d: need counts >= 0, some on the process nodes", o.exits, o.ooms, o.vmExits, o.vmOOMs))
	}
	if o.rate <= 0 || o.vmRate <= 0 {
		errs = append(errs, fmt.Errorf("-rate=%v -vm-rate=%v: must be > 0", o.rate, o.vmRate))
	}
	if o.maxLive < 1 || o.vmMaxLive < 1 {
		errs = append(errs, fmt.Errorf("-max-live=%d -vm-max-live=%d: must be >= 1", o.maxLive, o.vmMaxLive))
	}
	if o.runFor < 0 || o.vmRunFor < 0 || o.podTimeout <= o.runFor || o.idle < 0 || o.sampleInterval < time.Second {
		errs = append(errs, errors.New("durations: -run-for >= 0, -pod-timeout > -run-for, -idle >= 0, -sample-interval >= 1s"))
	}
	return errors.Join(errs...)
}

func main() {
	o := defaultOptions()
	fs := flag.NewFlagSet("kubelet", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "Usage: go run ./test/bench/kubelet [flags]\n\nP2 against the kubelet on the lab that is up: container exit and limit OOM to coroner's stamp\nand to the kubelet's terminated status, per node configuration, with the agent's, the\nkubelet's and containerd's memory and CPU. Root.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	o.flags(fs)
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if err := o.validate(); err != nil {
		fmt.Fprintln(os.Stderr, "bench-p2:", err)
		os.Exit(2)
	}
	measure.Main("bench-p2", "the nodes' containerd sockets and /proc", func(ctx context.Context) error { return run(ctx, o) })
}
