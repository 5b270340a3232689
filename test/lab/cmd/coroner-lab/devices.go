package main

// coroner-lab chaos devices|device-fail|device-heal: the test GPU plugin's devices on a node
// of the lab or of the kind cluster, through the node's control socket (test/lab
// testgpu.go, test/kind devices.go).

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coroner-dev/coroner/internal/cli"
	"github.com/coroner-dev/coroner/test/deviceplugin"
	"github.com/coroner-dev/coroner/test/lab"
)

// deviceActions take a NODE and, but devices, an optional DEVICE.
var deviceActions = map[string]bool{"devices": true, "device-fail": true, "device-heal": true, "device-xid": true}

// podPrefix names a DEVICE by the pod that holds it: pod/NAME.
const podPrefix = "pod/"

// runDevices does a device action; args are NODE [DEVICE].
func (o *chaosOptions) runDevices(ctx context.Context, action string, args []string, w io.Writer) (string, error) {
	if len(args) < 1 || len(args) > 2 || args[0] == "" || (action == "devices" && len(args) != 1) {
		return "", fmt.Errorf("usage: coroner-lab chaos devices NODE, device-fail NODE [DEVICE|pod/NAME] [--xid N], device-heal NODE [DEVICE], device-xid NODE DEVICE|pod/NAME --xid N")
	}
	if o.Xid != 0 && action != "device-fail" && action != "device-xid" {
		return "", fmt.Errorf("--xid is a flag of device-fail and device-xid, not of %s", action)
	}
	if action == "device-xid" && (o.Xid == 0 || len(args) != 2) {
		return "", fmt.Errorf("usage: coroner-lab chaos device-xid NODE DEVICE|pod/NAME --xid N (the Xid line alone, the device's health left as it is)")
	}
	if o.Xid != 0 && (o.Xid < deviceplugin.MinXid || o.Xid > deviceplugin.MaxXid) {
		return "", fmt.Errorf("--xid %d: want an Xid number from %d to %d (79: GPU fallen off the bus, 48: double-bit ECC error)", o.Xid, deviceplugin.MinXid, deviceplugin.MaxXid)
	}
	node, device := args[0], ""
	if len(args) == 2 {
		device = args[1]
	}
	cfg, err := o.labConfig()
	if err != nil {
		return "", err
	}
	cfg.Out = w
	var g lab.GPUControl
	var release func()
	if kc, ok := o.kindCluster(ctx, cfg, action, node); ok {
		g, release, err = kc.TestGPUDevices(ctx, node)
	} else {
		g, release, err = cfg.TestGPUDevices(ctx, node)
	}
	if err != nil {
		return "", err
	}
	defer release()
	if strings.HasPrefix(device, podPrefix) {
		if action != "device-fail" && action != "device-xid" {
			return "", fmt.Errorf("%s takes a device ID, not a pod", action)
		}
		if device, err = o.podDevice(ctx, cfg, node, strings.TrimPrefix(device, podPrefix)); err != nil {
			return "", err
		}
	}
	switch action {
	case "devices":
		ds, err := g.List(ctx)
		if err != nil {
			return "", err
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "DEVICE\tHEALTH\tPCI")
		for _, d := range ds {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", d.ID, d.Health, d.PCI)
		}
		return "", tw.Flush()
	case "device-fail":
		d, line, err := g.Fail(ctx, device, o.Xid)
		if err != nil {
			return "", err
		}
		if line != "" {
			fmt.Fprintf(w, "device-fail: wrote to the kernel log of %s: %s\n", node, line)
		}
		fmt.Fprintf(w, "device-fail: %s %s of %s (PCI %s) is %s: its health file in a container that holds it (%s/%s) says so now, the kubelet reports it in the pod's allocatedResourcesStatus and the node's allocatable within seconds\n",
			lab.TestGPUResource, d.ID, node, d.PCI, d.Health, deviceplugin.ContainerHealthDir, d.ID)
		return "coronerctl chaos device-heal " + cli.Quote(node) + " " + cli.Quote(d.ID), nil
	case "device-xid":
		d, line, err := g.Xid(ctx, device, o.Xid)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(w, "device-xid: wrote to the kernel log of %s: %s\n", node, line)
		fmt.Fprintf(w, "device-xid: %s %s of %s (PCI %s) stays %s in its plugin: only the kernel log says it (as NVIDIA's plugin leaves a GPU on an application Xid: 13, 31, 43, 45, 68, 109)\n",
			lab.TestGPUResource, d.ID, node, d.PCI, d.Health)
		return "", nil
	case "device-heal":
		healed, err := g.Heal(ctx, device)
		for _, d := range healed {
			fmt.Fprintf(w, "device-heal: %s %s of %s is %s again\n", lab.TestGPUResource, d.ID, node, d.Health)
		}
		if err != nil {
			return "", err
		}
		if len(healed) == 0 {
			fmt.Fprintf(w, "device-heal: every test GPU of %s is Healthy already\n", node)
			return "", nil
		}
		if len(healed) == 1 {
			return "coronerctl chaos device-fail " + cli.Quote(node) + " " + cli.Quote(healed[0].ID), nil
		}
		return "coronerctl chaos device-fail " + cli.Quote(node) + " DEVICE", nil
	}
	return "", fmt.Errorf("unknown action %q", action)
}

// podDevice is the test GPU the pod holds, which must be on node.
func (o *chaosOptions) podDevice(ctx context.Context, cfg lab.Config, node, name string) (string, error) {
	if o.Kubeconfig == "" && os.Getenv("KUBECONFIG") == "" {
		o.Kubeconfig = cfg.Kubeconfig()
	}
	cs, ns, err := o.client()
	if err != nil {
		return "", err
	}
	pod, err := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", fmt.Errorf("pod %s/%s not found", ns, name)
	}
	if err != nil {
		return "", err
	}
	if pod.Spec.NodeName != node {
		return "", fmt.Errorf("pod %s/%s runs on %q, not on %s", ns, name, pod.Spec.NodeName, node)
	}
	return lab.PodTestGPU(pod)
}
