package host

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// Process is a binary a test environment started (etcd, kube-apiserver, containerd...),
// with its output appended to a log file.
type Process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{} // closed when the process has exited
	waitErr error
}

// StartProcess runs bin with args, appending its stdout and stderr to dir/name.log (a
// restart appends to the same log). The child runs in its own process group and gets
// SIGKILL if the test binary dies first (Pdeathsig), so a test killed by a timeout or a
// panic leaves nothing behind.
func StartProcess(dir, name, bin string, args ...string) (*Process, error) {
	return StartCommand(dir, name, exec.Command(bin, args...))
}

// StartCommand is StartProcess for a command the caller prepared (environment, standard
// input, standard output): its stderr, and its stdout unless set, go to dir/name.log.
func StartCommand(dir, name string, cmd *exec.Cmd) (*Process, error) {
	logPath := filepath.Join(dir, name+".log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	if cmd.Stdout == nil {
		cmd.Stdout = logFile
	}
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Process{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// Done is closed once the process has exited; Err then says how.
func (p *Process) Done() <-chan struct{} { return p.done }

// Err is how the process ended (nil before it has).
func (p *Process) Err() error {
	select {
	case <-p.done:
		return p.waitErr
	default:
		return nil
	}
}

// PID is the process ID.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Name is the name the process was started with.
func (p *Process) Name() string { return p.name }

// Exited reports whether the process has ended, and how.
func (p *Process) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.waitErr
	default:
		return false, nil
	}
}

// Kill sends SIGKILL to the process alone (not its group) and waits until it is gone.
func (p *Process) Kill() {
	if done, _ := p.Exited(); done {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// Stop sends SIGTERM to the process group, waits up to grace, then SIGKILLs it. It waits
// until the process is gone.
func (p *Process) Stop(grace time.Duration) {
	if done, _ := p.Exited(); done {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// LogTail returns the last n bytes of the process log, for error messages.
func (p *Process) LogTail(n int) string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	if len(b) > n {
		b = b[len(b)-n:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return string(b)
}
