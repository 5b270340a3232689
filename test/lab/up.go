package lab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coroner-dev/coroner/test/host"
	"github.com/coroner-dev/coroner/test/images"
)

// phaseCluster means the cluster is up (3 nodes Ready) but coroner is not deployed yet.
const phaseCluster = "cluster"

// Up brings the lab up, or says it is up already. A lab whose processes are not all
// running, or that an earlier Up left half-made, is removed first and made again; a lab
// whose cluster is up but whose deployment failed goes on from the deployment.
func Up(ctx context.Context, c Config) error {
	if os.Geteuid() != 0 {
		return errNotRoot("lab")
	}
	w := c.out()
	if err := c.checkOwner(); err != nil {
		return err
	}
	st, err := loadState(c.statePath())
	if err != nil {
		return err
	}
	if st != nil {
		if st.Owner != c.Root {
			return fmt.Errorf("%s was written by the lab of %s; run its lab-down", c.statePath(), st.Owner)
		}
		problem := c.health(ctx, st)
		switch {
		case problem == nil && st.Phase == phaseReady:
			fmt.Fprintln(w, "coroner lab: already up")
			if _, ok := vmRunning(st); c.VM && !ok { // the VM node (vm.go)
				fmt.Fprintln(w, "coroner lab: it runs without the VM node: make lab-down, then LAB_VM=1 make lab")
			}
			c.printSummary(ctx, st, 0)
			return nil
		case problem == nil && st.Phase == phaseCluster:
			fmt.Fprintln(w, "coroner lab: the cluster is up; going on with coroner's deployment")
			return c.upFrom(ctx, st, true)
		case problem != nil:
			fmt.Fprintf(w, "coroner lab: an earlier lab is broken (%v): removing it first\n", problem)
		default:
			fmt.Fprintf(w, "coroner lab: an earlier `up` did not finish (phase %q): removing it first\n", st.Phase)
		}
		if err := Down(ctx, c); err != nil {
			return err
		}
	} else if c.anythingLeft() {
		fmt.Fprintln(w, "coroner lab: found leftovers of an earlier lab without a state file: removing them first")
		if err := Down(ctx, c); err != nil {
			return err
		}
	}
	return c.upFrom(ctx, nil, false)
}

// upFrom runs Up's steps; with resume it starts at the deployment of coroner.
func (c Config) upFrom(ctx context.Context, st *State, resume bool) error {
	w := c.out()
	total := 10
	if resume {
		total = 3
	}
	pr := newProgress(w, total)
	if !resume {
		fmt.Fprintf(w, "coroner lab: up (%d nodes, Kubernetes v1.36.3, containerd 2.4 and 1.6) in %s\n", len(c.Nodes), c.shortPath(c.Dir))
	}
	var imgs []images.Image
	var p *clusterPKI
	fail := func(err error) error {
		fmt.Fprintf(w, "\ncoroner lab: up failed after %s\n", seconds(pr.elapsed()))
		if st != nil {
			fmt.Fprintf(w, "The lab is left as it is for a look (logs in %s); `make lab` removes it and starts again, `make lab-down` removes it.\n", c.shortPath(c.logDir()))
		}
		return err
	}
	if !resume {
		steps := []struct {
			title string
			f     func() error
		}{
			{"preflight: root, programs, free ports and addresses", func() error { return c.preflight(pr.say) }},
			{"build: what is missing (Kubernetes, coroner binaries, images)", func() (err error) {
				imgs, err = c.build(ctx, pr.say)
				if err == nil && c.VM { // the VM node (vm.go)
					err = c.buildVM(ctx, pr.say)
				}
				return err
			}},
			{"network: bridge " + BridgeName + ", a namespace and veth pair per node", func() error {
				if err := c.claim(); err != nil {
					return err
				}
				// A new lab starts with new logs (Down keeps the last run's).
				if err := os.RemoveAll(c.logDir()); err != nil {
					return err
				}
				if err := os.MkdirAll(c.logDir(), 0o755); err != nil {
					return err
				}
				st = newState(c.statePath(), c.Root)
				st.HostDirs = missingHostDirs()
				if err := st.update(func(*State) {}); err != nil {
					return err
				}
				if err := c.setupNetwork(st); err != nil {
					return err
				}
				for _, n := range c.Nodes {
					pr.say("%s: netns %s, %s <-> eth0 %s, pods %s", n.Name, n.Netns, n.HostVeth, n.IP, n.PodCIDR)
				}
				if c.VM { // the VM node's tap and routes (vm.go)
					if err := c.setupVMNetwork(st); err != nil {
						return fmt.Errorf("%s: %w", VMNode().Name, err)
					}
					pr.say("%s: tap %s <-> eth0 %s in a VM, pods %s", VMNode().Name, VMNode().HostVeth, VMNode().IP, VMNode().PodCIDR)
				}
				pr.say("API server address %s on %s (also the kubernetes Service ClusterIP)", APIServerIP, BridgeName)
				return nil
			}},
			{"control plane: certificates, etcd, kube-apiserver", func() (err error) {
				if p, err = c.writePKI(); err != nil {
					return err
				}
				if err := c.startEtcd(ctx, st); err != nil {
					return err
				}
				if err := c.startAPIServer(ctx, st, p); err != nil {
					return err
				}
				pr.say("kube-apiserver ready at %s", APIServerURL())
				return nil
			}},
			{"controllers: kube-controller-manager, kube-scheduler", func() error { return c.startControllers(ctx, st, p) }},
			{"nodes: containerd, images, kubelet", func() error {
				if c.VM { // the VM boots while the process nodes start (vm.go)
					if err := c.startVM(ctx, st, p, imgs, pr.say); err != nil {
						return err
					}
				}
				return c.startNodes(ctx, st, p, imgs, pr.say)
			}},
			{fmt.Sprintf("ready: %d nodes Ready, the default ServiceAccount", len(c.Nodes)), func() error {
				if err := c.waitNodesReady(ctx, st, 120*time.Second); err != nil {
					return err
				}
				if c.VM { // the VM node (vm.go)
					if err := c.waitVMReady(ctx, st, pr.say); err != nil {
						return err
					}
				}
				if err := c.waitDefaultServiceAccount(ctx); err != nil {
					return err
				}
				if err := c.waitTestGPUs(ctx, st, 2*time.Minute); err != nil {
					return err
				}
				out, err := c.Kubectl(ctx, nil, "get", "nodes", "-o", "wide")
				if err == nil {
					pr.say("%s", strings.TrimSpace(string(out)))
				}
				return st.update(func(s *State) { s.Phase = phaseCluster })
			}},
		}
		for _, s := range steps {
			if err := pr.step(s.title, s.f); err != nil {
				return fail(err)
			}
		}
	}

	var sts []workloadStatus
	deployed := false
	if c.SkipDeploy {
		pr.say("deployment skipped")
	}
	if err := pr.step("deploy: coroner with kubectl apply -k "+c.shortPath(c.Overlay), func() error {
		if c.SkipDeploy {
			pr.say("skipped (SkipDeploy)")
			return nil
		}
		if _, err := os.Stat(c.Overlay); err != nil {
			pr.say("%s missing: coroner is not deployed (the lab runs without it)", c.shortPath(c.Overlay))
			return nil
		}
		wls, err := c.deploy(ctx, pr.say)
		if err != nil {
			return err
		}
		deployed = true
		if err := st.update(func(s *State) { s.Workloads = wls }); err != nil {
			return err
		}
		if len(wls) == 0 {
			pr.say("the overlay has no DaemonSet or Deployment")
			return nil
		}
		sts, err = c.waitWorkloads(ctx, wls, 120*time.Second)
		return err
	}); err != nil {
		return fail(err)
	}
	if err := pr.step("pods: coroner's DaemonSet and Deployment", func() error {
		if !deployed {
			pr.say("coroner is not deployed")
			return nil
		}
		if !c.reportWorkloads(ctx, sts, pr.say) {
			pr.say("WARNING: not every coroner pod is ready (see above); the lab is up anyway.")
		}
		return nil
	}); err != nil {
		return fail(err)
	}
	if err := pr.step("demo: a Job with podFailurePolicy and backoffLimitPerIndex, run by coroner-shim", func() error {
		if c.SkipDemo || c.SkipDeploy {
			pr.say("skipped")
			return nil
		}
		if ok, why := shimRunning(sts); !ok {
			pr.say("coroner-shim is not running (%s).", why)
			pr.say("The demo Job needs it (its spec.managedBy hands it to the shim, so the built-in Job")
			pr.say("controller leaves it alone): skipped. Run it when the shim runs: %s demo", c.labCommand())
			return nil
		}
		return c.runDemo(ctx, pr.say, 120*time.Second)
	}); err != nil {
		return fail(err)
	}
	if err := st.update(func(s *State) {
		s.Phase = phaseReady
		s.Timings = append(s.Timings, pr.timings...)
	}); err != nil {
		return fail(err)
	}
	c.printSummary(ctx, st, pr.elapsed())
	return nil
}

// startNodes prepares and starts every node: containerds and image imports in parallel,
// then the kubelets.
func (c Config) startNodes(ctx context.Context, st *State, p *clusterPKI, imgs []images.Image, say func(string, ...any)) error {
	changed, err := makeRShared(cgroupFSRoot)
	if err != nil {
		return err
	}
	if changed {
		if err := st.update(func(s *State) { s.SharedMounts = append(s.SharedMounts, cgroupFSRoot) }); err != nil {
			return err
		}
		say("made %s rshared, as on a systemd host (mountPropagation HostToContainer needs it); lab-down makes it private again", cgroupFSRoot)
	}
	for _, n := range c.Nodes {
		if err := c.prepareNode(st, n, p); err != nil {
			return fmt.Errorf("%s: %w", n.Name, err)
		}
		if err := c.startHolder(st, n); err != nil {
			return fmt.Errorf("%s: %w", n.Name, err)
		}
	}
	say("a mount namespace per node (mountns.go): its own %s", strings.Join(mountTargets(), ", "))
	err = parallel(c.Nodes, func(n Node) error {
		start := time.Now()
		if err := c.startContainerd(ctx, st, n); err != nil {
			return err
		}
		ready := time.Since(start)
		if err := c.importImages(ctx, n, imgs); err != nil {
			return fmt.Errorf("%s: %w", n.Name, err)
		}
		rt, _ := c.runtime(n) // resolved by build already
		say("%s: containerd %s ready in %s at %s, %d images imported in %s", n.Name, rt.Version, seconds(ready), n.Socket(), len(imgs), seconds(time.Since(start)-ready))
		return nil
	})
	if err != nil {
		return err
	}
	// The kubelets change a few kernel tunables when they start: keep the values from before
	// the first one, for Down.
	if st.Sysctls == nil {
		if err := st.update(func(s *State) { s.Sysctls = readSysctls() }); err != nil {
			return err
		}
	}
	for _, n := range c.Nodes {
		started := time.Now()
		if err := c.startKubelet(st, n); err != nil {
			return fmt.Errorf("%s: %w", n.Name, err)
		}
		if err := c.waitDeviceManager(ctx, st, n, started); err != nil {
			return fmt.Errorf("%s: %w", n.Name, err)
		}
		if err := c.startTestGPU(st, n); err != nil {
			return fmt.Errorf("%s: %w", n.Name, err)
		}
	}
	say("kubelets started (cgroupRoot /%s/NODE, logs in %s), each with %d test GPUs (%s)", CgroupParent, c.shortPath(c.logDir()), TestGPUs, TestGPUResource)
	return nil
}

func parallel(nodes []Node, f func(Node) error) error {
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f(n)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// preflight checks what Up needs before it changes anything on the machine.
func (c Config) preflight(say func(string, ...any)) error {
	var missing []string
	for _, prog := range []string{"containerd", "ctr", "runc", "containerd-shim-runc-v2", "unshare", "nsenter"} {
		if _, err := exec.LookPath(prog); err != nil {
			missing = append(missing, prog)
		}
	}
	for _, f := range []string{"/usr/lib/cni/bridge", "/usr/lib/cni/host-local", "/usr/lib/cni/loopback", images.BusyboxPath} {
		if _, err := os.Stat(f); err != nil {
			missing = append(missing, f)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("missing: %s (apt-get install containerd runc busybox-static containernetworking-plugins)", strings.Join(missing, ", "))
	}
	if !c.SkipBuild {
		if _, err := goCommand(); err != nil {
			return err
		}
	}
	mounts, err := host.CgroupMounts()
	if err != nil || len(mounts) == 0 {
		return fmt.Errorf("no cgroup hierarchy mounted (%v)", err)
	}
	for _, port := range []int{EtcdClientPort, EtcdPeerPort, KCMPort, SchedulerPort} {
		if err := checkPortFree("127.0.0.1", port); err != nil {
			return err
		}
	}
	if err := checkPortFree(APIServerIP, APIServerPort); err != nil {
		return err
	}
	if err := checkAddressesFree(); err != nil {
		return err
	}
	sock := filepath.Join(c.nodeDir(c.Nodes[len(c.Nodes)-1]), "kubelet", "pod-resources", "kubelet.sock")
	if len(sock) > 107 {
		return fmt.Errorf("the repository path is too long for the kubelet's unix sockets (%s is %d bytes, at most 107): use a clone at a shorter path", sock, len(sock))
	}
	say("root, Debian's containerd %s, runc, CNI plugins, busybox; ports 127.0.0.1:%d,%d,%d,%d and %s:%d free; %s unused",
		containerdVersion(), EtcdClientPort, EtcdPeerPort, KCMPort, SchedulerPort, APIServerIP, APIServerPort, LabCIDR)
	return nil
}

func containerdVersion() string {
	out, err := exec.Command("containerd", "--version").Output()
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(out))
	if len(f) >= 3 {
		return f[2]
	}
	return strings.TrimSpace(string(out))
}

// checkPortFree fails with the name of the program that listens on ip:port. For an
// address that is not on the machine yet (the API server's), it looks for listeners on
// the wildcard address or that address.
func checkPortFree(ip string, port int) error {
	if l, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port))); err == nil {
		l.Close()
		return nil
	} else if !strings.Contains(err.Error(), "address already in use") && ip != APIServerIP {
		return fmt.Errorf("cannot listen on %s:%d: %w", ip, port, err)
	}
	for _, l := range tcpListeners(port) {
		if l.ip == ip || l.ip == "0.0.0.0" || l.ip == "::" {
			owner := "another program"
			if l.pid > 0 {
				owner = fmt.Sprintf("%s (pid %d)", commandName(l.pid), l.pid)
			}
			return fmt.Errorf("port %s:%d, which the lab needs, is taken by %s (listening on %s)", ip, port, owner, net.JoinHostPort(l.ip, strconv.Itoa(port)))
		}
	}
	if ip == APIServerIP {
		return nil // the address does not exist yet and nobody listens on the wildcard
	}
	return fmt.Errorf("port %s:%d, which the lab needs, is taken", ip, port)
}

type tcpListener struct {
	ip  string
	pid int
}

// tcpListeners returns the listening TCP sockets on port from /proc/net/tcp{,6}, with the
// process that owns each when it can be found.
func tcpListeners(port int) []tcpListener {
	var ls []tcpListener
	inodes := map[string]int{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fs := strings.Fields(line)
			if len(fs) < 10 || fs[3] != "0A" {
				continue
			}
			hostHex, portHex, ok := strings.Cut(fs[1], ":")
			if !ok {
				continue
			}
			if p, err := strconv.ParseUint(portHex, 16, 16); err != nil || int(p) != port {
				continue
			}
			ls = append(ls, tcpListener{ip: hexIP(hostHex)})
			inodes[fs[9]] = len(ls) - 1
		}
	}
	if len(ls) == 0 {
		return nil
	}
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		fds, _ := os.ReadDir("/proc/" + p.Name() + "/fd")
		for _, fd := range fds {
			target, err := os.Readlink("/proc/" + p.Name() + "/fd/" + fd.Name())
			if err != nil || !strings.HasPrefix(target, "socket:[") {
				continue
			}
			if i, ok := inodes[strings.TrimSuffix(strings.TrimPrefix(target, "socket:["), "]")]; ok && ls[i].pid == 0 {
				ls[i].pid = pid
			}
		}
	}
	return ls
}

// hexIP decodes an address of /proc/net/tcp (IPv4: 8 hex digits, little-endian; IPv6: 32
// hex digits, four little-endian words).
func hexIP(h string) string {
	b := make([]byte, len(h)/2)
	for i := range b {
		v, _ := strconv.ParseUint(h[2*i:2*i+2], 16, 8)
		b[i] = byte(v)
	}
	for i := 0; i+4 <= len(b); i += 4 {
		b[i], b[i+1], b[i+2], b[i+3] = b[i+3], b[i+2], b[i+1], b[i]
	}
	return net.IP(b).String()
}

// claim records in /run/coroner-lab/owner which repository's lab uses the machine's lab
// names; checkOwner refuses to touch a lab of another repository.
func (c Config) claim() error {
	if err := os.MkdirAll(RunDir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(RunDir, "owner"), []byte(c.Root+"\n"), 0o644)
}

func (c Config) checkOwner() error {
	b, err := os.ReadFile(filepath.Join(RunDir, "owner"))
	if err != nil {
		return nil
	}
	owner := strings.TrimSpace(string(b))
	if owner != "" && owner != c.Root {
		if _, err := os.Stat(owner); err == nil {
			return fmt.Errorf("a lab of another clone (%s) uses this machine's lab names (%s, %s, %s*): run `make lab-down` there first", owner, RunDir, BridgeName, NetnsPrefix)
		}
	}
	return nil
}

// health is nil when every recorded process runs and the API server is ready.
func (c Config) health(ctx context.Context, st *State) error {
	var dead []string
	for _, p := range st.procs() {
		if !p.running() {
			dead = append(dead, p.Name)
		}
	}
	if len(dead) > 0 {
		return fmt.Errorf("not running: %s", strings.Join(dead, ", "))
	}
	if len(st.Processes) == 0 {
		return errors.New("no process recorded")
	}
	cs, err := c.Clientset()
	if err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(rctx)
	if err != nil || string(body) != "ok" {
		return fmt.Errorf("kube-apiserver not ready: %v", err)
	}
	return nil
}

// labCommand is how to run this program again, for messages.
func (c Config) labCommand() string {
	exe, err := os.Executable()
	if err != nil || strings.Contains(exe, "go-build") {
		return "go run ./test/lab/cmd/coroner-lab"
	}
	return c.shortPath(exe)
}

// printSummary prints where the lab is and how to use it.
func (c Config) printSummary(ctx context.Context, st *State, took time.Duration) {
	w := c.out()
	fmt.Fprintln(w)
	if took > 0 {
		var parts []string
		for _, t := range st.Timings {
			parts = append(parts, fmt.Sprintf("%s %.1fs", t.Step, t.Seconds))
		}
		fmt.Fprintf(w, "coroner lab: up in %s (%s)\n", seconds(took), strings.Join(parts, ", "))
	}
	if out, err := c.Kubectl(ctx, nil, "get", "nodes"); err == nil {
		fmt.Fprintf(w, "%s\n", strings.TrimSpace(string(out)))
	}
	if took == 0 && len(st.Workloads) > 0 {
		fmt.Fprintln(w, "coroner:")
		var sts []workloadStatus
		cs, err := c.Clientset()
		if err == nil {
			for _, wl := range st.Workloads {
				sts = append(sts, workloadState(ctx, cs, wl))
			}
			c.reportWorkloads(ctx, sts, func(format string, args ...any) { fmt.Fprintf(w, "  "+format+"\n", args...) })
		}
	}
	fmt.Fprintf(w, "\nkubeconfig: %s\n", c.Kubeconfig())
	fmt.Fprintf(w, "  export KUBECONFIG=%s\n", c.Kubeconfig())
	fmt.Fprintf(w, "  %s get pods -A -o wide\n", c.shortPath(c.bin("kubectl")))
	fmt.Fprintf(w, "logs: %s   state: %s\n", c.shortPath(c.logDir()), c.shortPath(c.statePath()))
	fmt.Fprintf(w, "status: %s status    remove: make lab-down\n", c.labCommand())
}
