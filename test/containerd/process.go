package containerd

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// process is containerd, with its output appended to a log file.
type process struct {
	cmd     *exec.Cmd
	logPath string
	done    chan struct{} // closed when the process has exited
	waitErr error
}

// startProcess runs bin with args, appending stdout and stderr to dir/name.log (a restart
// appends to the same log). The child gets SIGKILL if the test binary dies first
// (Pdeathsig) and runs in its own process group.
func startProcess(dir, name, bin string, args ...string) (*process, error) {
	logPath := filepath.Join(dir, name+".log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *process) exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.waitErr
	default:
		return false, nil
	}
}

// kill sends SIGKILL to the process (not its group: shims have their own sessions anyway)
// and waits until it is gone.
func (p *process) kill() {
	if done, _ := p.exited(); done {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// stop sends SIGTERM to the process group, waits up to grace, then SIGKILLs it.
func (p *process) stop(grace time.Duration) {
	if done, _ := p.exited(); done {
		return
	}
	signalGroup(p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		signalGroup(p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// logTail returns the last n bytes of the log.
func (p *process) logTail(n int) string {
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
