// Command cmd installs the batch platforms coroner runs inside into a cluster of ours
// (make platforms; LAB_PLATFORMS=1 make lab or make kind-lab):
//
//	go run ./test/platforms/cmd [-cluster lab|kind] [-platforms kueue,jobset] install
//	go run ./test/platforms/cmd [-platforms ...] render   # the manifests, to stdout
//
// The managers must be built first (test/tools/build.sh kueue jobset).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/coroner-dev/coroner/test/kind"
	"github.com/coroner-dev/coroner/test/lab"
	"github.com/coroner-dev/coroner/test/platforms"
)

func main() {
	fs := flag.NewFlagSet("platforms", flag.ContinueOnError)
	cluster := fs.String("cluster", "lab", "where to install: lab (the lab that is up) or kind (the kind cluster that is up)")
	list := fs.String("platforms", "all", "comma-separated: kueue, jobset, or all")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: go run ./test/platforms/cmd [flags] install|render")
		fs.PrintDefaults()
	}
	if err := fs.Parse(os.Args[1:]); err != nil || fs.NArg() != 1 {
		fs.Usage()
		os.Exit(2)
	}
	ps, err := platforms.Named(*list)
	if err != nil {
		fmt.Fprintln(os.Stderr, "platforms:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, fs.Arg(0), *cluster, ps); err != nil {
		fmt.Fprintln(os.Stderr, "platforms:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, verb, cluster string, ps []platforms.Platform) error {
	c, err := platforms.New()
	if err != nil {
		return err
	}
	switch verb {
	case "render":
		for _, p := range ps {
			b, err := c.Render(ctx, p)
			if err != nil {
				return err
			}
			fmt.Printf("---\n%s", b)
		}
		return nil
	case "install":
	default:
		return fmt.Errorf("unknown verb %q (install or render)", verb)
	}
	var cl platforms.Cluster
	switch cluster {
	case "lab":
		lc, err := lab.DefaultConfig()
		if err != nil {
			return err
		}
		if up, err := lc.IsUp(ctx); err != nil || !up {
			return fmt.Errorf("the lab is not up (make lab first): %v", err)
		}
		cl = lc
		// The e2e suite's quiet node: the partitions and node OOMs take lab-node-2 and 3.
		c.ManagerNode = "lab-node-1"
	case "kind":
		kc, err := kind.New()
		if err != nil {
			return err
		}
		cl = kc
		// The e2e suite's quiet worker: the partition and the node OOM take the other.
		c.ManagerNode = kc.Cluster + "-worker"
	default:
		return fmt.Errorf("-cluster=%q: want lab or kind", cluster)
	}
	return c.Install(ctx, cl, ps)
}
