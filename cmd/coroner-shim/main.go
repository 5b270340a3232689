// Command coroner-shim is coroner's Job controller for batch/v1 Jobs whose spec.managedBy
// names it. This main only parses flags, validates them and wires the parts together.
package main

import (
	"context"
	"os"

	"github.com/spf13/pflag"

	"github.com/coroner-dev/coroner/internal/cli"
	"github.com/coroner-dev/coroner/shim"
)

const summary = `coroner-shim: a Job controller for batch/v1 Jobs whose spec.managedBy is coroner.dev/shim
(pod failure policy, backoffLimitPerIndex, podReplacementPolicy), and the recovery of opted-in
pods stuck on unreachable, fenced or missing nodes (see --zombie-threshold, --fence-margin).`

func main() {
	opts := shim.NewOptions()
	fs := pflag.NewFlagSet("coroner-shim", pflag.ContinueOnError)
	opts.AddFlags(fs)
	cli.AddLogFlags(fs)
	cli.Parse(fs, summary, os.Args[1:])
	if err := opts.Validate(); err != nil {
		cli.Fail(fs.Name(), err)
	}
	cfg, err := cli.RESTConfig(opts.Kubeconfig, opts.QPS, opts.Burst, "coroner-shim")
	if err != nil {
		cli.Exit(fs.Name(), err)
	}
	cli.Run(fs.Name(), func(ctx context.Context) error { return shim.Run(ctx, cfg, opts) })
}
