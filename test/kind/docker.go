package kind

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/coroner-dev/coroner/test/host"
)

// Our dockerd: data root, exec root, socket, pidfile and log under _output/kind/docker.
// --iptables=false leaves the host's and the process lab's forwarding alone (and so no
// NAT: kind's nodes need none, nothing is pulled); --bridge=none, no default bridge; the
// address pool for kind's network is 10.88.0.0/16 (the process lab uses 10.77.0.0/16, the
// host 192.0.2.0/24). The default runtime is test/kind/runcwrap, which drops from every
// container's spec the capabilities this sandbox's bounding set lacks (CAP_SYS_RESOURCE
// here), without which no --privileged container (a kind node) starts.

// AddressPool is the pool kind's docker network takes its subnet from.
const AddressPool = "10.88.0.0/16"

const runtimeName = "coroner-runc"

// dockerPID returns the PID of our dockerd if it runs.
func (c Config) dockerPID() int {
	data, err := os.ReadFile(filepath.Join(c.dockerDir(), "docker.pid"))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return 0
	}
	if syscall.Kill(pid, 0) != nil {
		return 0
	}
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if !strings.Contains(string(cmdline), c.dockerDir()) {
		return 0 // a recycled PID
	}
	return pid
}

// StartDocker starts our dockerd unless it runs, and waits until it answers.
func (c Config) StartDocker(ctx context.Context) error {
	if c.dockerPID() != 0 {
		if _, err := c.docker(ctx, "version", "--format", "{{.Server.Version}}"); err == nil {
			return nil
		}
	}
	dockerd, err := exec.LookPath("dockerd")
	if err != nil {
		return fmt.Errorf("dockerd not found: apt-get install docker.io (Debian's 20.10 is what test/kind is made for)")
	}
	wrapper := c.bin("coroner-kind-runc")
	if err := c.goBuild(ctx, wrapper, "./test/kind/runcwrap"); err != nil {
		return err
	}
	dir := c.dockerDir()
	for _, d := range []string{"data", "exec"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o711); err != nil {
			return err
		}
	}
	logf, err := os.OpenFile(filepath.Join(dir, "dockerd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	// dockerd writes the log through a descriptor of its own; this one is not written.
	defer func() { _ = logf.Close() }()
	cmd := exec.Command(dockerd,
		"--data-root", filepath.Join(dir, "data"),
		"--exec-root", filepath.Join(dir, "exec"),
		"--host", c.DockerHost(),
		"--pidfile", filepath.Join(dir, "docker.pid"),
		"--iptables=false", "--ip-masq=false", "--ip-forward=false", "--bridge=none",
		"--default-address-pool", "base="+AddressPool+",size=24",
		"--add-runtime", runtimeName+"="+wrapper,
		"--default-runtime", runtimeName,
		"--storage-driver", "overlay2",
		"--log-level", "warn",
	)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true} // outlives this command
	cmd.Env = os.Environ()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start dockerd: %w", err)
	}
	pid := cmd.Process.Pid
	go func() { _ = cmd.Wait() }() // reaps it; StopDocker stops it, and its log says how it ended
	c.say("dockerd started (pid %d, %s, log %s)", pid, c.DockerHost(), filepath.Join(dir, "dockerd.log"))
	return waitFor(ctx, 60*time.Second, 300*time.Millisecond, "dockerd answering", func() (bool, error) {
		if syscall.Kill(pid, 0) != nil {
			data, _ := os.ReadFile(filepath.Join(dir, "dockerd.log"))
			return false, fmt.Errorf("dockerd exited:\n%s", tail(string(data), 3000))
		}
		_, err := c.docker(ctx, "version", "--format", "{{.Server.Version}}")
		return err == nil, err
	})
}

// StopDocker stops our dockerd (TERM, then KILL after 30 s) and removes the mounts it may
// leave under its directories.
func (c Config) StopDocker(ctx context.Context) error {
	if pid := c.dockerPID(); pid != 0 {
		_ = syscall.Kill(pid, syscall.SIGTERM) // fails when it is gone already: the loop checks
		deadline := time.Now().Add(30 * time.Second)
		for syscall.Kill(pid, 0) == nil && time.Now().Before(deadline) {
			time.Sleep(200 * time.Millisecond)
		}
		if syscall.Kill(pid, 0) == nil {
			_ = syscall.Kill(pid, syscall.SIGKILL) // fails only when it is gone meanwhile
			time.Sleep(time.Second)
		}
		c.say("dockerd stopped (pid %d)", pid)
	}
	// dockerd's own containerd (started by dockerd, its pidfile in the exec root).
	if data, err := os.ReadFile(filepath.Join(c.dockerDir(), "exec", "containerd", "containerd.pid")); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil && pid > 0 {
			cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			if strings.Contains(string(cmdline), c.dockerDir()) {
				_ = syscall.Kill(pid, syscall.SIGTERM) // fails when it is gone already: the loop checks
				for i := 0; i < 50 && syscall.Kill(pid, 0) == nil; i++ {
					time.Sleep(200 * time.Millisecond)
				}
			}
		}
	}
	return c.unmountUnder(c.dockerDir())
}

// mountsUnder returns the mount points at or below dir, deepest first.
func mountsUnder(dir string) []string {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := strings.ReplaceAll(f[4], `\040`, " ")
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}

func (c Config) unmountUnder(dir string) error {
	var errs []string
	for _, mp := range mountsUnder(dir) {
		if err := syscall.Unmount(mp, 0); err != nil {
			if err := syscall.Unmount(mp, syscall.MNT_DETACH); err != nil {
				errs = append(errs, mp+": "+err.Error())
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("unmount: %s", strings.Join(errs, "; "))
	}
	return nil
}

// goBuild builds a static binary of the main module.
func (c Config) goBuild(ctx context.Context, out, pkg string) error {
	args := append(append([]string{"build"}, host.ProductBuildFlags...), "-o", out, pkg)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = c.Root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", pkg, err, b)
	}
	return nil
}
