package vm

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestStatusFromRealQEMU asks a real QEMU (a machine with no guest: -machine none) for its
// status over QMP, as the lab asks its VM node's.
func TestStatusFromRealQEMU(t *testing.T) {
	if _, err := exec.LookPath(QEMU); err != nil {
		t.Skipf("%s not installed (make vm-image installs it)", QEMU)
	}
	for _, tc := range []struct {
		name  string
		extra []string
		want  string
	}{
		{"running", nil, "running"},
		{"stopped at start (-S)", []string{"-S"}, "prelaunch"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sock := filepath.Join(t.TempDir(), "qmp.sock")
			args := append([]string{"-machine", "none", "-display", "none", "-nodefaults", "-no-user-config",
				"-qmp", "unix:" + sock + ",server=on,wait=off"}, tc.extra...)
			cmd := exec.Command(QEMU, args...)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
			ctx := context.Background()
			var got string
			var err error
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
				if got, err = Status(ctx, sock); err == nil {
					break
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("status %q, want %q", got, tc.want)
			}
		})
	}
	if _, err := Status(context.Background(), filepath.Join(t.TempDir(), "none.sock")); err == nil {
		t.Fatal("no error for a socket nobody listens on")
	}
}

// TestParseQueryStatus: query-status's answers, as QEMU 7.2 (Debian bookworm) sends them;
// io-error is what a guest stopped on a failed disk write reports (QEMU's QMP reference,
// RunState).
func TestParseQueryStatus(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"status": "running", "singlestep": false, "running": true}`, "running"},
		{`{"status": "io-error", "singlestep": false, "running": false}`, "io-error"},
		{`{"status": "guest-panicked", "running": false}`, "guest-panicked"},
	} {
		got, err := parseQueryStatus([]byte(tc.in))
		if err != nil || got != tc.want {
			t.Errorf("%s: %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{`{}`, `[1]`, `"x"`} {
		if _, err := parseQueryStatus([]byte(bad)); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}
