package kind

// devices.go: the test GPU plugin (test/deviceplugin's coroner-test-gpu) in each worker of
// the kind cluster, as on the lab's nodes (test/lab testgpu.go): a systemd unit in the node
// container, started after its kubelet, with the node's own PCI domain (kind nodes share
// this machine's kernel log with the lab's process nodes, domains 1-4: the workers have
// 0101, 0102, ...). Its control socket is /run/coroner-test-gpu.sock in the node, which this
// machine reaches through the root of the node container's init, /proc/PID/root.

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/coroner-dev/coroner/test/deviceplugin"
	"github.com/coroner-dev/coroner/test/lab"
)

// testGPUControl is the plugin's control socket in a node container.
const testGPUControl = "/run/coroner-test-gpu.sock"

// testGPUUnit is the plugin's systemd unit in a worker: restarted when it exits, as a
// vendor's plugin DaemonSet would be.
func testGPUUnit(pciBase string) string {
	return fmt.Sprintf(`[Unit]
Description=coroner test GPU device plugin (coroner.dev/test-gpu)
After=kubelet.service
[Service]
ExecStart=/usr/local/bin/coroner-test-gpu %s
Restart=always
RestartSec=1
[Install]
WantedBy=multi-user.target
`, strings.Join(lab.TestGPUArgs(testGPUControl, pciBase), " "))
}

// workers are the cluster's worker node names, in order.
func (c Config) workers(ctx context.Context) ([]string, error) {
	ns, err := c.nodes(ctx)
	if err != nil {
		return nil, err
	}
	var ws []string
	for _, n := range ns {
		if !strings.HasSuffix(n.Name, "-control-plane") {
			ws = append(ws, n.Name)
		}
	}
	if len(ws) != c.Workers {
		return ws, fmt.Errorf("%d workers registered, want %d", len(ws), c.Workers)
	}
	return ws, nil
}

// startTestGPUs builds the plugin, copies it into every worker, starts its unit there and
// waits until each worker reports lab.TestGPUs allocatable test GPUs.
func (c Config) startTestGPUs(ctx context.Context) error {
	bin := filepath.Join(c.Out, "bin", "coroner-test-gpu")
	if err := c.goBuild(ctx, bin, "./test/deviceplugin/cmd/coroner-test-gpu"); err != nil {
		return err
	}
	ws, err := c.workers(ctx)
	if err != nil {
		return err
	}
	for i, w := range ws {
		base := fmt.Sprintf("%04x:10", 0x100+i+1)
		if _, err := c.docker(ctx, "cp", bin, w+":/usr/local/bin/coroner-test-gpu"); err != nil {
			return err
		}
		if err := c.run(ctx, strings.NewReader(testGPUUnit(base)), "docker", "exec", "-i", w, "sh", "-c",
			"cat >/etc/systemd/system/coroner-test-gpu.service && systemctl daemon-reload && systemctl enable --now coroner-test-gpu.service && systemctl restart coroner-test-gpu.service"); err != nil {
			return fmt.Errorf("node %s: the test GPU plugin's unit: %w", w, err)
		}
		c.say("node %s: coroner-test-gpu, %d devices from PCI %s:00.0", w, lab.TestGPUs, base)
	}
	return waitFor(ctx, 2*time.Minute, time.Second, fmt.Sprintf("%d allocatable %s on every worker", lab.TestGPUs, lab.TestGPUResource), func() (bool, error) {
		for _, w := range ws {
			out, err := c.kubectl(ctx, "get", "node", w, "-o", `jsonpath={.status.allocatable.coroner\.dev/test-gpu}`)
			if err != nil {
				return false, err
			}
			if strings.TrimSpace(out) != strconv.Itoa(lab.TestGPUs) {
				return false, fmt.Errorf("node %s has %q", w, strings.TrimSpace(out))
			}
		}
		return true, nil
	})
}

// TestGPUDevices returns the test GPUs of a kind worker, through its plugin's control
// socket, and a function that releases the connection.
func (c Config) TestGPUDevices(ctx context.Context, node string) (lab.GPUControl, func(), error) {
	pid, err := c.nodePID(ctx, node)
	if err != nil {
		return lab.GPUControl{}, nil, err
	}
	sock := filepath.Join("/proc", strconv.Itoa(pid), "root", strings.TrimPrefix(testGPUControl, "/"))
	cl := deviceplugin.NewControlClient(sock)
	return lab.GPUControl{Node: node, Client: cl, Where: testGPUControl + " in the node container (" + sock + ")"}, cl.Close, nil
}
