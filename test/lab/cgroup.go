package lab

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cgroupMount is a mounted cgroup hierarchy.
type cgroupMount struct {
	path string
	v2   bool
}

// cgroupMounts returns the mount points of the cgroup hierarchies: every v1 hierarchy
// (cpu, memory, ..., name=systemd) and the cgroup2 one (the whole tree on a unified host,
// /sys/fs/cgroup/unified on a hybrid one, where runc 1.1 makes every container's cgroup
// too).
func cgroupMounts() ([]cgroupMount, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var mounts []cgroupMount
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
			mounts = append(mounts, cgroupMount{path: fields[4]})
			seen[fields[4]] = true
		case "cgroup2":
			mounts = append(mounts, cgroupMount{path: fields[4], v2: true})
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

// unifiedOnly reports whether the host has only the cgroup2 hierarchy.
func unifiedOnly(mounts []cgroupMount) bool {
	for _, m := range mounts {
		if !m.v2 {
			return false
		}
	}
	return len(mounts) > 0
}

// createCgroup makes name (a/b) in every hierarchy, as the kubelet wants its cgroupRoot to
// exist in each. In the cpuset hierarchy it copies cpuset.cpus and cpuset.mems down from
// the parent, without which no process could join. On a host with only cgroup2 it enables
// the parent's controllers for the children.
func createCgroup(name string) error {
	mounts, err := cgroupMounts()
	if err != nil {
		return err
	}
	onlyV2 := unifiedOnly(mounts)
	for _, m := range mounts {
		parent := m.path
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
				if m.v2 {
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

// cgroupDirs returns every directory of the cgroup name in every hierarchy, deepest first.
func cgroupDirs(name string) []string {
	mounts, _ := cgroupMounts()
	var dirs []string
	for _, m := range mounts {
		root := filepath.Join(m.path, name)
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
	}
	sort.SliceStable(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
	return dirs
}

// cgroupPIDs lists the processes in the subtree of cgroup name in every hierarchy.
func cgroupPIDs(name string) []int {
	seen := map[int]bool{}
	var pids []int
	for _, d := range cgroupDirs(name) {
		b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil && !seen[pid] && alive(pid) {
				seen[pid] = true
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// removeCgroup kills every process in the subtree of cgroup name and removes its
// directories in every hierarchy. It returns the directories it could not remove.
func removeCgroup(name string) []string {
	for range 50 {
		pids := cgroupPIDs(name)
		if len(pids) == 0 {
			break
		}
		killAll(pids)
		waitGone(pids, time.Second)
	}
	var left []string
	for range 40 {
		left = left[:0]
		for _, d := range cgroupDirs(name) {
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

// cgroupFSRoot is where the cgroup hierarchies are mounted, and what the agent's DaemonSet
// mounts with mountPropagation HostToContainer.
const cgroupFSRoot = "/sys/fs/cgroup"

// mountPropagation returns "shared", "slave" or "private" for the mount point path, or ""
// when path is not a mount point.
func mountPropagation(path string) string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	prop := ""
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 7 || unescapeMountPath(f[4]) != path {
			continue
		}
		prop = "private" // the last mount on path is the visible one
		for _, opt := range f[6:] {
			if opt == "-" {
				break
			}
			switch {
			case strings.HasPrefix(opt, "shared:"):
				prop = "shared"
			case strings.HasPrefix(opt, "master:") && prop != "shared":
				prop = "slave"
			}
		}
	}
	return prop
}

// makeRShared makes the mount at path and the mounts below it shared, as systemd makes
// every mount of a real node: containerd refuses mountPropagation HostToContainer (the
// agent's /sys/fs/cgroup) from a private mount. It returns whether it changed anything.
func makeRShared(path string) (bool, error) {
	switch mountPropagation(path) {
	case "", "shared":
		return false, nil
	}
	if err := syscall.Mount("", path, "", syscall.MS_REC|syscall.MS_SHARED, ""); err != nil {
		return false, fmt.Errorf("make %s rshared: %w", path, err)
	}
	return true, nil
}

// makeRPrivate undoes makeRShared.
func makeRPrivate(path string) error {
	if mountPropagation(path) == "" {
		return nil
	}
	return syscall.Mount("", path, "", syscall.MS_REC|syscall.MS_PRIVATE, "")
}
