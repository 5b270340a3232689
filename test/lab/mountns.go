package lab

// mountns.go: a mount namespace per process node.
//
// The kubelet's device manager listens at a fixed path, /var/lib/kubelet/device-plugins/
// kubelet.sock (not under --root-dir), and deletes every other socket in that directory
// when it starts; the agent finds the kubelet's PodResources socket at the fixed path
// /var/lib/kubelet/pod-resources/kubelet.sock, and the test GPU plugin keeps its state in
// /var/lib/coroner-test-gpu. Three kubelets on one file system cannot each have those. So
// each process node lives in a mount namespace of its own, where the node's own
// directories are bind-mounted over the fixed paths:
//
//	_output/lab/nodes/NODE/device-plugins          -> /var/lib/kubelet/device-plugins
//	_output/lab/nodes/NODE/kubelet/pod-resources   -> /var/lib/kubelet/pod-resources
//	_output/lab/nodes/NODE/test-gpu                -> /var/lib/coroner-test-gpu
//
// A holder process (ns-NODE in the state: `sh -c ... coroner-lab-ns NODE_DIR ...` under
// `unshare --mount --propagation slave`) makes the mounts and then waits, without a child,
// for as long as the node lives; the node's containerd, kubelet and test GPU plugin start
// in its namespace and the node's network namespace through `nsenter --mount=/proc/HOLDER/
// ns/mnt --net=/run/netns/NODE`, which execs them (the recorded PID is the program's; a Go
// process cannot setns into a mount namespace itself, being multi-threaded). containerd's
// shims and the containers start from there, so a hostPath of a pod is the node's view
// too: the agent's /var/lib/kubelet/pod-resources is its own kubelet's.
//
// Slave, not private: the host's mounts still propagate into the node (the lab makes
// /sys/fs/cgroup rshared, and containerd refuses the agent's mountPropagation
// HostToContainer from a mount that is neither shared nor slave), while nothing mounted in
// the node reaches the host. The kubelet's own mounts (its root dir made rshared, every
// secret and projected volume's tmpfs) and containerd's (container root file systems, pod
// network namespace files) now live in the node's namespace and vanish with it when its
// last process exits: the host's mount table shows none of them.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// TestGPUStateDir is the test GPU plugin's state directory in every node (test/deviceplugin
// state.go): its health files and fake NVIDIA driver files, deploy/overlays/lab's
// --nvidia-gpus-dir=/var/lib/coroner-test-gpu/nvidia/gpus for the agent.
const TestGPUStateDir = "/var/lib/coroner-test-gpu"

// nodeMount is a directory of the node bind-mounted over a fixed path in its namespace.
type nodeMount struct {
	sub    string // relative to the node's directory
	target string
}

var nodeMounts = []nodeMount{
	{"device-plugins", "/var/lib/kubelet/device-plugins"},
	{"kubelet/pod-resources", "/var/lib/kubelet/pod-resources"},
	{"test-gpu", TestGPUStateDir},
}

// holderName is the state's name of the node's namespace holder.
func holderName(n Node) string { return "ns-" + n.Name }

// holderScript makes the bind mounts ("$3"/"$4", "$5"/"$6", ...) and then blocks in the
// open of the FIFO "$2", which nobody writes: the namespace lives while the shell does,
// with no child process that could outlive it and pin the namespace. "$1" is the node's
// directory, there for the lab's sweep to find the holder by (processesUsing).
const holderScript = `set -eu
fifo=$2
shift 2
while [ $# -ge 2 ]; do
	mount --bind "$1" "$2"
	shift 2
done
while :; do read -r _ <"$fifo" || :; done
`

// startHolder starts the node's namespace holder, records it, and waits until its mounts
// are made.
func (c Config) startHolder(st *State, n Node) error {
	dir := c.nodeDir(n)
	args := []string{"--mount", "--propagation", "slave", "--", "/bin/sh", "-c", holderScript, "coroner-lab-ns", dir}
	fifo := filepath.Join(c.nodeRunDir(n), "ns-holder.fifo")
	_ = os.Remove(fifo)
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		return fmt.Errorf("mkfifo %s: %w", fifo, err)
	}
	args = append(args, fifo)
	for _, m := range nodeMounts {
		src := filepath.Join(dir, m.sub)
		// The source in the node's directory, the target on this machine (an empty
		// directory, covered in every node's namespace).
		for _, d := range []string{src, m.target} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
		}
		args = append(args, src, m.target)
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		return fmt.Errorf("unshare (util-linux) not found: %w", err)
	}
	p, err := startDaemon(holderName(n), unshare, args, c.logPath(holderName(n)), "")
	if err != nil {
		return err
	}
	p.Node = n.Name
	if err := st.addProc(p); err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if !p.running() {
			return fmt.Errorf("the mount namespace holder of %s exited:\n%s", n.Name, logTail(p.Log, 2000))
		}
		missing := missingMounts(p.PID)
		if len(missing) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the mount namespace of %s has no mount on %s after 10s:\n%s", n.Name, strings.Join(missing, ", "), logTail(p.Log, 2000))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// missingMounts are the targets of nodeMounts that are not mount points in the mount
// namespace of pid.
func missingMounts(pid int) []string {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/mountinfo")
	points := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 {
			points[unescapeMountPath(f[4])] = true
		}
	}
	var missing []string
	for _, m := range nodeMounts {
		if !points[m.target] {
			missing = append(missing, m.target)
		}
	}
	return missing
}

// startInNode starts a daemon of the process node n (startDaemon) in the node's mount
// namespace, that of its holder, and its network namespace, through nsenter, and records
// it. Its working directory is DaemonDir (entering a mount namespace moves a process to
// the namespace's root otherwise).
func (c Config) startInNode(st *State, n Node, name, bin string, args []string, logPath string) (Proc, error) {
	h, ok := st.proc(holderName(n))
	if !ok || !h.running() {
		return Proc{}, fmt.Errorf("the mount namespace of %s is gone (its holder %s is not running): make lab repairs the lab", n.Name, holderName(n))
	}
	nsenter, err := exec.LookPath("nsenter")
	if err != nil {
		return Proc{}, fmt.Errorf("nsenter (util-linux) not found: %w", err)
	}
	if err := os.MkdirAll(DaemonDir, 0o755); err != nil {
		return Proc{}, err
	}
	nargs := append([]string{"--mount=/proc/" + strconv.Itoa(h.PID) + "/ns/mnt", "--net=" + n.NetnsPath(), "--wd=" + DaemonDir, "--", bin}, args...)
	p, err := startDaemon(name, nsenter, nargs, logPath, "")
	if err != nil {
		return p, err
	}
	p.Node = n.Name
	return p, st.addProc(p)
}

// mountTargets are the fixed paths each node has its own of.
func mountTargets() []string {
	var ts []string
	for _, m := range nodeMounts {
		ts = append(ts, m.target)
	}
	return ts
}

// mountTargetsLeft are the targets of nodeMounts that are mount points on this machine
// (Down: a node's mount must never reach the host).
func mountTargetsLeft() []string {
	var left []string
	for _, m := range nodeMounts {
		left = append(left, mountsUnder(m.target)...)
	}
	return left
}
