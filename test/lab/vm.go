package lab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coroner-dev/coroner/test/containerd"
	"github.com/coroner-dev/coroner/test/host"
	"github.com/coroner-dev/coroner/test/images"
	"github.com/coroner-dev/coroner/test/pki"
	"github.com/coroner-dev/coroner/test/vm"
)

// The VM node (issue 10, opt-in with Config.VM, LAB_VM=1): a production-like node beside
// the process nodes, systemd as PID 1 on pure cgroup v2 in a QEMU VM (test/vm), with
// containerd 2.x (SystemdCgroup) and the kubelet v1.36.3 (cgroupDriver systemd, the
// default failCgroupV1) from the host's _output/bin over 9p. Same Node contract as the
// process nodes (name, index, IP, pod CIDR, socket path in the node), another way to run
// it:
//
//	network   a tap device crlab-4 on the bridge instead of a netns + veth pair; the guest's
//	          eth0 has 10.77.0.14/24, routes like a process node's
//	files     _output/lab/nodes/lab-node-4 is the node's 9p share (node.env, guest.sh, configs,
//	          certificates, ssh key; the guest writes status and facts there), the overlay
//	          disk.qcow2 and qemu.pid are beside it; the guest writes its containerd and kubelet
//	          logs into _output/lab/logs, its console is logs/console-lab-node-4.log
//	processes one, qemu-lab-node-4 in the state file; Down stops it and the tap goes with the
//	          lab's links
//
// The node is tainted lab.coroner.dev/vm=true:NoSchedule: only pods that tolerate it run
// there (coroner's DaemonSet tolerates everything), so the demo and the e2e suite keep to
// the fast process nodes unless they ask for the VM.
const (
	vmIndex   = 4
	vmProc    = "qemu-lab-node-4"
	vmTaint   = "lab.coroner.dev/vm=true:NoSchedule"
	vmGuestOS = "/opt/coroner" // where the guest mounts the shares (test/vm/guest.sh)
	// vmReadyTimeout is how long the VM may take from QEMU's start to the node Ready: the
	// boot alone is 25-30 s under TCG; the kubelet and containerd are 5-10x slower than native.
	vmReadyTimeout = 10 * time.Minute
)

// VMNode is the VM node: lab-node-4, 10.77.0.14, pods 10.77.4.0/24, containerd 2.x, its
// tap device named like the process nodes' veths (so Down finds it by the name too).
func VMNode() Node {
	_, cidr, _ := net.ParseCIDR(fmt.Sprintf("10.77.%d.0/24", vmIndex))
	return Node{
		Name:     fmt.Sprintf("lab-node-%d", vmIndex),
		Index:    vmIndex,
		HostVeth: fmt.Sprintf("%s%d", VethPrefix, vmIndex),
		IP:       net.IPv4(10, 77, 0, byte(10+vmIndex)),
		PodCIDR:  cidr,
		Runtime:  RuntimeContainerd2,
	}
}

// VMFromEnv reports whether LAB_VM asks for the VM node (1, true, yes).
func VMFromEnv() bool {
	switch strings.ToLower(os.Getenv("LAB_VM")) {
	case "1", "true", "yes", "on":
		return true
	}
	return false
}

func (c Config) vmImageDir() string { return filepath.Join(c.Root, "_output", "vm") }

func (c Config) vmMachine() vm.Machine {
	n, dir := VMNode(), c.nodeDir(VMNode())
	return vm.Machine{
		Name:    n.Name,
		Image:   vm.ImageIn(c.vmImageDir()),
		Overlay: filepath.Join(dir, "disk.qcow2"),
		Console: filepath.Join(c.logDir(), "console-"+n.Name+".log"),
		PIDFile: filepath.Join(dir, "qemu.pid"),
		QMP:     filepath.Join(dir, "qmp.sock"),
		Tap:     n.HostVeth,
		MAC:     fmt.Sprintf("52:54:00:4d:00:%02x", 10+vmIndex),
		Shares: []vm.Share{
			{Tag: "corbin", Path: c.BinDir, ReadOnly: true},
			{Tag: "corimg", Path: filepath.Join(c.Root, "_output", "images"), ReadOnly: true},
			{Tag: "cornode", Path: dir},
			{Tag: "corlog", Path: c.logDir()},
		},
	}
}

// buildVM makes the VM image when it is missing or stale (test/vm/build-image.sh).
func (c Config) buildVM(ctx context.Context, say func(string, ...any)) error {
	if _, err := exec.LookPath(vm.QEMU); err != nil && c.SkipBuild {
		return fmt.Errorf("%s missing: make vm-image (installs qemu-system-x86)", vm.QEMU)
	}
	if c.SkipBuild {
		if !vm.ImageIn(c.vmImageDir()).Exists() {
			return fmt.Errorf("no VM image in %s: make vm-image", c.shortPath(c.vmImageDir()))
		}
		return nil
	}
	start := time.Now()
	lw := &lineWriter{say: say}
	_, err := vm.Build(ctx, c.Root, lw)
	lw.flush()
	if err == nil {
		say("VM image ready in %s (accelerator: %s)", seconds(time.Since(start)), vm.Accel())
	}
	return err
}

// setupVMNetwork creates the VM's tap device on the bridge and the routes to its pod
// CIDR: on the host and in every process node.
func (c Config) setupVMNetwork(st *State) error {
	n := VMNode()
	br, err := netlink.LinkByName(BridgeName)
	if err != nil {
		return err
	}
	tap := &netlink.Tuntap{
		LinkAttrs: netlink.LinkAttrs{Name: n.HostVeth, MasterIndex: br.Attrs().Index},
		Mode:      netlink.TUNTAP_MODE_TAP,
		Flags:     netlink.TUNTAP_NO_PI | netlink.TUNTAP_VNET_HDR,
	}
	if err := netlink.LinkAdd(tap); err != nil {
		return fmt.Errorf("create tap %s: %w", n.HostVeth, err)
	}
	if err := st.addLink(n.HostVeth); err != nil {
		return err
	}
	link, err := netlink.LinkByName(n.HostVeth)
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return err
	}
	if err := netlink.RouteAdd(&netlink.Route{Dst: n.PodCIDR, Gw: n.IP, LinkIndex: br.Attrs().Index}); err != nil {
		return fmt.Errorf("host route to %s: %w", n.PodCIDR, err)
	}
	for _, o := range c.Nodes {
		if err := routeInNode(o, n); err != nil {
			return fmt.Errorf("%s: route to %s: %w", o.Name, n.PodCIDR, err)
		}
	}
	return nil
}

// routeInNode adds a route to to's pod CIDR in the process node in.
func routeInNode(in, to Node) error {
	return inNetns(in.NetnsPath(), func() error {
		eth0, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{Dst: to.PodCIDR, Gw: to.IP, LinkIndex: eth0.Attrs().Index})
	})
}

// startVM writes the VM node's share (configuration, certificates, guest.sh), makes a
// new overlay disk and starts QEMU. It does not wait: waitVMReady does.
func (c Config) startVM(ctx context.Context, st *State, p *clusterPKI, imgs []images.Image, say func(string, ...any)) error {
	n, dir := VMNode(), c.nodeDir(VMNode())
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	for _, d := range []string{dir, filepath.Join(dir, "pki")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := c.writeVMFiles(n, dir, p, imgs); err != nil {
		return err
	}
	m := c.vmMachine()
	if err := m.CreateOverlay(ctx); err != nil {
		return err
	}
	proc, err := startDaemon(vmProc, vm.QEMU, m.Args(), c.logPath(vmProc), "")
	if err != nil {
		return err
	}
	proc.Node = n.Name
	if err := st.addProc(proc); err != nil {
		return err
	}
	say("%s: QEMU (%s, 2 vCPUs, 2 GiB) pid %d, tap %s, console %s", n.Name, vm.Accel(), proc.PID, n.HostVeth, c.shortPath(m.Console))
	return nil
}

// writeVMFiles writes what the guest reads from its share: node.env and guest.sh, the
// containerd, kubelet and CNI configurations, the node's certificates and kubeconfig, the
// host's resolv.conf and an ssh key's public half.
func (c Config) writeVMFiles(n Node, dir string, p *clusterPKI, imgs []images.Image) error {
	// Certificates as for the process nodes (control.go's writePKI), copied into the share.
	kubeconfig := filepath.Join(p.dir, n.Name+".kubeconfig")
	if err := p.kubeconfig(kubeconfig, "system:node:"+n.Name, []string{"system:nodes"}); err != nil {
		return err
	}
	if _, err := p.issue(n.Name+"-serving", pki.CertRequest{CommonName: n.Name, IPs: []net.IP{n.IP}, DNSNames: []string{n.Name}, Server: true}); err != nil {
		return err
	}
	copies := map[string]string{
		kubeconfig: "pki/kubelet.kubeconfig",
		filepath.Join(p.dir, n.Name+"-serving.crt"): "pki/serving.crt",
		filepath.Join(p.dir, n.Name+"-serving.key"): "pki/serving.key",
		p.caFile():         "pki/ca.crt",
		"/etc/resolv.conf": "resolv.conf",
	}
	for from, to := range copies {
		b, err := os.ReadFile(from)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, to), b, 0o600); err != nil {
			return err
		}
	}

	rt, err := containerd.Built(c.BinDir)
	if err != nil {
		return err
	}
	ctrd, err := vmContainerdConfig(n, c.guestRuntime(rt))
	if err != nil {
		return err
	}
	var routes, tarballs []string
	for _, o := range c.Nodes {
		routes = append(routes, o.PodCIDR.String()+"="+o.IP.String())
	}
	for _, img := range imgs {
		tarballs = append(tarballs, filepath.Base(img.Tarball))
	}
	env := fmt.Sprintf("NODE_NAME=%s\nNODE_IP=%s\nGATEWAY=%s\nROUTES=%q\nSOCKET=%s\nIMAGES=%q\nNODE_LABELS=%s\nTEST_GPU_ARGS=%q\n",
		n.Name, n.IP, bridgeIP, strings.Join(routes, " "), n.Socket(), strings.Join(tarballs, " "),
		"lab.coroner.dev/node="+n.Name+",lab.coroner.dev/vm=true",
		strings.Join(TestGPUArgs(n.TestGPUControl(), n.TestGPUPCIBase()), " "))
	files := map[string]string{
		"node.env":                env,
		"guest.sh":                vm.GuestScript,
		"containerd.toml":         ctrd,
		"kubelet.yaml":            vmKubeletConfig(n),
		"10-coroner-lab.conflist": cniConfig(n, "/var/lib/cni/coroner-ipam"),
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	// An ssh key for the e2e suite and for a look inside (`ssh -i KEY root@10.77.0.14`).
	key := filepath.Join(dir, "ssh-key")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "coroner-lab", "-f", key).CombinedOutput(); err != nil {
		return fmt.Errorf("ssh-keygen: %w\n%s", err, out)
	}
	return os.Rename(key+".pub", filepath.Join(dir, "authorized_keys"))
}

// guestRuntime is the host-built containerd 2.x at the paths the guest sees it.
func (c Config) guestRuntime(rt containerd.Runtime) containerd.Runtime {
	g := func(p string) string {
		rel, err := filepath.Rel(c.BinDir, p)
		if err != nil {
			return p
		}
		return filepath.Join(vmGuestOS, "bin", rel)
	}
	rt.Containerd, rt.Ctr, rt.Shim, rt.Runc = g(rt.Containerd), g(rt.Ctr), g(rt.Shim), g(rt.Runc)
	return rt
}

// vmContainerdConfig is test/containerd's config version 3 with the guest's directories,
// and the two settings a systemd node on cgroup v2 with every capability differs in: runc
// with the systemd cgroup driver, and no restrict_oom_score_adj (the guest's root has
// CAP_SYS_RESOURCE).
func vmContainerdConfig(n Node, rt containerd.Runtime) (string, error) {
	if rt.Major < 2 {
		return "", fmt.Errorf("the VM node runs containerd 2.x, not %s", rt.Version)
	}
	toml := containerd.ConfigTOML(containerd.ConfigDirs{
		Runtime:  rt,
		Root:     "/var/lib/containerd",
		State:    "/run/containerd",
		Socket:   n.Socket(),
		Opt:      "/opt/containerd",
		RuncRoot: "/run/containerd/runc",
		CNIConf:  "/etc/cni/net.d",
	})
	for old, repl := range map[string]string{
		"SystemdCgroup = false":         "SystemdCgroup = true",
		"restrict_oom_score_adj = true": "restrict_oom_score_adj = false",
	} {
		if !strings.Contains(toml, old) {
			return "", fmt.Errorf("test/containerd's config has no %q any more: update vmContainerdConfig", old)
		}
		toml = strings.Replace(toml, old, repl, 1)
	}
	return toml, nil
}

// vmKubeletConfig is the VM node's KubeletConfiguration: as a production node, the systemd
// cgroup driver on cgroup v2 with the default failCgroupV1 (true) and failSwapOn, the
// default directories and cgroup root; as the lab's nodes, webhook authentication and
// authorization with the cluster CA, fast status updates, volume usage every 5 s and no
// image garbage collection.
func vmKubeletConfig(n Node) string {
	pkiDir := vmGuestOS + "/node/pki"
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://%[1]s
cgroupDriver: systemd
address: %[2]s
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: %[3]s/serving.crt
tlsPrivateKeyFile: %[3]s/serving.key
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: %[3]s/ca.crt
authorization:
  mode: Webhook
registerWithTaints:
- key: lab.coroner.dev/vm
  value: "true"
  effect: NoSchedule
`+kubeletCommon, n.Socket(), n.IP, pkiDir)
}

// vmRunning is the VM's QEMU process of the state, if it runs.
func vmRunning(st *State) (Proc, bool) {
	for _, p := range st.procs() {
		if p.Name == vmProc {
			return p, p.running()
		}
	}
	return Proc{}, false
}

// waitVMReady waits until the VM node is Ready, then says how long the boot took, QEMU's
// memory and what the node is made of (cgroup file system, the kubelet's cgroup driver).
func (c Config) waitVMReady(ctx context.Context, st *State, say func(string, ...any)) error {
	n := VMNode()
	proc, ok := vmRunning(st)
	if !ok {
		return fmt.Errorf("%s is not running:\n%s", vmProc, vm.Tail(c.vmMachine().Console, 3000))
	}
	started := time.Now()
	if t, err := processStarted(proc.PID); err == nil {
		started = t
	}
	cs, err := c.Clientset()
	if err != nil {
		return err
	}
	var last string
	err = Poll(ctx, vmReadyTimeout, n.Name+" Ready", func() (bool, error) {
		if !proc.running() {
			return false, fmt.Errorf("%s exited; console:\n%s", vmProc, vm.Tail(c.vmMachine().Console, 3000))
		}
		node, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			last = "not registered"
			return false, nil
		}
		last = readyMessage(node)
		if !nodeReady(node) {
			return false, nil
		}
		// The images are imported while the kubelet starts (guest.sh): no pod may come
		// before they are there (imagePullPolicy Never).
		status, _ := os.ReadFile(filepath.Join(c.nodeDir(n), "status"))
		if strings.Contains(string(status), "images: an import failed") {
			return false, fmt.Errorf("%s: an image import failed (%s)", n.Name, c.shortPath(c.logPath("containerd-"+n.Name)))
		}
		last = "Ready, images not imported yet"
		return strings.Contains(string(status), "images imported"), nil
	})
	if err != nil {
		status, _ := os.ReadFile(filepath.Join(c.nodeDir(n), "status"))
		return fmt.Errorf("%w: %s (%s); guest status:\n%s\nconsole:\n%s", err, n.Name, last, status,
			vm.Tail(c.vmMachine().Console, 2000))
	}
	took := time.Since(started)
	rss, _ := vm.RSS(proc.PID)
	say("%s Ready with its images %s after QEMU started; QEMU RSS %.2f GiB", n.Name, seconds(took), float64(rss)/(1<<30))
	if b, err := os.ReadFile(filepath.Join(c.nodeDir(n), "status")); err == nil {
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			say("  guest: %s", line)
		}
	}
	if b, err := os.ReadFile(filepath.Join(c.nodeDir(n), "facts")); err == nil {
		say("  %s", strings.Join(strings.Fields(string(b)), " "))
	}
	if driver, err := c.vmCgroupDriver(ctx); err == nil {
		say("  kubelet /configz: cgroupDriver %s", driver)
	} else {
		say("  kubelet /configz: %v", err)
	}
	return st.update(func(s *State) {
		s.Timings = append(s.Timings, Timing{Step: n.Name + " Ready after QEMU start", Seconds: took.Seconds()})
	})
}

// vmCgroupDriver is the cgroupDriver of the VM node's kubelet, from its /configz through
// the API server's node proxy.
func (c Config) vmCgroupDriver(ctx context.Context) (string, error) {
	cs, err := c.Clientset()
	if err != nil {
		return "", err
	}
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	body, err := cs.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes/" + VMNode().Name + "/proxy/configz").DoRaw(rctx)
	if err != nil {
		return "", err
	}
	const key = `"cgroupDriver":"`
	i := strings.Index(string(body), key)
	if i < 0 {
		return "", errors.New("no cgroupDriver in /configz")
	}
	rest := string(body[i+len(key):])
	return rest[:strings.IndexByte(rest, '"')], nil
}

// processStarted is when a process started (its start time in ticks since boot).
func processStarted(pid int) (time.Time, error) {
	f, err := procStat(pid)
	if err != nil {
		return time.Time{}, err
	}
	var ticks int64
	if _, err := fmt.Sscan(f[19], &ticks); err != nil {
		return time.Time{}, err
	}
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return time.Time{}, err
	}
	var up float64
	if _, err := fmt.Sscan(string(b), &up); err != nil {
		return time.Time{}, err
	}
	const hz = 100 // USER_HZ on Linux
	return time.Now().Add(-time.Duration((up - float64(ticks)/hz) * float64(time.Second))), nil
}

// stopVM stops the VM node's QEMU: the one of the state, and any QEMU that uses the
// lab's directory (a lost state file). The guest is not shut down cleanly: its disk is a
// throw-away overlay. The tap goes with the lab's links, the overlay with its directory.
func (c Config) stopVM(st *State, say func(string, ...any), problem func(string, ...any)) {
	if p, ok := vmRunning(st); ok {
		p.stop(5 * time.Second)
		say("stopped %s (pid %d)", p.Name, p.PID)
		if p.running() {
			problem("%s (pid %d) still runs", p.Name, p.PID)
		}
	}
	if pids := host.ProcessesUsing([]string{vm.QEMU}, c.Dir); len(pids) > 0 {
		for _, pid := range pids {
			say("killing %s (pid %d)", commandName(pid), pid)
		}
		host.KillAll(pids)
		if !host.WaitGone(pids, 5*time.Second) {
			problem("QEMU still runs: pids %v", pids)
		}
	}
}

// VMExec runs a shell command as root in the VM node of a lab that is up (over ssh, with
// the key Up made for it), for what has no API: the e2e suite's node OOM (lowering
// kubepods.slice's memory.max), a look at the guest's cgroups. Its combined output.
func (c Config) VMExec(ctx context.Context, command string) ([]byte, error) {
	st, err := c.upState()
	if err != nil {
		return nil, err
	}
	if _, ok := vmRunning(st); !ok {
		return nil, fmt.Errorf("the lab has no VM node running (LAB_VM=1 make lab)")
	}
	n := VMNode()
	return vm.SSH(ctx, filepath.Join(c.nodeDir(n), "ssh-key"), n.IP.String(), time.Minute, command)
}

// vmSqueeze is OOM's squeeze (chaos.go) for the VM node, run in the guest by bash over
// ssh, since the cgroups are the guest's: it finds the cgroup (%[1]s: kubepods.slice, or
// the candidate paths of the pod's slice), lowers its memory.max to memory.current plus
// 8 MiB (headroom for the small allocations of the node's other pods, the agent among
// them: only the pod that keeps growing reaches the limit; at memory.current itself the
// agent was killed once, in the half second a slow TCG guest took to free the first
// victim's memory), waits
// in a tight loop of shell builtins until the oom_kill count of its memory.events
// (hierarchical on cgroup v2: a kill in a container's scope counts in its pod's slice and
// in kubepods.slice) goes up or %[2]d microseconds pass, and
// puts the limit back at once, as the process nodes' squeeze does from its kmsg reader;
// a trap restores it if the shell is interrupted. Its last line says what it did.
const vmSqueeze = `set -u
cg=
for d in /sys/fs/cgroup/%[1]s; do [ -d "$d" ] && { cg=$d; break; }; done
[ -n "$cg" ] || { echo "coroner-oom: no cgroup /sys/fs/cgroup/%[1]s (is the pod running?)"; exit 3; }
read -r orig <"$cg/memory.max"
restore() { echo "$orig" >"$cg/memory.max"; }
kills() { K=0; while read -r k v; do [ "$k" = oom_kill ] && K=$v; done <"$cg/memory.events"; }
trap restore EXIT
trap 'exit 1' HUP INT TERM PIPE
kills; before=$K
read -r usage <"$cg/memory.current"
usage=$((usage + 8388608))
start=${EPOCHREALTIME/./}; now=$start
echo "$usage" >"$cg/memory.max" || { echo "coroner-oom: the kernel refused memory.max $usage"; exit 4; }
while :; do
	kills
	[ "$K" -gt "$before" ] && { restore; now=${EPOCHREALTIME/./}; break; }
	now=${EPOCHREALTIME/./}
	[ $((now - start)) -ge %[2]d ] && break
done
restore
trap - EXIT
echo "coroner-oom cgroup=${cg#/sys/fs/cgroup/} limit=$usage orig=$orig kills=$((K - before)) took_us=$((now - start))"
`

// vmNodeSqueeze is the node OOM (OOMNode) of the VM node, run in the guest by bash over
// ssh. vmSqueeze's way (a limit a little above the usage, then wait for the pod's next
// allocation) failed there: a slow TCG guest reclaimed the page cache of the node's pods
// (the agent's binary among them), they faulted it back in, and for minutes no task was
// killed, while the kubelet, which reads kubepods.slice's memory.max as the pods'
// allocatable memory, saw less than 100 MiB available and evicted the pod first (then kept
// the node's MemoryPressure condition for 5 minutes, rejecting new pods).
//
// So this squeeze makes the kernel kill at once: it writes a memory.max to kubepods.slice
// below what reclaim can reach, its usage minus its page cache minus 8 MiB. The kernel,
// failing to reclaim that much, runs the OOM killer from the write itself; the pod (the
// biggest, and BestEffort) is its victim. The write keeps reclaiming and killing until the
// usage fits, so a background writer does it, and as soon as memory.events counts a kill
// the writer is killed (a signal ends the kernel's loop) and the limit put back.
//
// That alone did not keep the kill to one: reclaim takes the page cache that the node's
// tasks have mapped too (their code: 37 of the 43 MiB of kubepods.slice's cache on this
// VM), they fault it back in as they run, and a slow guest took 45-135 ms to free the
// victim, longer than this script took to see the kill. With a victim of 32 MiB and the
// limit half of it below, the others' code no longer fit once the victim was gone, and the
// writer's loop killed the agent (at -999, so last) in 8 of session 15's 50 node OOMs. So
// the squeeze waits until the pod's cgroup (%[1]s, the candidate paths of its slice) holds
// more anonymous memory than kubepods.slice has mapped, plus 32 MiB (the pod grows): once
// it is gone, everything else fits under the limit with the code it had mapped back in,
// with 24 MiB to spare. That was not enough either (the agent killed twice in 12 node
// OOMs: code that earlier squeezes had pushed out, and that was not back yet, was not in
// the count), so the writer also makes itself the next victim: it moves into a cgroup of
// its own under kubepods.slice (coroner-squeeze, removed afterwards; the kubelet cleans up
// only cgroups named after pods) with oom_score_adj 1000; should its loop kill again, the
// kernel picks the writer (a BestEffort pod's process scores as high and holds more; the
// agent is at -999, pause at -998), and that ends the loop.
//
// %[2]d microseconds bound the wait for the pod's growth and for the kill; a trap restores
// the limit if the shell is interrupted. Its last line says what it did, as vmSqueeze's
// does.
const vmNodeSqueeze = `set -u
kp=/sys/fs/cgroup/kubepods.slice
pod=
for d in /sys/fs/cgroup/%[1]s; do [ -d "$d" ] && { pod=$d; break; }; done
[ -n "$pod" ] || { echo "coroner-oom: no cgroup /sys/fs/cgroup/%[1]s (is the pod running?)"; exit 3; }
read -r orig <"$kp/memory.max"
restore() { echo "$orig" >"$kp/memory.max"; }
kills() { K=0; while read -r k v; do [ "$k" = oom_kill ] && K=$v; done <"$kp/memory.events"; }
stat() { V=0; while read -r k v; do [ "$k" = "$2" ] && V=$v; done <"$1/memory.stat"; }
start=${EPOCHREALTIME/./}; now=$start
while stat "$kp" file_mapped; need=$((V + 33554432)); stat "$pod" anon; [ "$V" -lt "$need" ]; do
	now=${EPOCHREALTIME/./}
	[ $((now - start)) -ge %[2]d ] && { echo "coroner-oom: the pod's anonymous memory stayed at $V bytes, below $need (kubepods.slice's mapped pages and 32 MiB; is it allocating?)"; exit 5; }
	sleep 0.1
done
read -r usage <"$kp/memory.current"
stat "$kp" file
limit=$((usage - V - 8388608))
sq=$kp/coroner-squeeze
trap 'kill -KILL $w 2>/dev/null; restore; rmdir "$sq" 2>/dev/null' EXIT
trap 'exit 1' HUP INT TERM PIPE
kills; before=$K
start=${EPOCHREALTIME/./}; now=$start
mkdir -p "$sq"
( echo "$BASHPID" >"$sq/cgroup.procs" && echo 1000 >/proc/self/oom_score_adj && echo "$limit" >"$kp/memory.max" ) 2>/dev/null & w=$!
while :; do
	kills
	[ "$K" -gt "$before" ] && { kill -KILL $w 2>/dev/null; restore; now=${EPOCHREALTIME/./}; break; }
	now=${EPOCHREALTIME/./}
	[ $((now - start)) -ge %[2]d ] && break
done
kill -KILL $w 2>/dev/null; wait $w 2>/dev/null
restore
rmdir "$sq" 2>/dev/null
trap - EXIT
sleep 0.05; kills
echo "coroner-oom cgroup=kubepods.slice limit=$limit orig=$orig kills=$((K - before)) took_us=$((now - start))"
`

// vmOOM is OOM for a pod on the VM node: the guest's kubepods.slice (OOMNode, squeezed by
// vmNodeSqueeze) or the pod's slice (OOMPodLimit, the systemd driver's
// kubepods[-<qos>].slice/kubepods[-<qos>]-pod<uid_with_underscores>.slice, squeezed by
// vmSqueeze), in the guest.
func (c Config) vmOOM(ctx context.Context, pod *corev1.Pod, scope OOMScope, timeout time.Duration) (OOMResult, error) {
	uid := strings.ReplaceAll(string(pod.UID), "-", "_")
	podGlob := fmt.Sprintf("kubepods.slice/kubepods-pod%[1]s.slice kubepods.slice/kubepods-*.slice/kubepods-*-pod%[1]s.slice", uid)
	podGlob = strings.ReplaceAll(podGlob, " ", " /sys/fs/cgroup/")
	var script string
	res := OOMResult{}
	switch scope {
	case OOMNode:
		res.Cgroup = "kubepods.slice"
		script = fmt.Sprintf(vmNodeSqueeze, podGlob, timeout.Microseconds())
	case OOMPodLimit:
		res.Cgroup = strings.Fields(podGlob)[0]
		script = fmt.Sprintf(vmSqueeze, podGlob, timeout.Microseconds())
	default:
		return OOMResult{}, fmt.Errorf("unknown OOM scope %q (want %q or %q)", scope, OOMPodLimit, OOMNode)
	}
	out, err := c.vmScript(ctx, timeout+time.Minute, script)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	last := lines[len(lines)-1]
	if err != nil || !strings.HasPrefix(last, "coroner-oom cgroup=") {
		return res, fmt.Errorf("%s: the squeeze in the guest: %v\n%s", VMNode().Name, err, out)
	}
	var orig string
	var tookUS int64
	if _, err := fmt.Sscanf(last, "coroner-oom cgroup=%s limit=%d orig=%s kills=%d took_us=%d",
		&res.Cgroup, &res.Limit, &orig, &res.Kills, &tookUS); err != nil {
		return res, fmt.Errorf("%s: the squeeze's report %q: %w", VMNode().Name, last, err)
	}
	res.Took = time.Duration(tookUS) * time.Microsecond
	res.Restored = -1
	if orig != "max" {
		if _, err := fmt.Sscan(orig, &res.Restored); err != nil {
			return res, fmt.Errorf("%s: the squeeze's report %q: %w", VMNode().Name, last, err)
		}
	}
	return res, nil
}

// vmScript runs a bash script as root in the VM node (its text on ssh's stdin); its
// combined output.
func (c Config) vmScript(ctx context.Context, timeout time.Duration, script string) ([]byte, error) {
	if _, err := c.upState(); err != nil {
		return nil, err
	}
	n := VMNode()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return vm.SSHRetry(ctx, func() ([]byte, error) {
		cmd := exec.CommandContext(ctx, "ssh", append(vm.SSHOptions(filepath.Join(c.nodeDir(n), "ssh-key")), "root@"+n.IP.String(), "bash", "-s")...)
		cmd.Stdin = strings.NewReader(script)
		return cmd.CombinedOutput()
	})
}

// VMSocket makes a unix socket in the guest (the VM node's containerd.sock: its CRI, for
// the e2e suite's timings) reachable on this machine: ssh forwards a local socket to it.
// It returns the local socket's path and a function that stops the forwarding.
func (c Config) VMSocket(ctx context.Context, remote string) (string, func(), error) {
	if _, err := c.upState(); err != nil {
		return "", nil, err
	}
	var local string
	var stop func()
	_, err := vm.SSHRetry(ctx, func() ([]byte, error) {
		var out []byte
		var err error
		local, stop, out, err = c.forwardVMSocket(ctx, remote)
		return out, err
	})
	return local, stop, err
}

// forwardVMSocket is one try of VMSocket; on failure, ssh's own error output with the
// error, for SSHRetry to tell a connection that did not come up.
func (c Config) forwardVMSocket(ctx context.Context, remote string) (string, func(), []byte, error) {
	n := VMNode()
	dir, err := os.MkdirTemp("", "coroner-vm-sock-")
	if err != nil {
		return "", nil, nil, err
	}
	local := filepath.Join(dir, "forward.sock")
	args := append(vm.SSHOptions(filepath.Join(c.nodeDir(n), "ssh-key")),
		"-N", "-o", "ExitOnForwardFailure=yes", "-o", "StreamLocalBindUnlink=yes", "-L", local+":"+remote, "root@"+n.IP.String())
	cmd := exec.Command("ssh", args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return "", nil, nil, err
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	stop := func() {
		_ = cmd.Process.Kill()
		<-exited
		_ = os.RemoveAll(dir)
	}
	var sshErr error
	err = Poll(ctx, time.Minute, "ssh's forwarding of "+remote, func() (bool, error) {
		select {
		case <-exited:
			sshErr = waitErr
			return false, fmt.Errorf("ssh exited: %s", stderr.String())
		default:
		}
		_, err := os.Stat(local)
		return err == nil, nil
	})
	if err != nil {
		stop()
		if sshErr != nil {
			// The exit status, for SSHRetry; the message says what ssh said.
			return "", nil, []byte(stderr.String()), fmt.Errorf("%w: %w", err, sshErr)
		}
		return "", nil, nil, err
	}
	return local, stop, nil, nil
}
