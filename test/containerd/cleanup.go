package containerd

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cgroupMounts returns the mount points of the cgroup v1 hierarchies (cpu, memory, ...,
// name=systemd) and of the cgroup2 hierarchy of a hybrid host (/sys/fs/cgroup/unified,
// where runc 1.1 makes every container's cgroup too), from /proc/self/mountinfo.
func cgroupMounts() ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var mounts []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		// id parent major:minor root mountpoint options [optional...] - fstype source superoptions
		fields := strings.Fields(s.Text())
		i := indexOf(fields, "-")
		if i < 0 || i+1 >= len(fields) || len(fields) < 5 {
			continue
		}
		if fields[i+1] == "cgroup" || fields[i+1] == "cgroup2" {
			mounts = append(mounts, fields[4])
		}
	}
	return mounts, s.Err()
}

func indexOf(s []string, x string) int {
	for i, v := range s {
		if v == x {
			return i
		}
	}
	return -1
}

// createCgroup makes /name in every hierarchy; in cpuset it copies cpuset.cpus and
// cpuset.mems from the root, without which no process could join it.
func createCgroup(name string) error {
	mounts, err := cgroupMounts()
	if err != nil {
		return err
	}
	for _, m := range mounts {
		dir := filepath.Join(m, name)
		if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
			return err
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			b, err := os.ReadFile(filepath.Join(m, f))
			if err != nil {
				continue // not the cpuset hierarchy
			}
			if err := os.WriteFile(filepath.Join(dir, f), bytes.TrimSpace(b), 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}

// cgroupDirs returns every directory of the test cgroup in every hierarchy, deepest first.
func cgroupDirs(name string) []string {
	mounts, _ := cgroupMounts()
	var dirs []string
	for _, m := range mounts {
		root := filepath.Join(m, name)
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
	}
	sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
	return dirs
}

// cgroupPIDs lists the processes in the test cgroup's subtree.
func cgroupPIDs(name string) []int {
	seen := map[int]bool{}
	var pids []int
	for _, d := range cgroupDirs(name) {
		b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil && !seen[pid] {
				seen[pid] = true
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// processesUsing returns the processes whose command line has an argument inside dir:
// containerd (--config dir/config.toml) and its shims (-address dir/containerd.sock).
func processesUsing(dir string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		for _, arg := range bytes.Split(b, []byte{0}) {
			if strings.HasPrefix(string(arg), dir+"/") {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

func killAll(pids []int) {
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

func waitGone(pids []int, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for _, pid := range pids {
		for alive(pid) && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// cleanup removes everything a containerd in dir with test cgroup cgroupName left: the
// containerd and shim processes, every process in the test cgroups, the shims' sockets,
// mounts under dir, the cgroups, and dir itself unless keep.
func cleanup(dir, cgroupName string, keep bool) {
	// containerd and shims first, so that nothing restarts or reaps containers meanwhile;
	// then every process in the test cgroups (the containers, reparented to init).
	users := processesUsing(dir)
	killAll(users)
	waitGone(users, 5*time.Second)
	if cgroupName != "" {
		for range 50 {
			pids := cgroupPIDs(cgroupName)
			if len(pids) == 0 {
				break
			}
			killAll(pids)
			waitGone(pids, time.Second)
		}
	}
	// The shims' sockets live in containerd's default state dir whatever --state says;
	// each bundle's "address" file names its socket.
	addrs, _ := filepath.Glob(filepath.Join(dir, "state", "io.containerd.runtime.v2.task", "*", "*", "address"))
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
	unmountUnder(dir)
	if cgroupName != "" {
		for range 20 {
			left := 0
			for _, d := range cgroupDirs(cgroupName) {
				if err := syscall.Rmdir(d); err != nil && !os.IsNotExist(err) {
					left++
				}
			}
			if left == 0 {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if keep {
		_ = os.Rename(filepath.Join(dir, "owner"), filepath.Join(dir, "owner.stopped"))
		return
	}
	_ = os.RemoveAll(dir)
}

// unmountUnder lazily unmounts every mount point inside dir, deepest first.
func unmountUnder(dir string) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var points []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			points = append(points, f[4])
		}
	}
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	for _, p := range points {
		_ = syscall.Unmount(p, syscall.MNT_DETACH)
	}
}
