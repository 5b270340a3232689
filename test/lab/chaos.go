package lab

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"

	"github.com/coroner-dev/coroner/agent/cgroup"
	"github.com/coroner-dev/coroner/agent/kmsg"
	"github.com/coroner-dev/coroner/test/host"
)

// The lab's node controls, for `coronerctl chaos` and the e2e suite (requirement L2): take
// a node off the network and back, kill and restart its kubelet, and make the kernel's OOM
// killer kill a pod, either because of its own memory limit or because its node ran out.
// They act on this machine, so they need root and a lab that is up.

// NodeNamed returns the lab node called name: a process node, or the VM node when the
// lab runs it (Config.VM, or its QEMU recorded in the lab's state: coronerctl does not
// know how the lab was started).
func (c Config) NodeNamed(name string) (Node, error) {
	nodes := c.Nodes
	if c.VM || c.vmInState() {
		nodes = append(slices.Clone(c.Nodes), VMNode())
	}
	for _, n := range nodes {
		if n.Name == name {
			return n, nil
		}
	}
	names := make([]string, len(nodes))
	for i, n := range nodes {
		names[i] = n.Name
	}
	return Node{}, fmt.Errorf("%q is not a lab node (the lab's nodes: %s)", name, strings.Join(names, ", "))
}

// IsVM reports whether the node is the VM node (vm.go): no netns, its cgroups, containerd
// and kubelet in the guest.
func (n Node) IsVM() bool { return n.Index == vmIndex }

// vmInState reports whether the lab's state records a running VM node.
func (c Config) vmInState() bool {
	st, err := loadState(c.statePath())
	if err != nil || st == nil {
		return false
	}
	_, ok := vmRunning(st)
	return ok
}

// upState returns the state of a lab that is up, or an error that says how to get one.
func (c Config) upState() (*State, error) {
	if os.Geteuid() != 0 {
		return nil, errNotRoot("this lab command")
	}
	st, err := loadState(c.statePath())
	if err != nil {
		return nil, err
	}
	if st == nil || st.Phase == phaseStarting {
		return nil, fmt.Errorf("the lab is not up (no %s): start it with `make lab`", c.shortPath(c.statePath()))
	}
	return st, nil
}

// Partition takes the node off the network: the host end of its veth pair (the VM node's
// tap device) goes down, so
// the node's kubelet, its agent and its pods reach neither the API server nor the other
// nodes, while everything on it keeps running. The node controller marks it NotReady
// (Ready=Unknown) and taints it node.kubernetes.io/unreachable after
// --node-monitor-grace-period (20 s in the lab). Heal undoes it.
func (c Config) Partition(node string) error { return c.setLink(node, false) }

// Heal puts a partitioned node back on the network.
func (c Config) Heal(node string) error { return c.setLink(node, true) }

func (c Config) setLink(node string, up bool) error {
	n, err := c.NodeNamed(node)
	if err != nil {
		return err
	}
	if _, err := c.upState(); err != nil {
		return err
	}
	link, err := netlink.LinkByName(n.HostVeth)
	if err != nil {
		return fmt.Errorf("%s: link %s: %w", node, n.HostVeth, err)
	}
	if up {
		err = netlink.LinkSetUp(link)
	} else {
		err = netlink.LinkSetDown(link)
	}
	if err != nil {
		return fmt.Errorf("%s: set link %s up=%v: %w", node, n.HostVeth, up, err)
	}
	return nil
}

// Partitioned reports whether the node's link is down.
func (c Config) Partitioned(node string) (bool, error) {
	n, err := c.NodeNamed(node)
	if err != nil {
		return false, err
	}
	link, err := netlink.LinkByName(n.HostVeth)
	if err != nil {
		return false, fmt.Errorf("%s: link %s: %w", node, n.HostVeth, err)
	}
	return link.Attrs().Flags&net.FlagUp == 0, nil
}

// KillKubelet kills the node's kubelet with SIGKILL, as a crash would: its containers keep
// running (their shims belong to containerd), nothing reports the node's status, and the
// node controller marks it NotReady after the grace period. StartKubelet undoes it. It
// returns the killed kubelet's PID.
func (c Config) KillKubelet(node string) (int, error) {
	if n, err := c.NodeNamed(node); err != nil {
		return 0, err
	} else if n.IsVM() {
		return 0, fmt.Errorf("%s is the VM node: its kubelet is a systemd unit in the guest (not supported here)", node)
	}
	st, err := c.upState()
	if err != nil {
		return 0, err
	}
	p, ok := st.proc("kubelet-" + node)
	if !ok || !p.running() {
		return 0, fmt.Errorf("the kubelet of %s is not running (start it with `coronerctl chaos start-kubelet %s`)", node, node)
	}
	if err := syscall.Kill(p.PID, syscall.SIGKILL); err != nil {
		return 0, fmt.Errorf("kill the kubelet of %s (pid %d): %w", node, p.PID, err)
	}
	if !host.WaitGone([]int{p.PID}, 5*time.Second) && p.running() {
		return 0, fmt.Errorf("the kubelet of %s (pid %d) did not die", node, p.PID)
	}
	return p.PID, nil
}

// StartKubelet starts the node's kubelet again, with the configuration Up gave it, and
// records it in the lab's state (so Down stops it). It returns the new kubelet's PID.
func (c Config) StartKubelet(node string) (int, error) {
	n, err := c.NodeNamed(node)
	if err != nil {
		return 0, err
	}
	if n.IsVM() {
		return 0, fmt.Errorf("%s is the VM node: its kubelet is a systemd unit in the guest (not supported here)", node)
	}
	st, err := c.upState()
	if err != nil {
		return 0, err
	}
	if p, ok := st.proc("kubelet-" + node); ok && p.running() {
		return 0, fmt.Errorf("the kubelet of %s runs already (pid %d)", node, p.PID)
	}
	started := time.Now()
	if err := c.startKubelet(st, n); err != nil {
		return 0, err
	}
	// Its device manager listens again (the node's test GPU plugin registers again by
	// itself: it watches the directory for the new kubelet.sock).
	if err := c.waitDeviceManager(context.Background(), st, n, started); err != nil {
		return 0, err
	}
	p, _ := st.proc("kubelet-" + node)
	return p.PID, nil
}

// OOMScope says whose memory runs out in OOM.
type OOMScope string

const (
	// OOMPodLimit lowers the memory limit of the pod's own cgroup: the kernel reports the
	// pod's cgroup as the one out of memory, as when a container exceeds its limit.
	OOMPodLimit OOMScope = "pod"
	// OOMNode lowers the memory limit of the node's kubepods cgroup, which holds every pod
	// of the node: the kernel reports kubepods as the one out of memory, as when the node
	// runs out and the OOM killer picks a pod.
	OOMNode OOMScope = "node"
)

// OOMResult says what OOM did.
type OOMResult struct {
	// Cgroup is the memory cgroup whose limit was lowered, relative to the hierarchy root.
	Cgroup string
	// Limit is the limit set (bytes); Restored is the limit put back afterwards (-1: no
	// limit).
	Limit, Restored int64
	// Kills is how many tasks the OOM killer killed in Cgroup meanwhile, as far as seen
	// when the first kill was (0 after a timeout).
	Kills int64
	// Took is the time from lowering the limit to the first kill (or the timeout).
	Took time.Duration
}

// OOM makes the kernel's OOM killer kill a task of the pod, which must run on a lab node:
// it lowers the memory limit of the pod's cgroup (scope OOMPodLimit) or of its node's
// kubepods cgroup (OOMNode) to the memory in use less its page cache (squeeze), waits
// until the kernel has killed a task in that cgroup or timeout has passed, and puts the
// limit back at once.
//
// Only a pod that allocates memory meanwhile gets killed (memory in use cannot be taken
// back by lowering a limit: the kernel refuses a limit below it), so a pod that sleeps is
// left alone and OOM says so. With OOMNode the kernel picks the victim among all the pods
// of the node (the biggest, weighed by QoS class); the result says how many it killed.
func (c Config) OOM(ctx context.Context, pod *corev1.Pod, scope OOMScope, timeout time.Duration) (OOMResult, error) {
	if pod.Spec.NodeName == "" {
		return OOMResult{}, fmt.Errorf("pod %s/%s is not on a node yet", pod.Namespace, pod.Name)
	}
	n, err := c.NodeNamed(pod.Spec.NodeName)
	if err != nil {
		return OOMResult{}, fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	if _, err := c.upState(); err != nil {
		return OOMResult{}, err
	}
	if n.IsVM() { // its cgroups are the guest's (vm.go)
		return c.vmOOM(ctx, pod, scope, timeout)
	}
	kubepods := filepath.Join(n.Cgroup(), "kubepods")
	var rel string
	switch scope {
	case OOMNode:
		rel = kubepods
	case OOMPodLimit:
		if rel, err = podCgroup(kubepods, string(pod.UID)); err != nil {
			return OOMResult{}, fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
	default:
		return OOMResult{}, fmt.Errorf("unknown OOM scope %q (want %q or %q)", scope, OOMPodLimit, OOMNode)
	}
	return squeeze(ctx, rel, timeout)
}

// podCgroup finds the pod's cgroup under kubepods: kubepods/pod<uid> (Guaranteed),
// kubepods/burstable/pod<uid> or kubepods/besteffort/pod<uid>.
func podCgroup(kubepods, uid string) (string, error) {
	for _, qos := range []string{"", "burstable", "besteffort"} {
		rel := filepath.Join(kubepods, qos, "pod"+uid)
		if _, _, err := cgroup.Detect(cgroupFSRoot, rel); err == nil {
			return rel, nil
		}
	}
	return "", fmt.Errorf("no memory cgroup for pod uid %s under %s (is the pod running?)", uid, kubepods)
}

// setMemoryLimit writes a memory limit in bytes (no limit when not positive) to the cgroup
// directory dir of version v; agent/cgroup reads, the lab alone writes.
func setMemoryLimit(v cgroup.Version, dir string, limit int64) error {
	file, value := "memory.limit_in_bytes", strconv.FormatInt(limit, 10)
	if v == cgroup.V2 {
		file = "memory.max"
	}
	if limit <= 0 {
		value = map[cgroup.Version]string{cgroup.V1: "-1", cgroup.V2: "max"}[v]
	}
	return os.WriteFile(filepath.Join(dir, file), []byte(value), 0o644)
}

// subtreeKills reads the OOM kill counters of the cgroup at dir and of every cgroup below
// it: the kernel counts a kill in the victim's own cgroup (a container's), which v1 does
// not add up the tree.
func subtreeKills(dir string) map[string]uint64 {
	counts := map[string]uint64{}
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		if m, err := cgroup.Read(path, ""); err == nil && m.HasOOMKill {
			counts[path] = m.OOMKill
		}
		return nil
	})
	return counts
}

// newKills is how many kills after counts there are in before's cgroups (and new ones).
func newKills(before, after map[string]uint64) int64 {
	var n int64
	for path, c := range after {
		if c > before[path] {
			n += int64(c - before[path])
		}
	}
	return n
}

// squeeze sets the cgroup's limit to its usage less its page cache (a little more when the
// kernel refuses: usage moves), waits for an OOM kill in it, and restores the limit.
//
// The page cache goes first, reclaimed by the kernel in the write: at the usage itself,
// the growing pod's allocations reclaimed the cache of every pod of the node (memhog at
// 40 MiB/s took 1-1.8 s to get killed on a process node), long enough for the kubelet,
// which reads the node's kubepods limit as the pods' allocatable memory and polls every
// 10 s, to see less than 100 MiB available and evict the pod first, now and then. With
// nothing left to reclaim, the next allocation is an OOM kill.
//
// The limit goes back the moment the kernel reports the kill, from the goroutine that
// reads /dev/kmsg, not at the next poll: while it stays low every allocation in the cgroup
// is another OOM, and with a node's kubepods that means the node's other pods, the agent
// that reports on the kill among them (seen: the agent killed 7 ms after the victim, while
// the victim's memory was still being freed). The kill counters are the fallback for a
// report the kernel rate-limited, or a kmsg this process cannot read.
func squeeze(ctx context.Context, rel string, timeout time.Duration) (res OOMResult, err error) {
	res.Cgroup = rel
	orig, err := cgroup.Read(cgroupFSRoot, rel)
	if err != nil {
		return res, err
	}
	before := subtreeKills(orig.Dir)
	var restoreOnce sync.Once
	var restoreErr error
	restore := func() {
		restoreOnce.Do(func() { restoreErr = setMemoryLimit(orig.Version, orig.Dir, orig.Limit) })
	}
	start := time.Now()
	reported := make(chan time.Duration, 1)
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	if f, err := kmsg.Open(kmsg.DevKmsg); err == nil {
		kills := make(chan kmsg.OOMKill, 16)
		go func() { _ = kmsg.NewReader(f, time.Time{}).Run(watchCtx, kills) }() // closes f when done
		go func() {
			for {
				select {
				case <-watchCtx.Done():
					return
				case k := <-kills:
					if k.OOMMemcg == "/"+rel { // kmsg.Open reads from the end: no older kill
						restore()
						select {
						case reported <- time.Since(start):
						default:
						}
						return
					}
				}
			}
		}()
	}
	set := false
	for margin := int64(0); margin <= 64<<20 && !set; margin = max(2*margin, 1<<20) {
		now, err := cgroup.Read(cgroupFSRoot, rel)
		if err != nil {
			return res, err
		}
		cache, _ := cgroup.PageCache(orig.Version, orig.Dir) // 0 if unreadable: the limit is the usage
		res.Limit = max(now.Usage-cache, 1<<20) + margin
		if err := setMemoryLimit(orig.Version, orig.Dir, res.Limit); err == nil {
			set = true
		} else if !errors.Is(err, syscall.EBUSY) {
			return res, fmt.Errorf("lower the memory limit of %s: %w", rel, err)
		}
	}
	defer func() {
		restore()
		if restoreErr != nil {
			err = errors.Join(err, fmt.Errorf("restore the memory limit of %s to %d: %w (write it by hand)", rel, orig.Limit, restoreErr))
		}
		res.Restored = orig.Limit
		if orig.Limit == 0 {
			res.Restored = -1
		}
	}()
	if !set {
		return res, fmt.Errorf("the kernel refused every limit up to 64 MiB above the usage of %s", rel)
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		if n := newKills(before, subtreeKills(orig.Dir)); n > 0 {
			restore()
			res.Kills, res.Took = n, time.Since(start)
			return res, nil
		}
		select {
		case took := <-reported:
			res.Kills, res.Took = 1, took
			// The counters catch up a moment later: count every kill of this squeeze.
			time.Sleep(20 * time.Millisecond)
			res.Kills = max(res.Kills, newKills(before, subtreeKills(orig.Dir)))
			return res, nil
		case <-ctx.Done():
			res.Took = time.Since(start)
			return res, ctx.Err()
		case <-deadline.C:
			res.Took = time.Since(start)
			return res, nil
		case <-tick.C:
		}
	}
}

// proc returns the recorded process called name.
func (s *State) proc(name string) (Proc, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := slices.IndexFunc(s.Processes, func(p Proc) bool { return p.Name == name })
	if i < 0 {
		return Proc{}, false
	}
	return s.Processes[i], true
}

// SqueezeCgroup is OOM's squeeze for a memory cgroup of this machine named by its path
// relative to the hierarchy root, for the nodes of another lab whose cgroups are this
// machine's (a kind node's kubepods, test/kind): it lowers the limit to the usage, waits
// for a kill in it or timeout, and restores the limit at once.
func SqueezeCgroup(ctx context.Context, rel string, timeout time.Duration) (OOMResult, error) {
	if os.Geteuid() != 0 {
		return OOMResult{}, errNotRoot("an OOM squeeze")
	}
	return squeeze(ctx, strings.TrimPrefix(rel, "/"), timeout)
}
