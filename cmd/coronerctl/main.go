// Command coronerctl is coroner's command-line tool: explain a Job's failure decisions,
// check a Job's policy offline, and inject failures into the lab.
package main

import (
	"fmt"
	"os"
	"runtime/debug"

	"github.com/spf13/pflag"

	"github.com/coroner-dev/coroner/cmd/internal/cli"
)

const summary = `coronerctl: explain and check coroner's decisions.

Usage:
  coronerctl version                 print the version
  coronerctl explain job NAME        each failed pod's cause of death and the rule that matched (lab issue)
  coronerctl check -f job.yaml       validate a Job's failure policy offline (lab issue)
  coronerctl chaos ...               partition, kill-kubelet, oom, evict, drain, preempt in the lab (lab issue)`

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
	case "explain", "check", "chaos":
		fmt.Fprintf(os.Stderr, "coronerctl %s: not yet; it lands with the lab issue (D2)\n", args[0])
		os.Exit(1)
	default:
		cli.Fail(fs.Name(), fmt.Errorf("unknown command %q; see coronerctl --help", args[0]))
	}
}
