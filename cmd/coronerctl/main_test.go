package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestRun checks the command line in-process: help, version, and the exit codes of a bad
// command line (2, one line on stderr naming the command as invoked).
func TestRun(t *testing.T) {
	dir := t.TempDir()
	job := filepath.Join(dir, "job.yaml")
	if err := os.WriteFile(job, []byte("apiVersion: batch/v1\nkind: Job\nmetadata: {name: j}\nspec:\n  managedBy: coroner.dev/shim\n  activeDeadlineSeconds: 600\n"+
		"  template:\n    metadata:\n      annotations: {coroner.dev/safe-to-forcefully-delete: \"true\"}\n"+
		"    spec:\n      restartPolicy: Never\n      containers: [{name: main, image: busybox}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name       string
		argv0      string
		args       []string
		wantCode   int
		wantStdout string
		wantStderr string // the one line on stderr
	}{
		{name: "help", argv0: "coronerctl", args: []string{"--help"}, wantStdout: "coronerctl explain job NAME"},
		{name: "plugin help", argv0: "kubectl-coroner", args: []string{"--help"}, wantStdout: "kubectl coroner explain job NAME"},
		{name: "plugin usage line", argv0: "kubectl-coroner", args: []string{"explain", "--help"}, wantStdout: "  kubectl coroner explain [TYPE[/NAME]"},
		{name: "version flag", argv0: "coronerctl", args: []string{"--version"}, wantStdout: "coronerctl "},
		{name: "plugin version", argv0: "kubectl-coroner", args: []string{"version"}, wantStdout: "kubectl coroner "},
		{name: "completion", argv0: "coronerctl", args: []string{"completion", "bash"}, wantStdout: "bash completion"},
		{name: "check ok", argv0: "coronerctl", args: []string{"check", "-f", job}, wantStdout: "Job j: ok"},
		{name: "no command", argv0: "coronerctl", wantCode: 2, wantStderr: "coronerctl: missing command; see coronerctl --help"},
		{name: "unknown command", argv0: "coronerctl", args: []string{"frobnicate"}, wantCode: 2, wantStderr: `coronerctl: unknown command "frobnicate"; see coronerctl --help`},
		{name: "plugin unknown command", argv0: "kubectl-coroner", args: []string{"frobnicate"}, wantCode: 2, wantStderr: `kubectl coroner: unknown command "frobnicate"; see kubectl coroner --help`},
		{name: "check bad flag", argv0: "coronerctl", args: []string{"check", "--no-such-flag"}, wantCode: 2, wantStderr: "coronerctl check: unknown flag: --no-such-flag"},
		{name: "check no -f", argv0: "kubectl-coroner", args: []string{"check"}, wantCode: 2, wantStderr: "kubectl coroner check: no manifest: give one with -f FILE, -f DIR or -f -"},
		{name: "explain nothing", argv0: "coronerctl", args: []string{"explain"}, wantCode: 2, wantStderr: "coronerctl explain: name a Job or a pod"},
		{name: "explain bad -o", argv0: "coronerctl", args: []string{"explain", "job/x", "-o", "xml"}, wantCode: 2, wantStderr: `coronerctl explain: -o must be text, json or yaml, not "xml"`},
		{name: "explain unknown resource", argv0: "coronerctl", args: []string{"explain", "deploy/x"}, wantCode: 2, wantStderr: `coronerctl explain: explain knows jobs and pods, not "deploy"`},
		{name: "chaos unknown action", argv0: "coronerctl", args: []string{"chaos", "nuke", "x"}, wantCode: 2, wantStderr: `coronerctl chaos: unknown action "nuke"`},
		{name: "quarantine help", argv0: "coronerctl", args: []string{"quarantine", "--help"}, wantStdout: "coronerctl quarantine lift NODE    remove the taint now"},
		{name: "quarantine nothing", argv0: "coronerctl", args: []string{"quarantine"}, wantCode: 2, wantStderr: "coronerctl quarantine: missing subcommand: list, or lift NODE"},
		{name: "quarantine unknown", argv0: "kubectl-coroner", args: []string{"quarantine", "clear"}, wantCode: 2, wantStderr: `kubectl coroner quarantine: unknown subcommand "clear": list, or lift NODE`},
		{name: "quarantine lift no node", argv0: "coronerctl", args: []string{"quarantine", "lift"}, wantCode: 2, wantStderr: "coronerctl quarantine lift: lift takes one NODE, not 0 arguments"},
		{name: "quarantine list with an argument", argv0: "coronerctl", args: []string{"quarantine", "list", "x"}, wantCode: 2, wantStderr: `coronerctl quarantine list: unexpected argument "x"`},
		{name: "chaos bad flag value", argv0: "coronerctl", args: []string{"chaos", "drain", "n1", "--timeout=0s"}, wantCode: 2, wantStderr: "coronerctl chaos: --timeout must be positive"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(tc.argv0, tc.args, strings.NewReader(""), &stdout, &stderr)
			if code != tc.wantCode {
				t.Errorf("exit code = %d, want %d; stderr %q", code, tc.wantCode, stderr.String())
			}
			if !strings.Contains(stdout.String(), tc.wantStdout) {
				t.Errorf("stdout %q does not contain %q", stdout.String(), tc.wantStdout)
			}
			if tc.wantStderr != "" && (!strings.HasPrefix(stderr.String(), tc.wantStderr) || strings.Count(stderr.String(), "\n") != 1) {
				t.Errorf("stderr = %q, want one line starting %q", stderr.String(), tc.wantStderr)
			}
			if tc.wantStderr == "" && stderr.Len() > 0 {
				t.Errorf("stderr = %q, want nothing", stderr.String())
			}
		})
	}
}

// TestPluginBinary builds coronerctl with a version, installs it as kubectl-coroner (a
// symlink, as `go build -o kubectl-coroner` would) and checks that argv[0] decides the
// name it gives itself.
func TestPluginBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds coronerctl")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "coronerctl")
	if out, err := exec.Command("go", "build", "-ldflags", "-X main.version=v9.8.7", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	plugin := filepath.Join(dir, "kubectl-coroner")
	if err := os.Symlink("coronerctl", plugin); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ bin, want string }{{bin, "coronerctl v9.8.7\n"}, {plugin, "kubectl coroner v9.8.7\n"}} {
		out, err := exec.Command(tc.bin, "--version").Output()
		if err != nil || string(out) != tc.want {
			t.Errorf("%s --version = %q, %v; want %q", filepath.Base(tc.bin), out, err, tc.want)
		}
	}
	cmd := exec.Command(plugin, "check")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) || exitErr.ExitCode() != 2 || !strings.HasPrefix(stderr.String(), "kubectl coroner check: no manifest") {
		t.Errorf("kubectl-coroner check: %v, stderr %q; want exit 2 and the usage line", err, stderr.String())
	}
	out, err := exec.Command(plugin, "explain", "--help").Output()
	if err != nil || !strings.Contains(string(out), "kubectl coroner explain job/train -n ml") || strings.Contains(string(out), "coronerctl") {
		t.Errorf("kubectl-coroner explain --help: %v\n%s\nwant kubectl coroner throughout", err, out)
	}
}
