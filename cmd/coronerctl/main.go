// Command coronerctl is coroner's command-line tool: explain a Job's failure decisions,
// check a Job's policy offline, and inject failures into the lab. This main only parses
// flags and dispatches; the commands live in the packages explain and check.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/coroner-dev/coroner/cmd/coronerctl/chaos"
	"github.com/coroner-dev/coroner/cmd/coronerctl/check"
	"github.com/coroner-dev/coroner/cmd/coronerctl/explain"
	"github.com/coroner-dev/coroner/cmd/internal/cli"
)

const summary = `coronerctl: explain and check coroner's decisions.

Usage:
  coronerctl version                 print the version
  coronerctl explain job NAME        each failed pod's cause of death, the rule that matched and the action
  coronerctl check -f job.yaml       validate a Job's failure policy offline
  coronerctl chaos ACTION ARG        inject a failure: evict, drain, preempt anywhere; partition, kill-kubelet, oom in the lab

coronerctl COMMAND --help shows the command's flags.`

const explainSummary = `coronerctl explain job NAME [-n NAMESPACE]: for each failed pod of the Job, its cause of
death (exit codes, OOM class, disruption reason), the podFailurePolicy rule that matches it
and what that did to the Job; then the Job's per-index state and failure counts.`

const checkSummary = `coronerctl check -f job.yaml: validates the Jobs (and CronJobs) of a manifest offline with
the API server's rules for failure handling, plus coroner's lints. -f takes files, directories
(-R to recurse) and - for stdin; Lists (kubectl get -o yaml) are checked item by item.
Prints one line per finding (severity, field path, message), a hint shared by several Jobs
once at the end; exits 0 when there are only hints, 1 on any error or warning, 2 when the
command line names nothing to check.`

func main() {
	fs := pflag.NewFlagSet("coronerctl", pflag.ContinueOnError)
	fs.SetInterspersed(false)
	cli.Parse(fs, summary, os.Args[1:])
	args := fs.Args()
	if len(args) == 0 {
		cli.Fail(fs.Name(), fmt.Errorf("missing command; see coronerctl --help"))
	}
	switch args[0] {
	case "version":
		version := "(devel)"
		if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
			version = bi.Main.Version
		}
		fmt.Println("coronerctl", version)
	case "explain":
		opts := &explain.Options{}
		cfs := pflag.NewFlagSet("coronerctl explain", pflag.ContinueOnError)
		opts.AddFlags(cfs)
		cli.Parse(cfs, explainSummary, args[1:])
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err := opts.Run(ctx, cfs.Args(), os.Stdout)
		stop()
		exit(cfs.Name(), err)
	case "check":
		opts := check.NewOptions()
		cfs := pflag.NewFlagSet("coronerctl check", pflag.ContinueOnError)
		opts.AddFlags(cfs)
		cli.Parse(cfs, checkSummary, args[1:])
		if cfs.NArg() > 0 {
			cli.Fail(cfs.Name(), fmt.Errorf("unexpected argument %q; name files with -f", cfs.Arg(0)))
		}
		err := opts.Run(os.Stdout, os.Stdin)
		if check.IsUsage(err) {
			cli.Fail(cfs.Name(), err)
		}
		exit(cfs.Name(), err)
	case "chaos":
		opts := chaos.NewOptions()
		cfs := pflag.NewFlagSet("coronerctl chaos", pflag.ContinueOnError)
		opts.AddFlags(cfs)
		cli.Parse(cfs, chaos.Usage, args[1:])
		if err := opts.Validate(cfs.Args()); err != nil {
			cli.Fail(cfs.Name(), err)
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err := opts.Run(ctx, cfs.Args(), os.Stdout)
		stop()
		exit(cfs.Name(), err)
	default:
		cli.Fail(fs.Name(), fmt.Errorf("unknown command %q; see coronerctl --help", args[0]))
	}
}

// exit ends a command: 0 without error, 1 with one (printed, unless it is check's
// "findings printed already").
func exit(name string, err error) {
	if err == nil {
		return
	}
	if !errors.Is(err, check.ErrFailed) {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
	}
	os.Exit(1)
}
