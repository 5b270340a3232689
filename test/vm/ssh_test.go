package vm

import (
	"context"
	"errors"
	"net"
	"os/exec"
	"strconv"
	"testing"
	"time"
)

// runSSH runs this machine's OpenSSH client against 127.0.0.1:port (no key, no prompts).
func runSSH(t *testing.T, port int) ([]byte, error) {
	t.Helper()
	if _, err := exec.LookPath("ssh"); err != nil {
		t.Skip("no ssh client on this machine")
	}
	return exec.Command("ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=1", "-o", "StrictHostKeyChecking=no",
		"-o", "UserKnownHostsFile=/dev/null", "-p", strconv.Itoa(port), "root@127.0.0.1", "true").CombinedOutput()
}

// TestNotConnected runs the real ssh client against what a starved guest looks like from
// outside: a port that accepts but never sends sshd's banner (the CI failure: "Connection
// timed out during banner exchange"), and a closed port (sshd not up yet).
func TestNotConnected(t *testing.T) {
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedPort := closed.Addr().(*net.TCPAddr).Port
	closed.Close()

	out, err := runSSH(t, silent.Addr().(*net.TCPAddr).Port)
	if !NotConnected(err, out) {
		t.Errorf("no banner: NotConnected = false for %v: %s", err, out)
	}
	out, err = runSSH(t, closedPort)
	if !NotConnected(err, out) {
		t.Errorf("closed port: NotConnected = false for %v: %s", err, out)
	}
	// A command that ran and failed is not a connection failure, whatever it printed.
	out, err = exec.Command("sh", "-c", "echo 'Connection refused'; exit 1").CombinedOutput()
	if NotConnected(err, out) {
		t.Errorf("a command's own exit 1: NotConnected = true")
	}
	out, err = exec.Command("sh", "-c", "echo done; exit 255").CombinedOutput()
	if NotConnected(err, out) {
		t.Errorf("a remote exit 255 without ssh's message: NotConnected = true")
	}
}

func TestSSHRetry(t *testing.T) {
	defer func(p time.Duration) { sshRetryPause = p }(sshRetryPause)
	sshRetryPause = 50 * time.Millisecond
	refused := func() ([]byte, error) {
		err := exec.Command("sh", "-c", "exit 255").Run()
		return []byte("ssh: connect to host 10.77.4.2 port 22: Connection refused\r\n"), err
	}
	ranFailed := func() ([]byte, error) {
		err := exec.Command("sh", "-c", "exit 2").Run()
		return []byte("no such file"), err
	}
	for _, tc := range []struct {
		name      string
		runs      []func() ([]byte, error)
		wantTries int
		wantErr   bool
	}{
		{"connects at once", []func() ([]byte, error){func() ([]byte, error) { return []byte("ok"), nil }}, 1, false},
		{"connects at the third try", []func() ([]byte, error){refused, refused, func() ([]byte, error) { return nil, nil }}, 3, false},
		{"a command that failed is not run again", []func() ([]byte, error){ranFailed}, 1, true},
		{"gives up after 4 tries", []func() ([]byte, error){refused, refused, refused, refused, refused}, 4, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tries := 0
			start := time.Now()
			_, err := SSHRetry(context.Background(), func() ([]byte, error) {
				tries++
				return tc.runs[min(tries, len(tc.runs))-1]()
			})
			if tries != tc.wantTries || (err != nil) != tc.wantErr {
				t.Errorf("tries %d, err %v; want %d tries, error %v", tries, err, tc.wantTries, tc.wantErr)
			}
			if wait := time.Duration(tc.wantTries-1) * sshRetryPause; time.Since(start) < wait {
				t.Errorf("took %v; want at least %v between tries", time.Since(start), wait)
			}
		})
	}
	// A context that ends stops the retries.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	tries := 0
	_, err := SSHRetry(ctx, func() ([]byte, error) { tries++; return refused() })
	var exit *exec.ExitError
	if tries != 1 || !errors.As(err, &exit) {
		t.Errorf("cancelled: tries %d, err %v; want 1 try and ssh's exit error", tries, err)
	}
}
