// Command coroner-agent runs on every node (DaemonSet): it stamps pods with why they died.
// This main only parses flags, validates them and wires the parts together.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"

	"github.com/coroner-dev/coroner/agent"
	"github.com/coroner-dev/coroner/cmd/internal/cli"
)

const summary = `coroner-agent: watches the container runtime on this node over CRI and stamps pods with
why they died (DisruptionTarget, coroner.dev/OOMKilled, terminal phase) before they are deleted.
Fencing (--fencing, requirement A6) is not yet implemented.`

func main() {
	opts := agent.NewOptions()
	fs := pflag.NewFlagSet("coroner-agent", pflag.ContinueOnError)
	opts.AddFlags(fs)
	addLogFlags(fs)
	cli.Parse(fs, summary, os.Args[1:])
	if err := opts.Complete(); err != nil {
		cli.Fail(fs.Name(), err)
	}
	if err := opts.Validate(); err != nil {
		cli.Fail(fs.Name(), err)
	}
	cfg, err := cli.RESTConfig(opts.Kubeconfig, opts.QPS, opts.Burst, "coroner-agent/"+opts.NodeName)
	if err != nil {
		fail(err)
	}

	// SIGTERM or SIGINT stops the agent; a second one exits at once.
	ctx, cancel := context.WithCancel(context.Background())
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, syscall.SIGTERM, os.Interrupt)
	go func() {
		s := <-signals
		klog.Background().Info("Shutting down", "signal", s.String())
		cancel()
		<-signals
		fmt.Fprintln(os.Stderr, "coroner-agent: second signal, exiting without waiting")
		os.Exit(1)
	}()

	ctx = klog.NewContext(ctx, klog.Background().WithName("coroner-agent"))
	err = agent.Run(ctx, cfg, opts)
	cancel()
	klog.Flush()
	if err != nil {
		fail(err)
	}
}

// addLogFlags adds klog's verbosity flags (-v, --vmodule) to fs.
func addLogFlags(fs *pflag.FlagSet) {
	gofs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(gofs)
	for _, name := range []string{"v", "vmodule"} {
		fs.AddGoFlag(gofs.Lookup(name))
	}
}

// fail prints "coroner-agent: err" on one line and exits 1.
func fail(err error) {
	fmt.Fprintf(os.Stderr, "coroner-agent: %s\n", strings.ReplaceAll(err.Error(), "\n", "; "))
	os.Exit(1)
}
