// Command coroner-lab runs coroner's local lab (test/lab): a Kubernetes cluster of
// processes on this machine with three nodes of real kubelets and containerd, coroner
// deployed, and a demo Job. `make lab` and `make lab-down` call it, and `coronerctl chaos`
// runs its chaos command for the node-side verbs. It lives under test/ because it links
// the lab's code; make build still installs it as _output/bin/coroner-lab, beside
// coronerctl, where coronerctl looks for it.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/coroner-dev/coroner/internal/cli"
	"github.com/coroner-dev/coroner/test/lab"
)

const summary = `coroner-lab: coroner's local lab, a Kubernetes v1.36.3 cluster of processes on this machine
(etcd, kube-apiserver, kube-controller-manager, kube-scheduler, three nodes of kubelet +
containerd in their own network namespaces) with coroner deployed from deploy/overlays/lab.
Needs root. Files in _output/lab.

usage: coroner-lab [flags] COMMAND
  up          build what is missing, start the lab, deploy coroner, run the demo Job
              (says so and does nothing when the lab is up; repairs a broken one)
  down        stop everything the lab started and remove what it created
  status      the lab's processes, nodes and pods (exit 3 when it is not up)
  kubeconfig  print the kubeconfig path: export KUBECONFIG=$(coroner-lab kubeconfig)
  demo        run the demo Job again
  redeploy    rebuild coroner-agent and coroner-shim, load their images on every node,
              apply the overlay again and restart coroner's workloads (after a code change)
  chaos ACTION ARG
              the node-side actions of coronerctl chaos, which runs this for them:
              partition|heal|kill-kubelet|start-kubelet NODE, oom POD [--node],
              devices NODE, device-fail NODE [DEVICE|pod/NAME] [--xid N],
              device-heal NODE [DEVICE], device-xid NODE DEVICE|pod/NAME --xid N, on a node of the lab or of the kind cluster
              (make kind-lab)`

func main() {
	var opts struct {
		skipBuild, skipDeploy, skipDemo bool
		vm                              bool
		overlay                         string
	}
	fs := pflag.NewFlagSet("coroner-lab", pflag.ContinueOnError)
	fs.BoolVar(&opts.skipBuild, "skip-build", false, "up: do not run test/tools/build.sh nor build coroner-agent and coroner-shim; use the binaries in _output/bin")
	fs.BoolVar(&opts.skipDeploy, "skip-deploy", false, "up: do not deploy coroner (nor run the demo)")
	fs.BoolVar(&opts.skipDemo, "skip-demo", false, "up: do not run the demo Job")
	fs.BoolVar(&opts.vm, "vm", lab.VMFromEnv(), "up: add the VM node lab-node-4 (systemd on cgroup v2 under QEMU; default from LAB_VM=1)")
	fs.StringVar(&opts.overlay, "overlay", "", "up: the kustomization that deploys coroner (default deploy/overlays/lab)")
	chaos := &chaosOptions{Timeout: 2 * time.Minute}
	fs.BoolVar(&chaos.Node, "node", false, "chaos oom: lower the memory limit of all the pods of the POD's node (kubepods) instead of the pod's own")
	fs.DurationVar(&chaos.Timeout, "timeout", chaos.Timeout, "chaos oom: how long to wait for an OOM kill")
	fs.StringVar(&chaos.LabDir, "lab-repo", "", "chaos: the coroner repository whose lab the action acts on (default the one that holds the working directory or this program)")
	fs.StringVar(&chaos.Kubeconfig, "kubeconfig", "", "chaos oom: the kubeconfig (default $KUBECONFIG, else the lab's)")
	fs.StringVar(&chaos.Context, "context", "", "chaos oom: the kubeconfig context")
	fs.StringVarP(&chaos.Namespace, "namespace", "n", "", "chaos oom: the POD's namespace (default the context's)")
	fs.IntVar(&chaos.Xid, "xid", 0, "chaos device-fail: first write (device-xid: write only) the NVIDIA driver's Xid line of this number for the device's PCI address to the node's kernel log")
	cli.Parse(fs, summary, os.Args[1:])
	if fs.NArg() >= 1 && fs.Arg(0) == "chaos" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		if err := runChaos(ctx, chaos, fs.Args()[1:], os.Stdout); err != nil {
			fail(err)
		}
		return
	}
	if fs.NArg() != 1 {
		cli.Fail(fs.Name(), errors.New("want exactly one command: up, down, status, kubeconfig, demo, redeploy or chaos"))
	}
	cfg, err := lab.DefaultConfig()
	if err != nil {
		fail(err)
	}
	cfg.SkipBuild, cfg.SkipDeploy, cfg.SkipDemo = opts.skipBuild, opts.skipDeploy, opts.skipDemo
	cfg.VM = opts.vm
	if opts.overlay != "" {
		if cfg.Overlay, err = filepath.Abs(opts.overlay); err != nil {
			fail(err)
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	switch cmd := fs.Arg(0); cmd {
	case "up":
		err = lab.Up(ctx, cfg)
	case "down":
		err = lab.Down(ctx, cfg)
	case "status":
		err = lab.Status(ctx, cfg)
		if errors.Is(err, lab.ErrNotUp) {
			os.Exit(3)
		}
	case "kubeconfig":
		if _, serr := os.Stat(cfg.Kubeconfig()); serr != nil {
			err = fmt.Errorf("no kubeconfig at %s: the lab is not up (make lab)", cfg.Kubeconfig())
		} else {
			fmt.Println(cfg.Kubeconfig())
		}
	case "demo":
		err = lab.Demo(ctx, cfg)
	case "redeploy":
		err = lab.Redeploy(ctx, cfg)
	default:
		cli.Fail(fs.Name(), fmt.Errorf("unknown command %q: want up, down, status, kubeconfig, demo or redeploy", cmd))
	}
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "coroner-lab: %v\n", err)
	os.Exit(1)
}
