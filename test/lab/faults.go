package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/coroner-dev/coroner/test/host"
)

// Faults of the control plane, the runtimes and coroner itself, for the chaos suite
// (test/chaos) on a lab that is up: restart the API server or a node's containerd with the
// arguments they run with, pause etcd, find and SIGKILL the shim's leader, tag an image on
// every node, and run a container the API server knows nothing of. Like chaos.go they act
// on this machine: root and a lab that is up, never a lab they bring up themselves.

// Restart says what a restart of a lab process did.
type Restart struct {
	Name           string
	OldPID, NewPID int
	// Signal is what the old process got first (SIGTERM: a graceful restart; SIGKILL: a
	// crash); Killed says whether it had to be SIGKILLed after the grace period.
	Signal syscall.Signal
	Killed bool
	// Down is the time from the signal to the new process serving again (the API
	// server's /readyz ok, containerd's CRI ready).
	Down time.Duration
}

// cmdline is /proc/PID/cmdline split at its NULs.
func cmdline(pid int) ([]string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return nil, err
	}
	args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	if len(args) == 0 || args[0] == "" {
		return nil, fmt.Errorf("pid %d has an empty command line", pid)
	}
	return args, nil
}

// restartProc stops the recorded process called name with sig (SIGKILL after grace) and
// starts it again with the command line it ran with, in the mount and network namespaces
// of its process node (if it has one: startInNode), appending to its log, and records the new process in the lab's
// state (so that Down stops it).
func (c Config) restartProc(name string, sig syscall.Signal, grace, downFor time.Duration) (Restart, error) {
	r := Restart{Name: name, Signal: sig}
	st, err := c.upState()
	if err != nil {
		return r, err
	}
	p, ok := st.proc(name)
	if !ok || !p.running() {
		return r, fmt.Errorf("%s is not running (make lab-status)", name)
	}
	r.OldPID = p.PID
	args, err := cmdline(p.PID)
	if err != nil {
		return r, fmt.Errorf("%s (pid %d): %w", name, p.PID, err)
	}
	bin := args[0]
	if !filepath.IsAbs(bin) {
		if exe, err := os.Readlink("/proc/" + strconv.Itoa(p.PID) + "/exe"); err == nil {
			bin = exe
		}
	}
	var node *Node
	if p.Node != "" {
		n, err := c.NodeNamed(p.Node)
		if err != nil {
			return r, err
		}
		if !n.IsVM() {
			node = &n
		}
	}
	if err := syscall.Kill(p.PID, sig); err != nil {
		return r, fmt.Errorf("signal %s (pid %d): %w", name, p.PID, err)
	}
	if !host.WaitGone([]int{p.PID}, grace) && p.running() {
		r.Killed = true
		_ = syscall.Kill(p.PID, syscall.SIGKILL)
		if !host.WaitGone([]int{p.PID}, 10*time.Second) && p.running() {
			return r, fmt.Errorf("%s (pid %d) did not die", name, p.PID)
		}
	}
	// Every thread gone, not only the leader: a thread still exiting holds the old
	// process's sockets, and the new one could not bind its port.
	if !host.WaitGone([]int{p.PID}, 30*time.Second) {
		return r, fmt.Errorf("%s (pid %d): threads of it still exiting after 30s", name, p.PID)
	}
	time.Sleep(downFor)
	if node != nil {
		// In the node's mount and network namespaces again (mountns.go).
		np, err := c.startInNode(st, *node, name, bin, args[1:], p.Log)
		r.NewPID = np.PID
		return r, err
	}
	np, err := startDaemon(name, bin, args[1:], p.Log, "")
	if err != nil {
		return r, err
	}
	np.Node = p.Node
	r.NewPID = np.PID
	return r, st.addProc(np)
}

// RestartAPIServer stops kube-apiserver with sig (SIGTERM: a graceful restart, as an
// upgrade would; SIGKILL: a crash), starts it again with the same flags and waits for
// /readyz. Down in the result is the time the API server did not serve.
//
// After SIGTERM the API server stops listening at once but drains its long requests for
// up to a minute before it exits (seen in the lab: 30s and more), with nobody serving:
// it gets SIGKILL after 10s (Killed in the result), as a supervisor would.
func (c Config) RestartAPIServer(ctx context.Context, sig syscall.Signal) (Restart, error) {
	start := time.Now()
	r, err := c.restartProc("kube-apiserver", sig, 10*time.Second, 0)
	if err != nil {
		return r, err
	}
	cs, err := c.Clientset()
	if err != nil {
		return r, err
	}
	st, _ := c.upState()
	p, _ := st.proc("kube-apiserver")
	err = Poll(ctx, 90*time.Second, "kube-apiserver /readyz after its restart", func() (bool, error) {
		if !p.running() {
			return false, fmt.Errorf("kube-apiserver exited after its restart:\n%s", logTail(p.Log, 3000))
		}
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(rctx)
		return err == nil && string(body) == "ok", nil
	})
	r.Down = time.Since(start)
	return r, err
}

// PauseEtcd stops etcd with SIGSTOP for d, then continues it (also when ctx ends first):
// the API server's requests hang, its watches stall, nothing is lost.
func (c Config) PauseEtcd(ctx context.Context, d time.Duration) error {
	st, err := c.upState()
	if err != nil {
		return err
	}
	p, ok := st.proc("etcd")
	if !ok || !p.running() {
		return errors.New("etcd is not running (make lab-status)")
	}
	if err := syscall.Kill(p.PID, syscall.SIGSTOP); err != nil {
		return fmt.Errorf("SIGSTOP etcd (pid %d): %w", p.PID, err)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
	if err := syscall.Kill(p.PID, syscall.SIGCONT); err != nil {
		return fmt.Errorf("SIGCONT etcd (pid %d): %w (send it by hand: kill -CONT %d)", p.PID, err, p.PID)
	}
	return ctx.Err()
}

// ResumeEtcd sends etcd SIGCONT, whatever its state: the undo of a PauseEtcd that was
// interrupted.
func (c Config) ResumeEtcd() error {
	st, err := c.upState()
	if err != nil {
		return err
	}
	p, ok := st.proc("etcd")
	if !ok || !p.running() {
		return errors.New("etcd is not running")
	}
	return syscall.Kill(p.PID, syscall.SIGCONT)
}

// RestartContainerd stops the node's containerd with sig (SIGTERM as `systemctl restart
// containerd` would, SIGKILL as a crash; the containers' shims, and so the containers, keep
// running either way), leaves it down for downFor (containerd.service restarts a crashed
// containerd after RestartSec=5s), starts it again with the same configuration in the
// node's network namespace, and waits until its CRI reports the runtime and the network
// ready.
func (c Config) RestartContainerd(ctx context.Context, node string, sig syscall.Signal, downFor time.Duration) (Restart, error) {
	n, err := c.NodeNamed(node)
	if err != nil {
		return Restart{}, err
	}
	if n.IsVM() {
		return Restart{}, fmt.Errorf("%s is the VM node: its containerd is a systemd unit in the guest (not supported here)", node)
	}
	start := time.Now()
	r, err := c.restartProc("containerd-"+node, sig, 15*time.Second, downFor)
	if err != nil {
		return r, err
	}
	cri, err := dialCRI(n.Socket())
	if err != nil {
		return r, err
	}
	defer cri.Close()
	err = Poll(ctx, 60*time.Second, "the CRI of "+node+" after containerd's restart", func() (bool, error) {
		return cri.ready(ctx) == nil, nil
	})
	r.Down = time.Since(start)
	return r, err
}

// ShimNamespace, ShimLease and ShimContainer name coroner-shim as deploy/ deploys it.
const (
	ShimNamespace = "coroner-system"
	ShimLease     = "coroner-shim"
	ShimContainer = "shim"
)

// ShimLeader is the replica of coroner-shim that holds the leader Lease.
type ShimLeader struct {
	// Identity is the Lease's holderIdentity: the pod's hostname (its name), "_", a UUID
	// per process.
	Identity string
	Pod      string
	Node     string
	// ContainerID is the shim container's ID without the runtime prefix.
	ContainerID string
	RenewTime   time.Time
}

// LeaseHolder returns the holder of the Lease ns/name and its last renewal ("" when none).
func LeaseHolder(ctx context.Context, cs kubernetes.Interface, ns, name string) (string, time.Time, error) {
	l, err := cs.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", time.Time{}, err
	}
	return leaseHolder(l)
}

func leaseHolder(l *coordinationv1.Lease) (string, time.Time, error) {
	var renew time.Time
	if l.Spec.RenewTime != nil {
		renew = l.Spec.RenewTime.Time
	}
	if l.Spec.HolderIdentity == nil {
		return "", renew, nil
	}
	return *l.Spec.HolderIdentity, renew, nil
}

// PodOfIdentity is the pod name in a leader election identity hostname_uuid.
func PodOfIdentity(identity string) string {
	pod, _, _ := strings.Cut(identity, "_")
	return pod
}

// FindShimLeader returns the shim replica that holds the leader Lease, with its node and
// container.
func FindShimLeader(ctx context.Context, cs kubernetes.Interface) (ShimLeader, error) {
	holder, renew, err := LeaseHolder(ctx, cs, ShimNamespace, ShimLease)
	if err != nil {
		return ShimLeader{}, fmt.Errorf("the leader Lease %s/%s: %w", ShimNamespace, ShimLease, err)
	}
	if holder == "" {
		return ShimLeader{}, fmt.Errorf("the leader Lease %s/%s has no holder", ShimNamespace, ShimLease)
	}
	l := ShimLeader{Identity: holder, Pod: PodOfIdentity(holder), RenewTime: renew}
	pod, err := cs.CoreV1().Pods(ShimNamespace).Get(ctx, l.Pod, metav1.GetOptions{})
	if err != nil {
		return l, fmt.Errorf("the leader's pod %s: %w", l.Pod, err)
	}
	l.Node = pod.Spec.NodeName
	for _, s := range pod.Status.ContainerStatuses {
		if s.Name == ShimContainer && s.State.Running != nil {
			_, l.ContainerID, _ = strings.Cut(s.ContainerID, "://")
		}
	}
	if l.ContainerID == "" {
		return l, fmt.Errorf("the leader's pod %s has no running %s container", l.Pod, ShimContainer)
	}
	return l, nil
}

// ContainerPID returns the host PID of the init process of the container id on the lab
// node, from its runtime's CRI verbose status ("pid" in containerd's info, 1.6 and 2.x).
func (c Config) ContainerPID(ctx context.Context, node, id string) (int, error) {
	n, err := c.NodeNamed(node)
	if err != nil {
		return 0, err
	}
	if n.IsVM() {
		return 0, fmt.Errorf("%s is the VM node: its PIDs are the guest's", node)
	}
	cri, err := dialCRI(n.Socket())
	if err != nil {
		return 0, err
	}
	defer cri.Close()
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := cri.runtime.ContainerStatus(cctx, &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: true})
	if err != nil {
		return 0, fmt.Errorf("CRI status of container %s on %s: %w", id, node, err)
	}
	var info struct {
		PID int `json:"pid"`
	}
	if err := json.Unmarshal([]byte(resp.GetInfo()["info"]), &info); err != nil || info.PID <= 0 {
		return 0, fmt.Errorf("no pid in the CRI verbose status of container %s on %s (%v)", id, node, err)
	}
	return info.PID, nil
}

// ShimKill says which leader KillShimLeader killed, and when.
type ShimKill struct {
	ShimLeader
	PID int
	At  time.Time
}

// KillShimLeader SIGKILLs the process of the shim replica that holds the leader Lease, as
// a crash would: no Lease release, no shutdown. The kubelet restarts the container.
func (c Config) KillShimLeader(ctx context.Context, cs kubernetes.Interface) (ShimKill, error) {
	if _, err := c.upState(); err != nil {
		return ShimKill{}, err
	}
	l, err := FindShimLeader(ctx, cs)
	if err != nil {
		return ShimKill{ShimLeader: l}, err
	}
	pid, err := c.ContainerPID(ctx, l.Node, l.ContainerID)
	if err != nil {
		return ShimKill{ShimLeader: l}, err
	}
	k := ShimKill{ShimLeader: l, PID: pid, At: time.Now()}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return k, fmt.Errorf("SIGKILL the shim leader %s (pid %d on %s): %w", l.Pod, pid, l.Node, err)
	}
	return k, nil
}

// TagImage gives the image src a second name dst in every node's containerd, the VM
// node's too when it runs (as a new release's tag of the same image would), and waits
// until each CRI plugin sees it.
func (c Config) TagImage(ctx context.Context, src, dst string) error {
	st, err := c.upState()
	if err != nil {
		return err
	}
	for _, n := range c.Nodes {
		rt, err := c.runtime(n)
		if err != nil {
			return err
		}
		out, err := exec.CommandContext(ctx, rt.Ctr, "-a", n.Socket(), "-n", "k8s.io", "images", "tag", "--force", src, dst).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s: ctr images tag %s %s: %w\n%s", n.Name, src, dst, err, out)
		}
		if err := waitCRIImage(ctx, n.Name, n.Socket(), dst); err != nil {
			return err
		}
	}
	if _, ok := vmRunning(st); ok {
		n := VMNode()
		if out, err := c.VMExec(ctx, vmCtr("images tag --force "+src+" "+dst)); err != nil {
			return fmt.Errorf("%s: ctr images tag %s %s: %w\n%s", n.Name, src, dst, err, out)
		}
		local, stop, err := c.VMSocket(ctx, n.Socket())
		if err != nil {
			return fmt.Errorf("%s: %w", n.Name, err)
		}
		defer stop()
		if err := waitCRIImage(ctx, n.Name, local, dst); err != nil {
			return err
		}
	}
	return nil
}

// vmCtr is a shell command that runs ctr with args on the VM node's containerd, in its
// k8s.io namespace.
func vmCtr(args string) string {
	return ". " + vmGuestOS + "/node/node.env && " + vmGuestOS + "/bin/containerd2/ctr -a \"$SOCKET\" -n k8s.io " + args
}

// waitCRIImage waits until the CRI plugin at socket (node's) knows the image name.
func waitCRIImage(ctx context.Context, node, socket, name string) error {
	cri, err := dialCRI(socket)
	if err != nil {
		return err
	}
	defer cri.Close()
	return Poll(ctx, 20*time.Second, "image "+name+" in the CRI plugin of "+node, func() (bool, error) {
		r, err := cri.images.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: name}})
		return err == nil && r.Image != nil, nil
	})
}

// UntagImage removes the image name from every node's containerd, the VM node's too when
// it runs (the content stays while another name refers to it).
func (c Config) UntagImage(ctx context.Context, name string) error {
	var errs []error
	for _, n := range c.Nodes {
		rt, err := c.runtime(n)
		if err != nil {
			return err
		}
		if out, err := exec.CommandContext(ctx, rt.Ctr, "-a", n.Socket(), "-n", "k8s.io", "images", "rm", name).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("%s: ctr images rm %s: %w\n%s", n.Name, name, err, out))
		}
	}
	if st, err := c.upState(); err == nil {
		if _, ok := vmRunning(st); ok {
			if out, err := c.VMExec(ctx, vmCtr("images rm "+name)); err != nil {
				errs = append(errs, fmt.Errorf("%s: ctr images rm %s: %w\n%s", VMNode().Name, name, err, out))
			}
		}
	}
	return errors.Join(errs...)
}

// UnknownContainer is a pod sandbox and a container started on a node's runtime through
// CRI, behind the kubelet's back: the runtime's events name a pod UID the API server has
// never heard of.
type UnknownContainer struct {
	Node, SandboxID, ContainerID, PodUID string
}

// RunUnknownContainer starts, on the node's containerd, a sandbox labelled as a pod with
// a random UID and a busybox container that exits with code exit after a second. Remove
// takes them away.
func (c Config) RunUnknownContainer(ctx context.Context, node, name string, exit int) (UnknownContainer, error) {
	u := UnknownContainer{Node: node}
	n, err := c.NodeNamed(node)
	if err != nil {
		return u, err
	}
	if n.IsVM() {
		return u, fmt.Errorf("%s is the VM node (not supported here)", node)
	}
	if _, err := c.upState(); err != nil {
		return u, err
	}
	b := make([]byte, 16)
	f, err := os.Open("/dev/urandom")
	if err != nil {
		return u, err
	}
	_, err = f.Read(b)
	f.Close()
	if err != nil {
		return u, err
	}
	u.PodUID = fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
	cri, err := dialCRI(n.Socket())
	if err != nil {
		return u, err
	}
	defer cri.Close()
	labels := map[string]string{
		"io.kubernetes.pod.name":      name,
		"io.kubernetes.pod.namespace": "coroner-chaos-unknown",
		"io.kubernetes.pod.uid":       u.PodUID,
	}
	// A log directory and path as the kubelet gives them: with none, the kubelet that
	// removes the container deletes "*" in its working directory (see startDaemon).
	logDir := c.unknownLogDir(n, u.PodUID)
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return u, err
	}
	sbConfig := &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "coroner-chaos-unknown", Uid: u.PodUID},
		Hostname:     name,
		Labels:       labels,
		LogDirectory: logDir,
		Linux: &runtimeapi.LinuxPodSandboxConfig{
			CgroupParent: "/" + unknownPodCgroup(n, u.PodUID),
		},
	}
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	sb, err := cri.runtime.RunPodSandbox(cctx, &runtimeapi.RunPodSandboxRequest{Config: sbConfig})
	if err != nil {
		return u, fmt.Errorf("%s: run a sandbox: %w", node, err)
	}
	u.SandboxID = sb.PodSandboxId
	clabels := map[string]string{"io.kubernetes.container.name": "main"}
	for k, v := range labels {
		clabels[k] = v
	}
	ct, err := cri.runtime.CreateContainer(cctx, &runtimeapi.CreateContainerRequest{
		PodSandboxId: u.SandboxID,
		Config: &runtimeapi.ContainerConfig{
			Metadata: &runtimeapi.ContainerMetadata{Name: "main"},
			Image:    &runtimeapi.ImageSpec{Image: "docker.io/library/busybox:local"},
			Command:  []string{"sh", "-c", fmt.Sprintf("sleep 1; exit %d", exit)},
			Labels:   clabels,
			LogPath:  "main.log",
		},
		SandboxConfig: sbConfig,
	})
	if err != nil {
		return u, fmt.Errorf("%s: create a container: %w", node, err)
	}
	u.ContainerID = ct.ContainerId
	if _, err := cri.runtime.StartContainer(cctx, &runtimeapi.StartContainerRequest{ContainerId: u.ContainerID}); err != nil {
		return u, fmt.Errorf("%s: start the container: %w", node, err)
	}
	return u, nil
}

// Remove stops and removes the sandbox (and its container) of RunUnknownContainer.
func (c Config) RemoveUnknownContainer(ctx context.Context, u UnknownContainer) error {
	if u.SandboxID == "" {
		return nil
	}
	n, err := c.NodeNamed(u.Node)
	if err != nil {
		return err
	}
	cri, err := dialCRI(n.Socket())
	if err != nil {
		return err
	}
	defer cri.Close()
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err1 := cri.runtime.StopPodSandbox(cctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: u.SandboxID})
	_, err2 := cri.runtime.RemovePodSandbox(cctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: u.SandboxID})
	for _, d := range host.CgroupDirs(unknownPodCgroup(n, u.PodUID)) {
		_ = os.Remove(d)
		_ = os.Remove(filepath.Dir(d)) // coroner-chaos-unknown, once empty
	}
	err3 := os.RemoveAll(c.unknownLogDir(n, u.PodUID))
	return errors.Join(err1, err2, err3)
}

// unknownPodCgroup is the cgroup of an unknown pod: beside the node's kubepods, not under
// it. The kubelet's housekeeping removes pod cgroups under kubepods whose pod it does not
// know (cleanupOrphanedPodCgroups, every 2 s, killing what runs there): a CI run's fault
// suite lost its unknown container on the containerd 1.6 node that way, runc failing to
// start it ("can't get final child's PID from pipe: EOF").
func unknownPodCgroup(n Node, podUID string) string {
	return filepath.Join(n.Cgroup(), "coroner-chaos-unknown", "pod"+podUID)
}

// unknownLogDir is the log directory of an unknown pod's sandbox.
func (c Config) unknownLogDir(n Node, podUID string) string {
	return filepath.Join(c.nodeDir(n), "unknown-pods", podUID)
}

// ContainerExit returns the exit code and finish time the node's runtime reports for a
// container (ok false while it runs).
func (c Config) ContainerExit(ctx context.Context, node, id string) (code int32, finished time.Time, ok bool, err error) {
	n, err := c.NodeNamed(node)
	if err != nil {
		return 0, time.Time{}, false, err
	}
	cri, err := dialCRI(n.Socket())
	if err != nil {
		return 0, time.Time{}, false, err
	}
	defer cri.Close()
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := cri.runtime.ContainerStatus(cctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		return 0, time.Time{}, false, err
	}
	s := resp.GetStatus()
	if s.GetState() != runtimeapi.ContainerState_CONTAINER_EXITED {
		return 0, time.Time{}, false, nil
	}
	return s.GetExitCode(), time.Unix(0, s.GetFinishedAt()), true, nil
}
