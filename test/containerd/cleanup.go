package containerd

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/coroner-dev/coroner/test/host"
)

// cleanup removes everything a containerd in dir with test cgroup cgroupName left: the
// containerd and shim processes, every process in the test cgroups, the shims' sockets,
// mounts under dir, the cgroups, and dir itself unless keep.
func cleanup(dir, cgroupName string, keep bool) {
	// containerd and shims first, so that nothing restarts or reaps containers meanwhile;
	// then every process in the test cgroups (the containers, reparented to init).
	users := host.ProcessesUsing(nil, dir)
	host.KillAll(users)
	host.WaitGone(users, 5*time.Second)
	if cgroupName != "" {
		host.KillCgroup(cgroupName)
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
		host.RemoveCgroup(cgroupName)
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
