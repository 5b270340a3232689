package lab

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/coroner-dev/coroner/test/host"
	"github.com/coroner-dev/coroner/test/vm"
)

// VMHealth says what the VM node is doing, for a failure report when it stops answering
// (a CI run lost it minutes into the e2e suite, QEMU still running, "No route to host"):
// QEMU's process and the guest's run state from QMP (an I/O error on the overlay is
// QEMU stopping the guest), QEMU's memory, the host's free disk under _output and free
// memory, the guest's status file and the console's end. "" when the lab has no VM node.
func (c Config) VMHealth(ctx context.Context) string {
	st, err := loadState(c.statePath())
	if err != nil || st == nil {
		return ""
	}
	proc, running := vmRunning(st)
	if proc.PID == 0 {
		return ""
	}
	m := c.vmMachine()
	var b strings.Builder
	if !running {
		fmt.Fprintf(&b, "%s (pid %d): NOT RUNNING\n", vmProc, proc.PID)
	} else {
		rss, _ := vm.RSS(proc.PID)
		fmt.Fprintf(&b, "%s (pid %d): running, RSS %.2f GiB\n", vmProc, proc.PID, float64(rss)/(1<<30))
	}
	if s, err := vm.Status(ctx, m.QMP); err != nil {
		fmt.Fprintf(&b, "guest run state: %v\n", err)
	} else {
		fmt.Fprintf(&b, "guest run state (QMP): %s\n", s)
	}
	var fs syscall.Statfs_t
	if err := syscall.Statfs(filepath.Dir(m.Overlay), &fs); err == nil {
		fmt.Fprintf(&b, "host disk under %s: %.1f GiB free\n", c.shortPath(filepath.Dir(m.Overlay)), float64(fs.Bavail)*float64(fs.Bsize)/(1<<30))
	}
	if avail, err := memAvailable(); err == nil {
		fmt.Fprintf(&b, "host memory available: %.1f GiB\n", float64(avail)/(1<<30))
	}
	if la, err := os.ReadFile("/proc/loadavg"); err == nil {
		fmt.Fprintf(&b, "host load: %s\n", strings.TrimSpace(string(la)))
	}
	if status, err := os.ReadFile(filepath.Join(c.nodeDir(VMNode()), "status")); err == nil {
		fmt.Fprintf(&b, "guest status file:\n%s\n", strings.TrimSpace(string(status)))
	}
	fmt.Fprintf(&b, "console (%s), its end:\n%s", c.shortPath(m.Console), vm.Tail(m.Console, 2500))
	return b.String()
}

// memAvailable is the host's MemAvailable in bytes.
func memAvailable() (int64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	return host.KiBField(string(b), "MemAvailable")
}
