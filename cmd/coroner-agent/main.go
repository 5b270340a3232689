// Command coroner-agent runs on every node (DaemonSet): it stamps pods with why they died.
// This main only parses flags, validates them and wires the parts together.
package main

import (
	"context"
	"os"

	"github.com/spf13/pflag"

	"github.com/coroner-dev/coroner/agent"
	"github.com/coroner-dev/coroner/internal/cli"
)

const summary = `coroner-agent: watches the container runtime on this node over CRI and stamps pods with
why they died (DisruptionTarget, coroner.dev/OOMKilled, coroner.dev/DeviceFailed, terminal phase)
before they are deleted.
The runtime's CRI socket is found among the usual ones unless --runtime-endpoint names it;
/readyz says whether the runtime answers, /healthz only that the agent does.
With --fencing (requirement A6, off by default) it renews the Lease coroner-agent-<node>
and, after --fence-after without a renewal, stops the containers of the node's opted-in pods.`

func main() {
	opts := agent.NewOptions()
	fs := pflag.NewFlagSet("coroner-agent", pflag.ContinueOnError)
	opts.AddFlags(fs)
	cli.AddLogFlags(fs)
	cli.Parse(fs, summary, os.Args[1:])
	if err := opts.Complete(); err != nil {
		cli.Fail(fs.Name(), err)
	}
	if err := opts.Validate(); err != nil {
		cli.Fail(fs.Name(), err)
	}
	cfg, err := cli.RESTConfig(opts.Kubeconfig, opts.QPS, opts.Burst, "coroner-agent/"+opts.NodeName)
	if err != nil {
		cli.Exit(fs.Name(), err)
	}
	cli.Run(fs.Name(), func(ctx context.Context) error { return agent.Run(ctx, cfg, opts) })
}
