// Command coroner-shim is coroner's Job controller for batch/v1 Jobs whose spec.managedBy
// names it. This main only parses flags, validates them and wires the parts together.
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

	"github.com/coroner-dev/coroner/cmd/internal/cli"
	"github.com/coroner-dev/coroner/shim"
)

const summary = `coroner-shim: a Job controller for batch/v1 Jobs whose spec.managedBy is coroner.dev/shim
(pod failure policy, backoffLimitPerIndex, podReplacementPolicy, zombie recovery).`

func main() {
	opts := shim.NewOptions()
	fs := pflag.NewFlagSet("coroner-shim", pflag.ContinueOnError)
	opts.AddFlags(fs)
	addLogFlags(fs)
	cli.Parse(fs, summary, os.Args[1:])
	if err := opts.Validate(); err != nil {
		cli.Fail(fs.Name(), err)
	}
	cfg, err := cli.RESTConfig(opts.Kubeconfig, opts.QPS, opts.Burst, "coroner-shim")
	if err != nil {
		fail(err)
	}

	// SIGTERM or SIGINT starts a graceful shutdown; a second one exits at once.
	ctx, cancel := context.WithCancel(context.Background())
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, syscall.SIGTERM, os.Interrupt)
	go func() {
		s := <-signals
		klog.Background().Info("Shutting down", "signal", s.String())
		cancel()
		<-signals
		fmt.Fprintln(os.Stderr, "coroner-shim: second signal, exiting without waiting")
		os.Exit(1)
	}()

	ctx = klog.NewContext(ctx, klog.Background().WithName("coroner-shim"))
	err = shim.Run(ctx, cfg, opts)
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

// fail prints "coroner-shim: err" on one line and exits 1.
func fail(err error) {
	fmt.Fprintf(os.Stderr, "coroner-shim: %s\n", strings.ReplaceAll(err.Error(), "\n", "; "))
	os.Exit(1)
}
