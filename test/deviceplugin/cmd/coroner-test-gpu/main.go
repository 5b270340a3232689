// Command coroner-test-gpu is a kubelet device plugin for coroner's tests: it serves N fake
// GPUs as the extended resource coroner.dev/test-gpu to the kubelet of this machine (or of
// the mount namespace it runs in) and a control API on a unix socket to fail and heal them.
// This main only parses flags, validates them and wires the parts together; see package
// github.com/coroner-dev/coroner/test/deviceplugin.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"

	"github.com/coroner-dev/coroner/test/deviceplugin"
)

const summary = `coroner-test-gpu: a kubelet device plugin (API v1beta1) serving --devices fake GPUs
GPU-0, GPU-1, ... as --resource. It listens on --socket in --dir, registers with the kubelet's
kubelet.sock there, and does both again when the kubelet restarts. A container allocated
devices gets CORONER_TEST_GPU=GPU-1,... and CORONER_TEST_GPU_PCI=0000:11:00.0,... (buses
from --pci-base) and, with --state-dir, each device's health file ("Healthy" or
"Unhealthy", kept current) read-only at /run/coroner-test-gpu/GPU-1; --state-dir also holds
fake NVIDIA driver files, nvidia/gpus/<PCI>/information, whose GPU UUID is the device ID.
The control API on --control (HTTP over a unix socket):
  GET /devices, POST /devices/ID/fail[?xid=N], POST /devices/ID/heal
where xid=N first writes the NVIDIA driver's Xid line N for the device to --kmsg.
For example: curl --unix-socket /run/coroner-test-gpu.sock -X POST 'http://x/devices/GPU-1/fail?xid=79'`

type options struct {
	plugin  deviceplugin.Options
	control string
	pciBase string
}

func (o *options) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.plugin.Dir, "dir", o.plugin.Dir, "The kubelet's device-plugins directory, where kubelet.sock is.")
	fs.IntVar(&o.plugin.Devices, "devices", o.plugin.Devices, "How many devices to serve.")
	fs.StringVar(&o.plugin.ResourceName, "resource", o.plugin.ResourceName, "The extended resource name.")
	fs.StringVar(&o.plugin.SocketName, "socket", o.plugin.SocketName, "The plugin's socket file name in --dir.")
	fs.StringVar(&o.control, "control", o.control, "The control API's unix socket; not in --dir, whose sockets the kubelet deletes when it starts.")
	fs.StringVar(&o.pciBase, "pci-base", o.pciBase, "The PCI domain and bus of the first device, DDDD:BB in hex; device i is on bus BB+i. Plugins whose nodes share a kernel log need bases of their own.")
	fs.StringVar(&o.plugin.StateDir, "state-dir", o.plugin.StateDir, "Where to keep the devices' health files (mounted into containers) and fake NVIDIA driver information files; none when empty.")
	fs.StringVar(&o.plugin.Kmsg, "kmsg", o.plugin.Kmsg, "The kernel log device an Xid line is written to.")
}

func (o *options) validate() error {
	base, err := deviceplugin.ParsePCIBase(o.pciBase)
	if err != nil {
		return fmt.Errorf("--pci-base: %w", err)
	}
	o.plugin.PCIBase = base
	if err := o.plugin.Validate(); err != nil {
		return err
	}
	if !filepath.IsAbs(o.control) {
		return fmt.Errorf("--control %q: must be an absolute path", o.control)
	}
	if rel, err := filepath.Rel(o.plugin.Dir, o.control); err == nil && !strings.HasPrefix(rel, "..") {
		return fmt.Errorf("--control %q: must not be in --dir %q", o.control, o.plugin.Dir)
	}
	return nil
}

func main() {
	o := &options{plugin: deviceplugin.NewOptions(), control: "/run/coroner-test-gpu.sock", pciBase: deviceplugin.DefaultPCIBase.String()}
	fs := pflag.NewFlagSet("coroner-test-gpu", pflag.ContinueOnError)
	o.addFlags(fs)
	gofs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(gofs)
	fs.AddGoFlag(gofs.Lookup("v"))
	fs.SortFlags = false
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			fmt.Printf("%s\n\nFlags:\n%s", summary, fs.FlagUsages())
			os.Exit(0)
		}
		fail(2, err)
	}
	if err := o.validate(); err != nil {
		fail(2, err)
	}
	p, err := deviceplugin.New(o.plugin)
	if err != nil {
		fail(2, err)
	}
	l, err := deviceplugin.ListenControl(o.control)
	if err != nil {
		fail(1, err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	ctx = klog.NewContext(ctx, klog.Background().WithName("coroner-test-gpu"))
	if err := run(ctx, p, l); err != nil {
		fail(1, err)
	}
}

// run runs the plugin and its control API until ctx ends or either fails.
func run(ctx context.Context, p *deviceplugin.Plugin, control net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, 2)
	go func() { errs <- p.Run(ctx) }()
	go func() { errs <- deviceplugin.ServeControl(ctx, control, p) }()
	klog.FromContext(ctx).Info("Serving the control API", "socket", control.Addr().String())
	err := <-errs
	cancel()
	return errors.Join(err, <-errs)
}

func fail(code int, err error) {
	klog.Flush()
	fmt.Fprintf(os.Stderr, "coroner-test-gpu: %v\n", err)
	os.Exit(code)
}
