package lab

import (
	"fmt"
	"os"
	"strings"
	"syscall"
)

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
