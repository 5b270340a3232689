package lab

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netns"

	"github.com/coroner-dev/coroner/test/host"
)

// startDaemon starts bin as a daemon of the lab: in a session of its own (so it outlives
// the command that started it and a Ctrl-C in that terminal), stdin from /dev/null,
// stdout and stderr appended to logPath. With nsPath it starts in that network namespace
// and nothing else: the same as `nsenter --net=PATH`, and unlike `ip netns exec`, which
// also remounts /sys in a mount namespace of its own and would hide the cgroup mounts.
//
// A daemon's working directory is DaemonDir, an empty directory of the lab's, never the
// starter's (a repository checkout, a test package's directory): the kubelet deletes
// whatever matches "<log path>*" when it removes a container, and for a container
// created without a log path (behind its back, through CRI) that is "*" in its working
// directory. A kubelet restarted by `coronerctl chaos start-kubelet` from test/e2e
// deleted every file of test/e2e that way when the fault suite's unknown container went.
func startDaemon(name, bin string, args []string, logPath, nsPath string) (Proc, error) {
	if err := os.MkdirAll(DaemonDir, 0o755); err != nil {
		return Proc{}, err
	}
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return Proc{}, err
	}
	defer logFile.Close()
	cmd := exec.Command(bin, args...)
	cmd.Dir = DaemonDir
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if nsPath == "" {
		err = cmd.Start()
	} else {
		err = startInNetns(cmd, nsPath)
	}
	if err != nil {
		return Proc{}, fmt.Errorf("start %s: %w", name, err)
	}
	// Reap it if it exits while this process still runs (the Go test runs Up and Down in
	// one process); otherwise init does.
	go func() { _ = cmd.Wait() }()
	st, err := procStartTime(cmd.Process.Pid)
	if err != nil {
		return Proc{}, fmt.Errorf("%s exited at once (see %s)", name, logPath)
	}
	return Proc{Name: name, PID: cmd.Process.Pid, StartTime: st, Log: logPath}, nil
}

// startInNetns forks cmd from an OS thread that has joined the network namespace at
// nsPath, so the child starts in it; the thread goes back to the original namespace
// afterwards (or, if that fails, stays locked and is thrown away by the Go runtime when
// the goroutine ends).
func startInNetns(cmd *exec.Cmd, nsPath string) error {
	return inNetns(nsPath, cmd.Start)
}

// inNetns runs f on an OS thread that has joined the network namespace at nsPath.
func inNetns(nsPath string, f func() error) error {
	target, err := netns.GetFromPath(nsPath)
	if err != nil {
		return fmt.Errorf("open network namespace %s: %w", nsPath, err)
	}
	defer target.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		if err := netns.Set(target); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter network namespace %s: %w", nsPath, err)
			return
		}
		ferr := f()
		if err := netns.Set(orig); err != nil {
			// Leave the thread locked: the runtime ends it with this goroutine.
			errc <- fmt.Errorf("leave network namespace %s: %w (after: %v)", nsPath, err, ferr)
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// procStartTime is field 22 of /proc/PID/stat: the start time in clock ticks since boot.
func procStartTime(pid int) (string, error) {
	f, err := procStat(pid)
	if err != nil {
		return "", err
	}
	return f[19], nil // f starts at field 3
}

// procStat returns the fields of /proc/PID/stat after the command name (field 3 on).
func procStat(pid int) ([]string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil, fmt.Errorf("odd /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return nil, fmt.Errorf("odd /proc/%d/stat", pid)
	}
	return f, nil
}

// running reports whether the recorded process still runs: same PID, same start time.
func (p Proc) running() bool {
	f, err := procStat(p.PID)
	return err == nil && f[0] != "Z" && f[19] == p.StartTime
}

// stop sends SIGTERM to the process (and its process group: it leads its own session),
// waits up to grace, then sends SIGKILL and waits until it is gone. A process whose start
// time differs is another one that reuses the PID and is left alone.
func (p Proc) stop(grace time.Duration) {
	if !p.running() {
		return
	}
	_ = syscall.Kill(-p.PID, syscall.SIGTERM)
	_ = syscall.Kill(p.PID, syscall.SIGTERM)
	if host.WaitGone([]int{p.PID}, grace) {
		return
	}
	if p.running() {
		_ = syscall.Kill(-p.PID, syscall.SIGKILL)
		_ = syscall.Kill(p.PID, syscall.SIGKILL)
	}
	host.WaitGone([]int{p.PID}, 5*time.Second)
}

// labPrograms are the programs the lab runs outside containers.
var labPrograms = []string{
	"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
	"kubelet", "containerd", "containerd-shim-runc-v2", "runc", "coroner-test-gpu",
	// The nodes' mount namespace holders (mountns.go): /bin/sh, Debian's dash.
	"sh", "dash",
}

// processesUsing returns the running lab programs with a command-line argument inside one
// of dirs: what the lab started (etcd --data-dir=..., kubelet --config=..., containerd
// --config ...) and the containerd shims (-address /run/coroner-lab/NODE/containerd.sock).
// Down uses it to find what a lost or stale state file does not name. Other programs (a
// `tail -f` of a lab log, a kubectl with the lab's kubeconfig) are left alone.
func processesUsing(dirs ...string) []int { return host.ProcessesUsing(labPrograms, dirs...) }

// commandName is /proc/PID/comm, for messages.
func commandName(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(b))
}
