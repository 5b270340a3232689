package lab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/coroner-dev/coroner/test/host"
)

// Down stops everything the lab started and removes what it created: processes (from the
// state file, then whatever still uses the lab's directories: containerd shims,
// containers), pod sandboxes and their network namespaces, mounts under the lab's
// directories, cgroups, network namespaces, links, sockets and directories. Logs stay in
// _output/lab/logs until the next Up. It is idempotent, and works without a state file
// (it then goes by the lab's fixed names and directories).
func Down(ctx context.Context, c Config) error {
	if os.Geteuid() != 0 {
		return errNotRoot("lab-down")
	}
	w := c.out()
	if err := c.checkOwner(); err != nil {
		return err
	}
	st, err := loadState(c.statePath())
	if err != nil {
		fmt.Fprintf(w, "coroner lab: %v; going by the lab's names\n", err)
		st = nil
	}
	if st != nil && st.Owner != "" && st.Owner != c.Root {
		return fmt.Errorf("the state file names another repository (%s)", st.Owner)
	}
	if st == nil && !c.anythingLeft() {
		fmt.Fprintln(w, "coroner lab: not running, nothing to remove")
		return nil
	}
	if st == nil {
		st = &State{}
	}
	began := time.Now()
	fmt.Fprintln(w, "coroner lab: down")
	pr := newProgress(w, 4)
	var problems []string
	problem := func(format string, args ...any) {
		problems = append(problems, fmt.Sprintf(format, args...))
	}

	_ = pr.step("stop kubelets, remove pods, stop containerds", func() error {
		c.stopVM(st, pr.say, problem) // the VM node, if any (vm.go)
		c.stopNodes(ctx, st, pr.say, problem)
		if len(st.Sysctls) > 0 {
			changed, err := restoreSysctls(st.Sysctls)
			if err != nil {
				problem("%v", err)
			}
			if len(changed) > 0 {
				pr.say("restored the kernel tunables the kubelets changed: %s", strings.Join(changed, " "))
			}
		}
		return nil
	})
	_ = pr.step("stop the control plane", func() error {
		procs := st.procs()
		for i := len(procs) - 1; i >= 0; i-- {
			p := procs[i]
			if p.Node != "" {
				continue
			}
			if p.running() {
				p.stop(10 * time.Second)
				pr.say("stopped %s (pid %d)", p.Name, p.PID)
			}
			if p.running() {
				problem("%s (pid %d) still runs", p.Name, p.PID)
			}
		}
		return nil
	})
	_ = pr.step("sweep: processes, mounts, cgroups", func() error {
		c.sweep(st, pr.say, problem)
		return nil
	})
	_ = pr.step("network namespaces, links, files", func() error {
		c.removeNetworkAndFiles(st, pr.say, problem)
		return nil
	})
	if len(problems) > 0 {
		return fmt.Errorf("lab-down left things behind:\n  %s", strings.Join(problems, "\n  "))
	}
	fmt.Fprintf(w, "coroner lab: down in %s; logs of the last run kept in %s\n", seconds(time.Since(began)), c.shortPath(c.logDir()))
	return nil
}

// stopNodes stops every kubelet (so that nothing recreates pods), removes every pod
// sandbox over CRI while containerd still runs (containerd then tears down their network
// namespaces, mounts and shims), and stops the containerds.
func (c Config) stopNodes(ctx context.Context, st *State, say func(string, ...any), problem func(string, ...any)) {
	procs := st.procs()
	for _, p := range procs {
		if strings.HasPrefix(p.Name, "kubelet-") && p.running() {
			p.stop(10 * time.Second)
			say("stopped %s (pid %d)", p.Name, p.PID)
		}
	}
	for _, n := range c.Nodes {
		var ctrd *Proc
		for i := range procs {
			if procs[i].Name == "containerd-"+n.Name {
				ctrd = &procs[i]
			}
		}
		if ctrd == nil || !ctrd.running() {
			continue
		}
		removed, netnsPaths := removeSandboxes(ctx, n.Socket())
		if removed > 0 {
			say("%s: removed %d pod sandboxes", n.Name, removed)
		}
		ctrd.stop(10 * time.Second)
		say("stopped %s (pid %d)", ctrd.Name, ctrd.PID)
		for _, p := range netnsPaths {
			removeNetnsFile(p, problem)
		}
	}
	// The test GPU plugins, then the mount namespace holders: a node's namespace, and
	// every mount its kubelet and containerd made in it, goes with its last process.
	for _, prefix := range []string{"test-gpu-", "ns-"} {
		for _, p := range procs {
			if strings.HasPrefix(p.Name, prefix) && p.running() {
				p.stop(5 * time.Second)
				say("stopped %s (pid %d)", p.Name, p.PID)
			}
		}
	}
}

var netnsPathRE = regexp.MustCompile(`/var/run/netns/cni-[0-9a-f-]+|/run/netns/cni-[0-9a-f-]+`)

// removeSandboxes stops and removes every pod sandbox of a containerd; it returns how
// many, and the network namespace files containerd made for them (to check they are gone).
func removeSandboxes(ctx context.Context, socket string) (int, []string) {
	cri, err := dialCRI(socket)
	if err != nil {
		return 0, nil
	}
	defer cri.Close()
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	r, err := cri.runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return 0, nil
	}
	var paths []string
	n := 0
	for _, s := range r.Items {
		if st, err := cri.runtime.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: s.Id, Verbose: true}); err == nil {
			for _, v := range st.Info {
				paths = append(paths, netnsPathRE.FindAllString(v, -1)...)
			}
		}
		_, _ = cri.runtime.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: s.Id})
		if _, err := cri.runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: s.Id}); err == nil {
			n++
		}
	}
	slices.Sort(paths)
	return n, slices.Compact(paths)
}

// removeNetnsFile unmounts and removes a pod network namespace file if it is still there.
func removeNetnsFile(p string, problem func(string, ...any)) {
	if _, err := os.Lstat(p); err != nil {
		return
	}
	_ = syscall.Unmount(p, syscall.MNT_DETACH)
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		problem("network namespace %s: %v", p, err)
	}
}

// sweep kills what is left (every process using the lab's directories, such as containerd
// shims, and every process in the nodes' cgroups), removes pod network namespaces whose
// sandboxes were not removed, unmounts everything under the lab's directories and removes
// the cgroups.
func (c Config) sweep(st *State, say func(string, ...any), problem func(string, ...any)) {
	// Processes of the state file that are still there (a node's processes when its
	// containerd could not be reached, say).
	for _, p := range st.procs() {
		if p.running() {
			p.stop(5 * time.Second)
			say("stopped %s (pid %d)", p.Name, p.PID)
		}
	}
	// Pod network namespaces are pinned by bind mounts in /run/netns: find the ones whose
	// namespace is that of a process in the lab's cgroups (a pause container), before
	// killing those.
	cgroups := c.cgroupNames(st)
	var labPIDs []int
	for _, cg := range cgroups {
		labPIDs = append(labPIDs, host.CgroupPIDs(cg)...)
	}
	podNetns := netnsFilesOf(labPIDs)

	dirs := []string{c.Dir, RunDir}
	for range 3 {
		pids := processesUsing(dirs...)
		for _, cg := range cgroups {
			pids = append(pids, host.CgroupPIDs(cg)...)
		}
		if len(pids) == 0 {
			break
		}
		for _, pid := range pids {
			say("killing %s (pid %d)", commandName(pid), pid)
		}
		host.KillAll(pids)
		host.WaitGone(pids, 5*time.Second)
	}
	for _, p := range podNetns {
		say("removing pod network namespace %s", p)
		removeNetnsFile(p, problem)
	}

	// The shims' sockets live in containerd's default state dir (/run/containerd/s)
	// whatever its configured state dir; each task's "address" file names its socket.
	addrs, _ := filepath.Glob(filepath.Join(RunDir, "*", "state", "io.containerd.runtime.v2.task", "*", "*", "address"))
	for _, a := range addrs {
		b, err := os.ReadFile(a)
		if err != nil {
			continue
		}
		p := strings.TrimPrefix(strings.TrimSpace(string(b)), "unix://")
		if strings.HasPrefix(p, "/run/containerd/s/") {
			_ = os.Remove(p)
		}
	}

	if left := mountTargetsLeft(); len(left) > 0 {
		problem("a node's mount reached this machine: %s", strings.Join(left, ", "))
	}
	for _, d := range dirs {
		if n := unmountUnder(d); n > 0 {
			say("unmounted %d mounts under %s", n, c.shortPath(d))
		}
		if left := mountsUnder(d); len(left) > 0 {
			problem("mounts left under %s: %s", d, strings.Join(left, ", "))
		}
	}
	for _, cg := range cgroups {
		if left := host.RemoveCgroup(cg); len(left) > 0 {
			problem("cgroups not removed: %s", strings.Join(left, ", "))
		}
	}
	if left := host.RemoveCgroup(CgroupParent); len(left) > 0 {
		problem("cgroups not removed: %s", strings.Join(left, ", "))
	}
	for _, m := range st.SharedMounts {
		if err := makeRPrivate(m); err != nil {
			problem("make %s private again: %v", m, err)
		} else {
			say("made %s private again", m)
		}
	}
}

// cgroupNames are the node cgroups of the state, or of the configured nodes.
func (c Config) cgroupNames(st *State) []string {
	names := slices.Clone(st.Cgroups)
	for _, n := range c.Nodes {
		if !slices.Contains(names, n.Cgroup()) {
			names = append(names, n.Cgroup())
		}
	}
	return names
}

// netnsFilesOf returns the files in /run/netns that pin the network namespace of one of
// pids, except the nodes' own.
func netnsFilesOf(pids []int) []string {
	inodes := map[uint64]bool{}
	for _, pid := range pids {
		var s syscall.Stat_t
		if err := syscall.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &s); err == nil {
			inodes[s.Ino] = true
		}
	}
	entries, _ := os.ReadDir("/run/netns")
	var files []string
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "cni-") {
			continue
		}
		p := filepath.Join("/run/netns", e.Name())
		var s syscall.Stat_t
		if err := syscall.Stat(p, &s); err == nil && inodes[s.Ino] {
			files = append(files, p)
		}
	}
	return files
}

// removeNetworkAndFiles deletes the nodes' network namespaces and the host links, the
// kubelets' symlinks in /var/log/containers, the CNI result cache of the lab's networks,
// and the lab's directories except the logs.
func (c Config) removeNetworkAndFiles(st *State, say func(string, ...any), problem func(string, ...any)) {
	names := slices.Clone(st.Netns)
	for _, n := range append(labNetns(), nodeNetns(c.Nodes)...) {
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	for _, n := range names {
		if _, err := os.Lstat("/run/netns/" + n); err != nil {
			continue
		}
		if err := deleteNetns(n); err != nil {
			problem("network namespace %s: %v", n, err)
		} else {
			say("deleted network namespace %s", n)
		}
	}
	links := slices.Clone(st.Links)
	for _, l := range labLinks() {
		if !slices.Contains(links, l) {
			links = append(links, l)
		}
	}
	// Veths first: deleting one end deletes the pair (it may be gone with its namespace).
	sort.Slice(links, func(i, j int) bool { return links[i] != BridgeName && links[j] == BridgeName })
	for _, l := range links {
		if err := deleteLink(l); err != nil {
			problem("link %s: %v", l, err)
		}
	}
	if left := labLinks(); len(left) > 0 {
		problem("links left: %s", strings.Join(left, ", "))
	} else if len(links) > 0 {
		say("deleted links %s", strings.Join(links, ", "))
	}

	// The kubelet links every container's log into /var/log/containers (not configurable).
	entries, _ := os.ReadDir("/var/log/containers")
	removed := 0
	for _, e := range entries {
		p := filepath.Join("/var/log/containers", e.Name())
		if target, err := os.Readlink(p); err == nil && strings.HasPrefix(target, filepath.Join(c.Dir, "nodes")+"/") {
			if os.Remove(p) == nil {
				removed++
			}
		}
	}
	if removed > 0 {
		say("removed %d log links from /var/log/containers", removed)
	}
	for _, n := range c.Nodes {
		cache, _ := filepath.Glob(filepath.Join("/var/lib/cni/results", "coroner-"+n.Name+"-*"))
		for _, f := range cache {
			_ = os.Remove(f)
		}
	}

	for _, d := range st.HostDirs {
		if removeTreeWithoutFiles(d) {
			say("removed %s", d)
		}
	}

	// Directories: everything of the lab except its logs.
	entriesLab, _ := os.ReadDir(c.Dir)
	for _, e := range entriesLab {
		if e.Name() == "logs" {
			continue
		}
		if err := os.RemoveAll(filepath.Join(c.Dir, e.Name())); err != nil {
			problem("remove %s: %v", filepath.Join(c.Dir, e.Name()), err)
		}
	}
	if err := os.RemoveAll(RunDir); err != nil {
		problem("remove %s: %v", RunDir, err)
	}
}

func nodeNetns(nodes []Node) []string {
	var names []string
	for _, n := range nodes {
		names = append(names, n.Netns)
	}
	return names
}

// anythingLeft reports whether any trace of a lab is on the machine.
func (c Config) anythingLeft() bool {
	if len(labLinks()) > 0 || len(labNetns()) > 0 || len(processesUsing(c.Dir, RunDir)) > 0 || len(mountsUnder(c.Dir)) > 0 || len(mountsUnder(RunDir)) > 0 {
		return true
	}
	if _, err := os.Stat(RunDir); err == nil {
		return true
	}
	for _, n := range c.Nodes {
		if len(host.CgroupDirs(n.Cgroup())) > 0 {
			return true
		}
	}
	if entries, _ := os.ReadDir(c.Dir); len(entries) > 0 {
		for _, e := range entries {
			if e.Name() != "logs" {
				return true
			}
		}
	}
	return false
}

// mountsUnder lists the mount points inside dir (or dir itself), deepest first.
func mountsUnder(dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var points []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 {
			p := unescapeMountPath(f[4])
			if p == dir || strings.HasPrefix(p, dir+"/") {
				points = append(points, p)
			}
		}
	}
	sort.SliceStable(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	return points
}

// unescapeMountPath undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b bytes.Buffer
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v int
			if _, err := fmt.Sscanf(s[i+1:i+4], "%o", &v); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unmountUnder lazily unmounts every mount point inside dir, deepest first, repeating
// while mounts remain (a mount can be stacked several times); it returns how many.
func unmountUnder(dir string) int {
	n := 0
	for range 10 {
		points := mountsUnder(dir)
		if len(points) == 0 {
			break
		}
		for _, p := range points {
			if syscall.Unmount(p, syscall.MNT_DETACH) == nil {
				n++
			}
		}
	}
	return n
}

// errNotRoot is the error for a lab command run without root.
func errNotRoot(what string) error {
	return fmt.Errorf("make %s must run as root: the lab creates network namespaces, a bridge, cgroups and mounts, and runs containerd and kubelets (try: sudo make %s)", what, what)
}

// hostDirs are the fixed places outside the lab's directories where the kubelets (the
// device manager's socket is always /var/lib/kubelet/device-plugins/kubelet.sock, the
// container log links always in /var/log/containers), libmount, the CNI plugins' cache
// and network namespace files go, and the mount points of the nodes' own directories
// (mountns.go: empty on this machine, covered in each node's mount namespace).
var hostDirs = []string{"/var/lib/kubelet", TestGPUStateDir, "/var/log/containers", "/var/lib/cni", "/run/netns", "/run/mount"}

// missingHostDirs returns the hostDirs that do not exist now.
func missingHostDirs() []string {
	var missing []string
	for _, d := range hostDirs {
		if _, err := os.Lstat(d); errors.Is(err, os.ErrNotExist) {
			missing = append(missing, d)
		}
	}
	return missing
}

// removeTreeWithoutFiles removes dir when it holds nothing but directories and unix
// sockets (what the lab's programs leave there), and reports whether it did.
func removeTreeWithoutFiles(dir string) bool {
	if _, err := os.Lstat(dir); err != nil {
		return false
	}
	clean := true
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			clean = false
			return filepath.SkipAll
		}
		if !d.IsDir() && d.Type()&os.ModeSocket == 0 {
			clean = false
			return filepath.SkipAll
		}
		return nil
	})
	if !clean {
		return false
	}
	return os.RemoveAll(dir) == nil
}
