package kind

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/coroner-dev/coroner/test/lab"
)

// The kind cluster's node controls, the same verbs as the lab's (test/lab/chaos.go) for
// `coronerctl chaos` and the e2e suite: a kind node is a container of our dockerd, so
//   - a partition takes the host end of the node container's veth pair down (the node's
//     eth0 loses its carrier, its addresses and routes stay, as on the lab's nodes): its
//     kubelet, agent and pods reach neither the API server nor the other nodes and keep
//     running; Heal puts it back up;
//   - the kubelet is a systemd unit in the node: KillKubelet stops it (SIGKILL, then the
//     unit stays stopped, since kind's unit would restart a killed kubelet in a second),
//     StartKubelet starts it;
//   - a node OOM lowers the limit of the node's kubepods cgroup, which on this cgroup v1
//     machine is a cgroup of the host below the node container's own
//     (/docker/<id>/kubelet.slice/kubelet-kubepods.slice: the kubelet's systemd driver with
//     kind's cgroupRoot /kubelet), with the lab's squeeze.

// IsNode reports whether name is a node container of the cluster (running or not).
func (c Config) IsNode(ctx context.Context, name string) bool {
	out, err := c.docker(ctx, "ps", "-a", "--filter", "label=io.x-k8s.kind.cluster="+c.Cluster, "--format", "{{.Names}}")
	if err != nil {
		return false
	}
	for _, n := range strings.Fields(out) {
		if n == name {
			return true
		}
	}
	return false
}

// nodePID is the host PID of the node container's init (its systemd).
func (c Config) nodePID(ctx context.Context, node string) (int, error) {
	if !c.IsNode(ctx, node) {
		return 0, fmt.Errorf("%q is not a node of the kind cluster %s", node, c.Cluster)
	}
	out, err := c.docker(ctx, "inspect", "-f", "{{.State.Pid}}", node)
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("node %s: no running container (pid %q)", node, strings.TrimSpace(out))
	}
	return pid, nil
}

// hostVeth is the host end of the node container's eth0: the link whose index the node's
// eth0 names as its peer (iflink).
func (c Config) hostVeth(ctx context.Context, node string) (netlink.Link, error) {
	if _, err := c.nodePID(ctx, node); err != nil {
		return nil, err
	}
	out, err := c.docker(ctx, "exec", node, "cat", "/sys/class/net/eth0/iflink")
	if err != nil {
		return nil, err
	}
	idx, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		return nil, fmt.Errorf("node %s: eth0's iflink %q: %w", node, out, err)
	}
	link, err := netlink.LinkByIndex(idx)
	if err != nil {
		return nil, fmt.Errorf("node %s: the host end of eth0 (index %d): %w", node, idx, err)
	}
	return link, nil
}

// Partition takes the node off the network (the host end of its veth down); it returns
// the link's name.
func (c Config) Partition(ctx context.Context, node string) (string, error) {
	return c.setLink(ctx, node, false)
}

// Heal puts a partitioned node back on the network; it returns the link's name.
func (c Config) Heal(ctx context.Context, node string) (string, error) {
	return c.setLink(ctx, node, true)
}

func (c Config) setLink(ctx context.Context, node string, up bool) (string, error) {
	link, err := c.hostVeth(ctx, node)
	if err != nil {
		return "", err
	}
	name := link.Attrs().Name
	if up {
		err = netlink.LinkSetUp(link)
	} else {
		err = netlink.LinkSetDown(link)
	}
	if err != nil {
		return name, fmt.Errorf("node %s: set link %s up=%v: %w", node, name, up, err)
	}
	return name, nil
}

// Partitioned reports whether the node's host link is down.
func (c Config) Partitioned(ctx context.Context, node string) (bool, error) {
	link, err := c.hostVeth(ctx, node)
	if err != nil {
		return false, err
	}
	return link.Attrs().Flags&net.FlagUp == 0, nil
}

// KillKubelet kills the node's kubelet with SIGKILL and keeps its unit stopped; its
// containers keep running. It returns the killed kubelet's PID in the node.
func (c Config) KillKubelet(ctx context.Context, node string) (int, error) {
	if _, err := c.nodePID(ctx, node); err != nil {
		return 0, err
	}
	out, err := c.docker(ctx, "exec", node, "systemctl", "show", "-p", "MainPID", "--value", "kubelet")
	if err != nil {
		return 0, err
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(out))
	if pid == 0 {
		return 0, fmt.Errorf("node %s: the kubelet is not running", node)
	}
	// kill, then stop: stop alone sends SIGTERM, and the unit's Restart=always would bring
	// a killed kubelet back before stop is run.
	if _, err := c.docker(ctx, "exec", node, "sh", "-c", "systemctl kill --signal=SIGKILL kubelet && systemctl stop kubelet"); err != nil {
		return pid, err
	}
	return pid, nil
}

// StartKubelet starts the node's kubelet unit again; it returns the new kubelet's PID in
// the node.
func (c Config) StartKubelet(ctx context.Context, node string) (int, error) {
	if _, err := c.nodePID(ctx, node); err != nil {
		return 0, err
	}
	if _, err := c.docker(ctx, "exec", node, "systemctl", "start", "kubelet"); err != nil {
		return 0, err
	}
	out, err := c.docker(ctx, "exec", node, "systemctl", "show", "-p", "MainPID", "--value", "kubelet")
	if err != nil {
		return 0, err
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(out))
	return pid, nil
}

// KubepodsCgroup is the node's kubepods memory cgroup, relative to this machine's memory
// hierarchy: the node container's own cgroup (from its init's /proc/PID/cgroup) and the
// kubelet's kubepods slice below it.
func (c Config) KubepodsCgroup(ctx context.Context, node string) (string, error) {
	pid, err := c.nodePID(ctx, node)
	if err != nil {
		return "", err
	}
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cgroup"))
	if err != nil {
		return "", err
	}
	var base string
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.SplitN(l, ":", 3)
		if len(f) != 3 {
			continue
		}
		for _, ctrl := range strings.Split(f[1], ",") {
			if ctrl == "memory" || (f[0] == "0" && f[1] == "" && base == "") {
				base = f[2]
			}
		}
	}
	if base == "" {
		return "", fmt.Errorf("node %s: no memory cgroup in /proc/%d/cgroup", node, pid)
	}
	// The node's systemd moves itself into init.scope below the container's cgroup: the
	// kubelet's slices are beside it.
	for _, dir := range []string{base, filepath.Dir(base)} {
		for _, root := range []string{"/sys/fs/cgroup/memory", "/sys/fs/cgroup"} {
			matches, _ := filepath.Glob(filepath.Join(root, dir, "kubelet.slice", "kubelet-kubepods.slice"))
			if len(matches) == 1 {
				rel, _ := filepath.Rel(root, matches[0])
				return "/" + rel, nil
			}
		}
	}
	return "", fmt.Errorf("node %s: no kubelet.slice/kubelet-kubepods.slice below its cgroup %s", node, base)
}

// NodeOOM makes the kernel's OOM killer kill a task among the pods of the node, as when
// the node runs out of memory: the lab's squeeze of the node's kubepods cgroup.
func (c Config) NodeOOM(ctx context.Context, node string, timeout time.Duration) (lab.OOMResult, error) {
	rel, err := c.KubepodsCgroup(ctx, node)
	if err != nil {
		return lab.OOMResult{}, err
	}
	return lab.SqueezeCgroup(ctx, rel, timeout)
}

// NodeSocket is the node's containerd socket as this machine reaches it: through the root
// of the node container's init (/proc/PID/root), for a CRI client of the e2e suite.
func (c Config) NodeSocket(ctx context.Context, node string) (string, error) {
	pid, err := c.nodePID(ctx, node)
	if err != nil {
		return "", err
	}
	p := filepath.Join("/proc", strconv.Itoa(pid), "root", "run", "containerd", "containerd.sock")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("node %s: %w", node, err)
	}
	return p, nil
}
