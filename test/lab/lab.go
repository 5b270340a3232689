// Package lab runs coroner's local lab: a Kubernetes v1.36.3 cluster made of processes on
// this machine (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) and three
// nodes, each a real kubelet with its own containerd in its own network and mount namespace, with
// coroner deployed from deploy/overlays/lab and a demo Job (requirement L1).
//
// Layout:
//
//	_output/lab/state.json        what Up started and created (PIDs, netns, links, cgroups), for Down
//	_output/lab/kubeconfig        cluster-admin kubeconfig
//	_output/lab/pki/              CA, serving and client certificates, kubeconfigs of the components
//	_output/lab/logs/             one log per process (kept by Down until the next Up)
//	_output/lab/etcd/             etcd data
//	_output/lab/nodes/NODE/       containerd root and config, CNI config, kubelet root-dir and config, pod logs,
//	                              device-plugins/ and test-gpu/ (bind-mounted in the node's mount namespace)
//	/run/coroner-lab/NODE/        containerd.sock, containerd state, runc root, test-gpu.sock
//
// Each node runs in a mount namespace of its own (mountns.go), where its directories cover
// /var/lib/kubelet/device-plugins, /var/lib/kubelet/pod-resources and
// /var/lib/coroner-test-gpu, and runs the test GPU device plugin, 2 devices of
// coroner.dev/test-gpu (testgpu.go; coronerctl chaos device-fail/device-heal).
//
// Network (all created with netlink): a bridge coroner-lab0 on the host with 10.77.0.1/24
// and the API server's address 10.77.100.1/32; per node a network namespace coroner-lab-N
// (/run/netns/coroner-lab-N) joined to the bridge by a veth pair (crlab-N on the host, eth0
// in the node) with the node IP 10.77.0.1N, and a pod CIDR 10.77.N.0/24 (CNI bridge +
// host-local inside the node's namespace), routed from the host and the other nodes.
//
// The API server listens on 10.77.100.1:443, which is also the ClusterIP of the
// `kubernetes` Service (service CIDR 10.77.100.0/24): there is no kube-proxy, and this way
// in-cluster clients reach the API server through the Service's address anyway (a pod's
// packets go to its node, then to the host, where 10.77.100.1 is local).
package lab

import (
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/coroner-dev/coroner/test/host"
)

// Fixed names and addresses of the lab. Only one lab runs on a machine at a time.
const (
	BridgeName = "coroner-lab0"
	RunDir     = "/run/coroner-lab"
	// DaemonDir is the working directory of the lab's daemons, kept empty (startDaemon).
	DaemonDir    = RunDir + "/cwd"
	NetnsPrefix  = "coroner-lab-"
	VethPrefix   = "crlab-"
	CgroupParent = "coroner-lab"

	// APIServerIP is the API server's address and the `kubernetes` Service's ClusterIP.
	APIServerIP   = "10.77.100.1"
	APIServerPort = 443
	ServiceCIDR   = "10.77.100.0/24"
	// LabCIDR covers every address of the lab; nothing else on the host may route into it.
	LabCIDR  = "10.77.0.0/16"
	bridgeIP = "10.77.0.1"

	EtcdClientPort = 2379
	EtcdPeerPort   = 2380
	KCMPort        = 10257
	SchedulerPort  = 10259

	// DemoNamespace and DemoJob name the demo Job.
	DemoNamespace = "default"
	DemoJob       = "coroner-demo"
)

// Node is one lab node.
type Node struct {
	Name     string // lab-node-1: the Kubernetes node name
	Index    int    // 1, 2, 3
	Netns    string // coroner-lab-1
	HostVeth string // crlab-1, the host end of the veth pair; the node end is eth0
	IP       net.IP // 10.77.0.11
	PodCIDR  *net.IPNet
	// Runtime is the node's container runtime: RuntimeContainerd2, RuntimeContainerd17 or
	// RuntimeContainerd16.
	Runtime string
}

// The lab's container runtimes. The nodes mix them, so that every e2e run exercises both
// ways the agent learns of container exits, and the three containerd lines users run:
// containerd 2.x (built from its module by test/tools, with runc 1.5) serves CRI
// GetContainerEvents (the agent's events mode); containerd 1.7 (built from its module by
// test/tools, with Debian's runc 1.1) serves it too, but on one channel shared by all its
// callers, which the agent never subscribes to (it relists every second, as on 1.6);
// Debian's containerd 1.6 (runc 1.1) does not serve it.
const (
	RuntimeContainerd2  = "containerd-2"
	RuntimeContainerd17 = "containerd-1.7"
	RuntimeContainerd16 = "containerd-1.6"
)

// NetnsPath is the node's network namespace file.
func (n Node) NetnsPath() string { return "/run/netns/" + n.Netns }

// Socket is the node's containerd socket: /run/coroner-lab/<node>/containerd.sock, the path
// deploy/overlays/lab gives the agent.
func (n Node) Socket() string { return filepath.Join(RunDir, n.Name, "containerd.sock") }

// Cgroup is the node's kubelet cgroupRoot, relative to each hierarchy's root.
func (n Node) Cgroup() string { return CgroupParent + "/" + n.Name }

// gateway is the first address of the node's pod CIDR (the CNI bridge in the node).
func (n Node) gateway() net.IP {
	ip := n.PodCIDR.IP.To4()
	return net.IPv4(ip[0], ip[1], ip[2], 1)
}

// Nodes returns the lab's nodes: lab-node-1 .. lab-node-<count>, lab-node-2 on containerd
// 1.6, lab-node-3 on containerd 1.7 and the others on containerd 2.x.
func Nodes(count int) []Node {
	nodes := make([]Node, count)
	for i := range nodes {
		idx := i + 1
		_, cidr, _ := net.ParseCIDR(fmt.Sprintf("10.77.%d.0/24", idx))
		nodes[i] = Node{
			Name:     fmt.Sprintf("lab-node-%d", idx),
			Index:    idx,
			Netns:    fmt.Sprintf("%s%d", NetnsPrefix, idx),
			HostVeth: fmt.Sprintf("%s%d", VethPrefix, idx),
			IP:       net.IPv4(10, 77, 0, byte(10+idx)),
			PodCIDR:  cidr,
			Runtime:  RuntimeContainerd2,
		}
		switch idx {
		case 2:
			// lab-node-2 (the e2e suite's node-OOM node) runs Debian's 1.6.
			nodes[i].Runtime = RuntimeContainerd16
		case 3:
			// lab-node-3 (the e2e suite's busy node: preemption, drain, partition) runs 1.7.
			nodes[i].Runtime = RuntimeContainerd17
		}
	}
	return nodes
}

// Config says where the lab lives and what Up does.
type Config struct {
	// Root is the repository root.
	Root string
	// Dir is the lab's directory, <Root>/_output/lab.
	Dir string
	// BinDir holds the Kubernetes binaries and coroner's, <Root>/_output/bin.
	BinDir string
	// Overlay is the kustomization applied to deploy coroner, <Root>/deploy/overlays/lab.
	Overlay string
	Nodes   []Node
	// Out receives progress; default os.Stdout.
	Out io.Writer

	// SkipBuild does not run the builds (tools, coroner binaries, images); they must exist.
	SkipBuild bool
	// SkipDeploy does not deploy coroner (and so no demo either).
	SkipDeploy bool
	// SkipDemo does not run the demo Job.
	SkipDemo bool

	// VM adds the VM node lab-node-4 (systemd, cgroup v2, QEMU: vm.go); LAB_VM=1 for
	// coroner-lab (test/lab/cmd/coroner-lab).
	VM bool
}

// DefaultConfig is the lab of the repository that holds the working directory.
func DefaultConfig() (Config, error) {
	root, err := host.RepoRoot()
	if err != nil {
		return Config{}, err
	}
	return ConfigFor(root), nil
}

// ConfigFor is the lab of the repository at root.
func ConfigFor(root string) Config {
	return Config{
		Root:    root,
		Dir:     filepath.Join(root, "_output", "lab"),
		BinDir:  filepath.Join(root, "_output", "bin"),
		Overlay: filepath.Join(root, "deploy", "overlays", "lab"),
		Nodes:   Nodes(3),
		Out:     os.Stdout,
	}
}

func (c Config) out() io.Writer {
	if c.Out == nil {
		return os.Stdout
	}
	return c.Out
}

// Paths inside the lab directory.
func (c Config) statePath() string        { return filepath.Join(c.Dir, "state.json") }
func (c Config) Kubeconfig() string       { return filepath.Join(c.Dir, "kubeconfig") }
func (c Config) pkiDir() string           { return filepath.Join(c.Dir, "pki") }
func (c Config) logDir() string           { return filepath.Join(c.Dir, "logs") }
func (c Config) etcdDir() string          { return filepath.Join(c.Dir, "etcd") }
func (c Config) nodeDir(n Node) string    { return filepath.Join(c.Dir, "nodes", n.Name) }
func (c Config) nodeRunDir(n Node) string { return filepath.Join(RunDir, n.Name) }
func (c Config) bin(name string) string   { return filepath.Join(c.BinDir, name) }
func (c Config) logPath(name string) string {
	return filepath.Join(c.logDir(), name+".log")
}

// APIServerURL is where the API server answers, from the host and from every node.
func APIServerURL() string {
	return "https://" + net.JoinHostPort(APIServerIP, fmt.Sprint(APIServerPort))
}

// shortPath shows a path relative to the repository root when it is inside it.
func (c Config) shortPath(p string) string {
	if rel, err := filepath.Rel(c.Root, p); err == nil && !strings.HasPrefix(rel, "..") {
		return rel
	}
	return p
}
