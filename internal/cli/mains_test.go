package cli_test

import (
	"bytes"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestMainsCommandLine builds the three mains and checks how they treat their command
// line: --help prints the usage and succeeds, a bad flag value fails with exit code 2 and
// exactly one line on stderr.
func TestMainsCommandLine(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the mains")
	}
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+"/", "../../cmd/coroner-shim", "../../cmd/coroner-agent", "../../cmd/coronerctl")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cases := []struct {
		name       string
		cmd        string
		args       []string
		wantCode   int
		wantStdout string
		wantStderr string
	}{
		{name: "shim help", cmd: "coroner-shim", args: []string{"--help"}, wantStdout: "--leader-elect-lease-duration"},
		{name: "shim bad duration", cmd: "coroner-shim", args: []string{"--zombie-threshold=soon"}, wantCode: 2, wantStderr: "coroner-shim: invalid argument"},
		{name: "shim unknown flag", cmd: "coroner-shim", args: []string{"--no-such-flag"}, wantCode: 2, wantStderr: "unknown flag: --no-such-flag"},
		{name: "shim invalid value", cmd: "coroner-shim", args: []string{"--workers=0", "--kube-api-qps=-1"}, wantCode: 2, wantStderr: "--workers=0: must be at least 1"},
		{name: "agent help", cmd: "coroner-agent", args: []string{"--help"}, wantStdout: "--runtime-endpoint"},
		{name: "agent bad endpoint", cmd: "coroner-agent", args: []string{"--node-name=n1", "--runtime-endpoint=tcp://x:1"}, wantCode: 2, wantStderr: "--runtime-endpoint"},
		{name: "ctl help", cmd: "coronerctl", args: []string{"--help"}, wantStdout: "coronerctl explain job NAME"},
		{name: "ctl unknown command", cmd: "coronerctl", args: []string{"frobnicate"}, wantCode: 2, wantStderr: `unknown command "frobnicate"`},
		{name: "ctl no command", cmd: "coronerctl", wantCode: 2, wantStderr: "missing command"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(filepath.Join(bin, tc.cmd), tc.args...)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			code := 0
			var exitErr *exec.ExitError
			if errors.As(err, &exitErr) {
				code = exitErr.ExitCode()
			} else if err != nil {
				t.Fatalf("run: %v", err)
			}
			if code != tc.wantCode {
				t.Errorf("exit code = %d, want %d (stderr %q)", code, tc.wantCode, stderr.String())
			}
			if !strings.Contains(stdout.String(), tc.wantStdout) {
				t.Errorf("stdout %q does not contain %q", stdout.String(), tc.wantStdout)
			}
			if tc.wantStderr != "" {
				if !strings.Contains(stderr.String(), tc.wantStderr) {
					t.Errorf("stderr %q does not contain %q", stderr.String(), tc.wantStderr)
				}
				if n := strings.Count(strings.TrimSuffix(stderr.String(), "\n"), "\n"); n != 0 {
					t.Errorf("stderr has %d lines, want one: %q", n+1, stderr.String())
				}
			}
		})
	}
}
