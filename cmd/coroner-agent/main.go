// Command coroner-agent runs on every node (DaemonSet): it stamps pods with why they died
// and can fence the node. This main only parses flags, validates them and wires the parts.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/pflag"

	"github.com/coroner-dev/coroner/agent"
	"github.com/coroner-dev/coroner/cmd/internal/cli"
)

const summary = `coroner-agent: watches the container runtime on this node over CRI and stamps pods with
why they died (DisruptionTarget, coroner.dev/OOMKilled, terminal phase) before they are deleted.`

func main() {
	opts := agent.NewOptions()
	fs := pflag.NewFlagSet("coroner-agent", pflag.ContinueOnError)
	opts.AddFlags(fs)
	cli.Parse(fs, summary, os.Args[1:])
	if err := opts.Complete(); err != nil {
		cli.Fail(fs.Name(), err)
	}
	if err := opts.Validate(); err != nil {
		cli.Fail(fs.Name(), err)
	}
	if _, err := cli.RESTConfig(opts.Kubeconfig, opts.QPS, opts.Burst, "coroner-agent/"+opts.NodeName); err != nil {
		fmt.Fprintf(os.Stderr, "coroner-agent: %v\n", err)
		os.Exit(1)
	}
	fmt.Fprintln(os.Stderr, "coroner-agent: the node agent is not built yet (issue 4); flags and client configuration are valid")
	os.Exit(1)
}
