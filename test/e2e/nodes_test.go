package e2e

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/coroner-dev/coroner/test/lab"
)

// The node configurations the suite runs its OOM, exit and eviction cases on: one
// scenario, many nodes. The process nodes are always there; the VM node only in a lab
// brought up with LAB_VM=1 (test/lab/vm.go). Without it its cases skip, saying so, unless
// CORONER_E2E_REQUIRE_VM=1 (CI with the VM), which makes them fail.
type nodeConfig struct {
	node string // the Kubernetes node name
	what string // its configuration, as docs/node-configurations.md's table says
	vm   bool
}

// vmNode is the VM node: systemd as PID 1 on pure cgroup v2, the kubelet with the systemd
// cgroup driver, containerd 2.x with SystemdCgroup, in QEMU; tainted lab.coroner.dev/vm.
var vmNode = lab.VMNode().Name

// nodeConfigs are the nodes of the cluster the suite runs on (read after TestMain chose
// it: on kind the quiet node is a worker and there is no VM node).
func nodeConfigs() []nodeConfig {
	if suite.kind {
		return []nodeConfig{{node: quietNode, what: "a kind worker: containerd 2.x in a privileged container, systemd driver, cgroupRoot /kubelet, the host's cgroup v1"}}
	}
	return []nodeConfig{
		{node: quietNode, what: "containerd 2.x, cgroup v1, cgroupfs driver, a process node"},
		{node: vmNode, what: "containerd 2.x (SystemdCgroup), pure cgroup v2, systemd driver, a QEMU VM", vm: true},
	}
}

// vmTaintKey is the VM node's taint: only pods that tolerate it run there.
const vmTaintKey = "lab.coroner.dev/vm"

// vmLock gives the VM node to one case at a time: under software emulation it starts a
// pod in 10-20 s when alone, and a few cases at once (measured: 3 cases and 20 exits
// together) took it 6 minutes per pod, its agent failing its probes and the node
// NotReady. Its disturbances (a node OOM, a partition) need it alone anyway.
var vmLock sync.Mutex

// requireVM is CORONER_E2E_REQUIRE_VM=1: the VM node's cases fail when it is not there.
func requireVM() bool { return os.Getenv("CORONER_E2E_REQUIRE_VM") == "1" }

// needVM skips (or, with CORONER_E2E_REQUIRE_VM=1, fails) the test when the lab has no VM
// node.
func needVM(t *testing.T) {
	t.Helper()
	if suite.skip != "" {
		t.Skip(suite.skip)
	}
	if suite.vm {
		return
	}
	msg := "no VM node " + vmNode + " in the lab (systemd, cgroup v2): LAB_VM=1 make e2e runs this case on it"
	if requireVM() {
		t.Fatal(msg + " (CORONER_E2E_REQUIRE_VM=1)")
	}
	t.Skip(msg)
}

// vmTurn holds the VM node for the test until it ends.
func vmTurn(t *testing.T) {
	start := time.Now()
	vmLock.Lock()
	t.Cleanup(vmLock.Unlock)
	// Cleanups run last-registered first: the report comes while the case still holds the node.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the VM node when %s ended:\n%s", t.Name(), suite.cfg.VMHealth(context.Background()))
		}
	})
	if w := time.Since(start); w > time.Second {
		t.Logf("waited %v for the VM node", w.Round(time.Second))
	}
}

// onEachNode runs the case f on every node configuration, in parallel subtests named by
// the node: for a case whose outcome depends on the node's configuration (the cgroup
// version and driver the OOM classification reads, the kubelet's eviction, the runtime's
// events).
func onEachNode(t *testing.T, f func(t *testing.T, node string)) {
	onNodes(t, f, true)
}

// onEachNodeButVM is onEachNode for a case whose node part another case already checks on
// the VM node (the exit stamp: ExitToStamp; the OOM stamp: TestLimitOOMFailsJob): the rest
// is the shim's, the same on every node, so it skips the VM node, which takes one case at
// a time and 1-2 minutes per case. CORONER_E2E_VM_ALL=1 runs it there too.
func onEachNodeButVM(t *testing.T, f func(t *testing.T, node string)) {
	onNodes(t, f, os.Getenv("CORONER_E2E_VM_ALL") == "1")
}

func onNodes(t *testing.T, f func(t *testing.T, node string), vmToo bool) {
	if suite.skip != "" {
		t.Skip(suite.skip)
	}
	for _, nc := range nodeConfigs() {
		if nc.vm && !vmToo {
			continue
		}
		t.Run(nc.node, func(t *testing.T) {
			t.Parallel()
			if nc.vm {
				needVM(t)
				vmTurn(t)
			}
			t.Logf("on %s: %s", nc.node, nc.what)
			f(t, nc.node)
		})
	}
}

// isVM reports whether node is the VM node.
func isVM(node string) bool { return node == vmNode }

// budget is a timeout for node: the VM node, under software emulation, starts and stops
// pods several times slower than the process nodes.
func budget(node string, d time.Duration) time.Duration {
	if isVM(node) {
		return 3 * d
	}
	return d
}

// tolerateVM lets a pod run on the VM node.
func tolerateVM(spec *corev1.PodSpec) {
	spec.Tolerations = append(spec.Tolerations, corev1.Toleration{
		Key: vmTaintKey, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule,
	})
}
