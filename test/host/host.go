// Package host holds what the test environments that run real node components on this
// machine (test/containerd, test/lab) do to the host: cgroups in every hierarchy, and
// reaping the processes left in them. It needs root.
package host

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// CgroupMount is a mounted cgroup hierarchy.
type CgroupMount struct {
	Path string
	V2   bool
}

// CgroupMounts returns the mount points of the cgroup hierarchies: every v1 hierarchy
// (cpu, memory, ..., name=systemd) and the cgroup2 one (the whole tree on a unified host,
// /sys/fs/cgroup/unified on a hybrid one, where runc 1.1 makes every container's cgroup
// too).
func CgroupMounts() ([]CgroupMount, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var mounts []CgroupMount
	seen := map[string]bool{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		// id parent major:minor root mountpoint options [optional...] - fstype source superoptions
		fields := strings.Fields(s.Text())
		i := indexOf(fields, "-")
		if i < 0 || i+1 >= len(fields) || len(fields) < 5 || seen[fields[4]] {
			continue
		}
		switch fields[i+1] {
		case "cgroup":
			mounts = append(mounts, CgroupMount{Path: fields[4]})
			seen[fields[4]] = true
		case "cgroup2":
			mounts = append(mounts, CgroupMount{Path: fields[4], V2: true})
			seen[fields[4]] = true
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

// UnifiedOnly reports whether the host has only the cgroup2 hierarchy.
func UnifiedOnly(mounts []CgroupMount) bool {
	for _, m := range mounts {
		if !m.V2 {
			return false
		}
	}
	return len(mounts) > 0
}

// CreateCgroup makes name (a/b) in every hierarchy, as the kubelet wants its cgroupRoot to
// exist in each. In the cpuset hierarchy it copies cpuset.cpus and cpuset.mems down from
// the parent, without which no process could join. On a host with only cgroup2 it enables
// the parent's controllers for the children.
func CreateCgroup(name string) error {
	mounts, err := CgroupMounts()
	if err != nil {
		return err
	}
	onlyV2 := UnifiedOnly(mounts)
	for _, m := range mounts {
		parent := m.Path
		for _, part := range strings.Split(name, "/") {
			dir := filepath.Join(parent, part)
			if onlyV2 {
				if b, err := os.ReadFile(filepath.Join(parent, "cgroup.controllers")); err == nil {
					var enable []string
					for _, c := range strings.Fields(string(b)) {
						enable = append(enable, "+"+c)
					}
					_ = os.WriteFile(filepath.Join(parent, "cgroup.subtree_control"), []byte(strings.Join(enable, " ")), 0o644)
				}
			}
			if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
				return err
			}
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				if m.V2 {
					break
				}
				b, err := os.ReadFile(filepath.Join(parent, f))
				if err != nil {
					continue // not the cpuset hierarchy
				}
				cur, _ := os.ReadFile(filepath.Join(dir, f))
				if len(bytes.TrimSpace(cur)) > 0 {
					continue
				}
				if err := os.WriteFile(filepath.Join(dir, f), bytes.TrimSpace(b), 0o644); err != nil {
					return err
				}
			}
			parent = dir
		}
	}
	return nil
}

// CgroupDirs returns every directory of the cgroup name in every hierarchy, deepest first.
func CgroupDirs(name string) []string {
	mounts, _ := CgroupMounts()
	var dirs []string
	for _, m := range mounts {
		_ = filepath.WalkDir(filepath.Join(m.Path, name), func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
	}
	sort.SliceStable(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
	return dirs
}

// CgroupPIDs lists the live processes in the subtree of cgroup name in every hierarchy.
func CgroupPIDs(name string) []int {
	seen := map[int]bool{}
	var pids []int
	for _, d := range CgroupDirs(name) {
		b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil && !seen[pid] && Alive(pid) {
				seen[pid] = true
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// KillCgroup kills every process in the subtree of cgroup name, until none is left (or
// after 50 rounds).
func KillCgroup(name string) {
	for range 50 {
		pids := CgroupPIDs(name)
		if len(pids) == 0 {
			return
		}
		KillAll(pids)
		WaitGone(pids, time.Second)
	}
}

// RemoveCgroup kills every process in the subtree of cgroup name and removes its
// directories in every hierarchy. It returns the directories it could not remove.
func RemoveCgroup(name string) []string {
	KillCgroup(name)
	var left []string
	for range 40 {
		left = left[:0]
		for _, d := range CgroupDirs(name) {
			if err := syscall.Rmdir(d); err != nil && !os.IsNotExist(err) {
				left = append(left, d)
			}
		}
		if len(left) == 0 {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return left
}

// Alive reports whether pid exists and is not a zombie whose every thread has exited.
func Alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) || s[i+2] != 'Z' {
		return true
	}
	// A zombie leader: the process is gone once no other thread of it is left. Threads
	// still exiting hold its files, its listening sockets among them (chaos-test saw a
	// restarted kube-apiserver fail to bind the port of one whose leader was a zombie).
	tasks, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	return err == nil && len(tasks) > 1
}

// KillAll sends SIGKILL to every pid.
func KillAll(pids []int) {
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// WaitGone waits until every pid has exited; false if some still run after timeout.
func WaitGone(pids []int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for _, pid := range pids {
		for Alive(pid) {
			if time.Now().After(deadline) {
				return false
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return true
}

// RepoRoot walks up from the working directory to the repository root (the folder that
// holds test/tools/build.sh).
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "test", "tools", "build.sh")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("cannot find the coroner repository root above the working directory")
		}
		dir = parent
	}
}

// ProcessesUsing returns the running processes (but this one) with a command-line
// argument inside one of dirs or equal to it ("--data-dir=DIR/x", "--config DIR/x",
// "-address unix://DIR/sock"), among those whose executable's base name is in programs
// (any program when programs is nil). The test environments use it to find what they
// started even when their own records are lost: containerd and its shims, etcd, kubelets.
func ProcessesUsing(programs []string, dirs ...string) []int {
	entries, _ := os.ReadDir("/proc")
	self := os.Getpid()
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self || !Alive(pid) {
			continue
		}
		if programs != nil {
			exe, err := os.Readlink("/proc/" + e.Name() + "/exe")
			if err != nil || !slices.Contains(programs, filepath.Base(strings.TrimSuffix(exe, " (deleted)"))) {
				continue
			}
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		if argsInside(bytes.Split(b, []byte{0}), dirs) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func argsInside(args [][]byte, dirs []string) bool {
	for _, a := range args[min(1, len(args)):] { // not the program itself
		s := string(a)
		if i := strings.IndexByte(s, '='); i >= 0 && strings.HasPrefix(s, "-") {
			s = s[i+1:]
		}
		s = strings.TrimPrefix(s, "unix://")
		for _, d := range dirs {
			if s == d || strings.HasPrefix(s, d+"/") {
				return true
			}
		}
	}
	return false
}
