package lab

// testgpu.go: the test GPU plugin (test/deviceplugin's coroner-test-gpu) on every lab node,
// and the chaos verbs that fail and heal its devices (coronerctl chaos device-fail,
// device-heal, devices).
//
// Each node runs one plugin with TestGPUs devices of the resource coroner.dev/test-gpu,
// started after its kubelet: a process node's in the node's namespaces (mountns.go), the VM
// node's as a systemd unit beside its kubelet (test/vm/guest.sh), a kind worker's as a
// process in its node container (test/kind). Its control API listens on the node's
// TestGPUControl socket. The PCI addresses of its devices start at the node's
// TestGPUPCIBase, domain = node index, so that an Xid line in this machine's kernel log
// (shared by the process nodes and kind's) names one device of one node.

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coroner-dev/coroner/test/deviceplugin"
)

const (
	// TestGPUResource is the extended resource of the test GPU plugin.
	TestGPUResource = deviceplugin.DefaultResourceName
	// TestGPUs is how many devices the plugin of each node has.
	TestGPUs = 2
	// testGPUBinary is the plugin's command, built into _output/bin.
	testGPUBinary = "coroner-test-gpu"
)

// TestGPUControl is the node's test GPU control socket, in the node's run directory
// (/run/coroner-lab/NODE/test-gpu.sock on this machine; the same path in the VM node).
func (n Node) TestGPUControl() string { return filepath.Join(RunDir, n.Name, "test-gpu.sock") }

// TestGPUPCIBase is the PCI domain and first bus of the node's test GPUs: domain = the
// node's index, so lab-node-2's GPU-0 is at 0002:10:00.0.
func (n Node) TestGPUPCIBase() string { return fmt.Sprintf("%04x:10", n.Index) }

// TestGPUArgs are the plugin's flags on a node (its devices, state directory, control
// socket and PCI base).
func TestGPUArgs(control, pciBase string) []string {
	return []string{
		"--dir=/var/lib/kubelet/device-plugins",
		fmt.Sprintf("--devices=%d", TestGPUs),
		"--state-dir=" + TestGPUStateDir,
		"--control=" + control,
		"--pci-base=" + pciBase,
	}
}

// startTestGPU starts the process node's test GPU plugin in the node's namespaces, once
// its kubelet's device manager listens, and waits until its control API answers.
func (c Config) startTestGPU(st *State, n Node) error {
	name := "test-gpu-" + n.Name
	p, err := c.startInNode(st, n, name, c.bin(testGPUBinary), TestGPUArgs(n.TestGPUControl(), n.TestGPUPCIBase()), c.logPath(name))
	if err != nil {
		return err
	}
	cl := deviceplugin.NewControlClient(n.TestGPUControl())
	defer cl.Close()
	return Poll(context.Background(), 30*time.Second, name+"'s control API", func() (bool, error) {
		if !p.running() {
			return false, fmt.Errorf("%s exited:\n%s", name, logTail(p.Log, 2000))
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := cl.List(ctx)
		return err == nil, nil
	})
}

// waitTestGPUs waits until every node of the lab (the VM node too when it runs) reports
// TestGPUs allocatable test GPUs: each kubelet has its own plugin's devices.
func (c Config) waitTestGPUs(ctx context.Context, st *State, timeout time.Duration) error {
	cs, err := c.Clientset()
	if err != nil {
		return err
	}
	nodes := slices.Clone(c.Nodes)
	if _, ok := vmRunning(st); ok {
		nodes = append(nodes, VMNode())
	}
	var wrong []string
	err = Poll(ctx, timeout, fmt.Sprintf("%d allocatable %s on every node", TestGPUs, TestGPUResource), func() (bool, error) {
		wrong = wrong[:0]
		for _, n := range nodes {
			node, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			q := node.Status.Allocatable[corev1.ResourceName(TestGPUResource)]
			if q.Value() != TestGPUs {
				wrong = append(wrong, fmt.Sprintf("%s has %s", n.Name, q.String()))
			}
		}
		return len(wrong) == 0, nil
	})
	if err != nil && len(wrong) > 0 {
		return fmt.Errorf("%w: %s (logs: %s)", err, strings.Join(wrong, ", "), c.shortPath(c.logDir()))
	}
	return err
}

// TestGPUClient returns a client of the lab node's test GPU control API and a function
// that releases it: the socket itself on a process node, a forwarding of it over ssh on
// the VM node.
func (c Config) TestGPUClient(ctx context.Context, node string) (*deviceplugin.ControlClient, string, func(), error) {
	n, err := c.NodeNamed(node)
	if err != nil {
		return nil, "", nil, err
	}
	if _, err := c.upState(); err != nil {
		return nil, "", nil, err
	}
	if !n.IsVM() {
		cl := deviceplugin.NewControlClient(n.TestGPUControl())
		return cl, n.TestGPUControl(), cl.Close, nil
	}
	local, stop, err := c.VMSocket(ctx, n.TestGPUControl())
	if err != nil {
		return nil, "", nil, fmt.Errorf("%s: reach the test GPU plugin's control socket %s in the guest: %w", node, n.TestGPUControl(), err)
	}
	cl := deviceplugin.NewControlClient(local)
	return cl, n.TestGPUControl() + " (in the guest)", func() { cl.Close(); stop() }, nil
}

// GPUControl lists, fails and heals the devices of a test GPU plugin through its control API: on a
// node of the lab (Config.TestGPUDevices) or of the kind cluster (test/kind).
type GPUControl struct {
	Node   string
	Client *deviceplugin.ControlClient
	// Where says where the control socket is, for messages.
	Where string
}

// List returns the node's devices; a plugin that does not answer is an error that says so.
func (g GPUControl) List(ctx context.Context) ([]deviceplugin.Device, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ds, err := g.Client.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("the test GPU plugin of %s does not answer on %s (is it running?): %w", g.Node, g.Where, err)
	}
	return ds, nil
}

// find returns the device id of ds, or an error that lists the node's devices.
func (g GPUControl) find(ds []deviceplugin.Device, id string) (deviceplugin.Device, error) {
	i := slices.IndexFunc(ds, func(d deviceplugin.Device) bool { return d.ID == id })
	if i < 0 {
		ids := make([]string, len(ds))
		for j, d := range ds {
			ids[j] = d.ID
		}
		return deviceplugin.Device{}, fmt.Errorf("%s has no test GPU %q (its devices: %s)", g.Node, id, strings.Join(ids, ", "))
	}
	return ds[i], nil
}

// Fail turns the device id (the first healthy one when id is "") Unhealthy, after an Xid
// line of code for it in the node's kernel log when code is not 0. It returns the device
// and the line.
func (g GPUControl) Fail(ctx context.Context, id string, code int) (deviceplugin.Device, string, error) {
	ds, err := g.List(ctx)
	if err != nil {
		return deviceplugin.Device{}, "", err
	}
	if id == "" {
		i := slices.IndexFunc(ds, func(d deviceplugin.Device) bool { return d.Health == "Healthy" })
		if i < 0 {
			return deviceplugin.Device{}, "", fmt.Errorf("every test GPU of %s is Unhealthy already (coronerctl chaos device-heal %s)", g.Node, g.Node)
		}
		id = ds[i].ID
	} else if _, err := g.find(ds, id); err != nil {
		return deviceplugin.Device{}, "", err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if code == 0 {
		d, err := g.Client.Fail(ctx, id)
		return d, "", err
	}
	return g.Client.FailWithXid(ctx, id, code)
}

// Xid writes an Xid line of code for the device id in the node's kernel log, its health
// left as it is; it returns the device and the line.
func (g GPUControl) Xid(ctx context.Context, id string, code int) (deviceplugin.Device, string, error) {
	ds, err := g.List(ctx)
	if err != nil {
		return deviceplugin.Device{}, "", err
	}
	if _, err := g.find(ds, id); err != nil {
		return deviceplugin.Device{}, "", err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return g.Client.WriteXid(ctx, id, code)
}

// Heal turns the device id Healthy, or every Unhealthy device when id is ""; it returns
// the devices it healed.
func (g GPUControl) Heal(ctx context.Context, id string) ([]deviceplugin.Device, error) {
	ds, err := g.List(ctx)
	if err != nil {
		return nil, err
	}
	var ids []string
	if id != "" {
		if _, err := g.find(ds, id); err != nil {
			return nil, err
		}
		ids = []string{id}
	} else {
		for _, d := range ds {
			if d.Health != "Healthy" {
				ids = append(ids, d.ID)
			}
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var healed []deviceplugin.Device
	var errs []error
	for _, id := range ids {
		d, err := g.Client.Heal(ctx, id)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		healed = append(healed, d)
	}
	return healed, errors.Join(errs...)
}

// TestGPUDevices returns the test GPUs of a lab node (process or VM node) and a function
// that releases the connection.
func (c Config) TestGPUDevices(ctx context.Context, node string) (GPUControl, func(), error) {
	cl, where, release, err := c.TestGPUClient(ctx, node)
	if err != nil {
		return GPUControl{}, nil, err
	}
	return GPUControl{Node: node, Client: cl, Where: where}, release, nil
}

// PodTestGPU returns the test GPU the pod's containers hold on its node, from the
// kubelet's allocatedResourcesStatus in the pod's status (the first one, in container
// order), or an error when the status names none.
func PodTestGPU(pod *corev1.Pod) (string, error) {
	for _, s := range append(slices.Clone(pod.Status.InitContainerStatuses), pod.Status.ContainerStatuses...) {
		for _, r := range s.AllocatedResourcesStatus {
			if r.Name == corev1.ResourceName(TestGPUResource) && len(r.Resources) > 0 {
				return string(r.Resources[0].ResourceID), nil
			}
		}
	}
	return "", fmt.Errorf("pod %s/%s holds no %s: none in its containers' allocatedResourcesStatus", pod.Namespace, pod.Name, TestGPUResource)
}

// TestGPUHealth is the health the kubelet reports in the pod's status for its test GPU
// id (allocatedResourcesStatus), "" when it reports none.
func TestGPUHealth(pod *corev1.Pod, id string) corev1.ResourceHealthStatus {
	for _, s := range append(slices.Clone(pod.Status.InitContainerStatuses), pod.Status.ContainerStatuses...) {
		for _, r := range s.AllocatedResourcesStatus {
			if r.Name != corev1.ResourceName(TestGPUResource) {
				continue
			}
			for _, h := range r.Resources {
				if string(h.ResourceID) == id {
					return h.Health
				}
			}
		}
	}
	return ""
}
