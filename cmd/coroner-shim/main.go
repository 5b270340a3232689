// Command coroner-shim is coroner's Job controller for batch/v1 Jobs whose spec.managedBy
// names it. This main only parses flags, validates them and wires the parts together.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/pflag"

	"github.com/coroner-dev/coroner/cmd/internal/cli"
	"github.com/coroner-dev/coroner/shim"
)

const summary = `coroner-shim: a Job controller for batch/v1 Jobs whose spec.managedBy is coroner.dev/shim
(pod failure policy, backoffLimitPerIndex, podReplacementPolicy, zombie recovery).`

func main() {
	opts := shim.NewOptions()
	fs := pflag.NewFlagSet("coroner-shim", pflag.ContinueOnError)
	opts.AddFlags(fs)
	cli.Parse(fs, summary, os.Args[1:])
	if err := opts.Validate(); err != nil {
		cli.Fail(fs.Name(), err)
	}
	if _, err := cli.RESTConfig(opts.Kubeconfig, opts.QPS, opts.Burst, "coroner-shim"); err != nil {
		fmt.Fprintf(os.Stderr, "coroner-shim: %v\n", err)
		os.Exit(1)
	}
	fmt.Fprintln(os.Stderr, "coroner-shim:", errors.New("the Job controller is not built yet (issue 3); flags and client configuration are valid"))
	os.Exit(1)
}
