package check_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestExitCodes builds coronerctl and checks what `coronerctl check` exits with: 0 when
// there are only hints, 1 on warnings and errors (a manifest that does not parse is one),
// 2 on a command line that names nothing to check, with one line on stderr.
func TestExitCodes(t *testing.T) {
	if testing.Short() {
		t.Skip("builds coronerctl")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "coronerctl")
	if out, err := exec.Command("go", "build", "-o", bin, "..").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	job := func(extra string) string {
		return "apiVersion: batch/v1\nkind: Job\nmetadata: {name: j}\nspec:\n  managedBy: coroner.dev/shim\n" + extra +
			"  template:\n    metadata:\n      annotations: {coroner.dev/safe-to-forcefully-delete: \"true\"}\n" +
			"    spec:\n      restartPolicy: Never\n      containers: [{name: main, image: busybox}]\n"
	}
	files := map[string]string{
		"ok.yaml":      job("  activeDeadlineSeconds: 600\n"),
		"hint.yaml":    job(""),
		"typo.yaml":    job("  activeDeadlineSeconds: 600\n  podFailurePolicy: {rules: [{action: FailJob, onPodConditions: [{type: coroner.dev/OOMKiled}]}]}\n"),
		"yes.yaml":     strings.Replace(job("  activeDeadlineSeconds: 600\n"), `"true"`, `"yes"`, 1),
		"dead.yaml":    job("  activeDeadlineSeconds: 600\n  podFailurePolicy: {rules: [{action: FailJob, onExitCodes: {operator: NotIn, values: [1]}}, {action: Ignore, onExitCodes: {operator: In, values: [3]}}]}\n"),
		"invalid.yaml": job("  activeDeadlineSeconds: -1\n"),
		"broken.yaml":  "apiVersion: batch/v1\nkind: Job\nmetadata: {name: [\n",
		"cm.yaml":      "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	f := func(name string) string { return filepath.Join(dir, name) }
	cases := []struct {
		name       string
		args       []string
		stdin      string
		wantCode   int
		wantStdout string
		wantStderr string // when set, stderr is this one line
	}{
		{name: "clean", args: []string{"-f", f("ok.yaml")}, wantStdout: "Job j: ok"},
		{name: "hints only", args: []string{"-f", f("hint.yaml")}, wantStdout: "Job j: hint: "},
		{name: "stdin", args: []string{"-f", "-"}, stdin: files["ok.yaml"], wantStdout: "<stdin>: Job j: ok"},
		{name: "misspelt condition type", args: []string{"-f", f("typo.yaml")}, wantCode: 1, wantStdout: "did you mean coroner.dev/OOMKilled?"},
		{name: "opt-in set to yes", args: []string{"-f", f("yes.yaml")}, wantCode: 1, wantStdout: `is "yes": only the exact value "true"`},
		{name: "a rule that never fires", args: []string{"-f", f("dead.yaml")}, wantCode: 1, wantStdout: "rule 1 can never fire: rule 0 matches every pod it would"},
		{name: "an API error", args: []string{"-f", f("invalid.yaml")}, wantCode: 1, wantStdout: "error: spec.activeDeadlineSeconds"},
		{name: "a manifest that does not parse", args: []string{"-f", f("broken.yaml")}, wantCode: 1, wantStdout: "error: document 1 is not YAML"},
		{name: "the whole directory", args: []string{"-f", dir}, wantCode: 1, wantStdout: "Job j: ok"},
		{name: "no -f", wantCode: 2, wantStderr: "coronerctl check: no manifest: give one with -f FILE, -f DIR or -f -"},
		{name: "a file that does not exist", args: []string{"-f", f("ok.yaml"), "-f", f("nope.yaml")}, wantCode: 2, wantStderr: "coronerctl check: stat " + f("nope.yaml") + ": no such file or directory"},
		{name: "no Job in the manifest", args: []string{"-f", f("cm.yaml")}, wantCode: 2, wantStderr: "coronerctl check: no batch/v1 Job or CronJob in " + f("cm.yaml")},
		{name: "a bad flag", args: []string{"--no-such-flag"}, wantCode: 2, wantStderr: "coronerctl check: unknown flag: --no-such-flag"},
		{name: "an argument without -f", args: []string{f("ok.yaml")}, wantCode: 2, wantStderr: `coronerctl check: unexpected argument "` + f("ok.yaml") + `"; name files with -f`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(bin, append([]string{"check"}, tc.args...)...)
			cmd.Stdin = strings.NewReader(tc.stdin)
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
				t.Errorf("exit code = %d, want %d; stdout %q, stderr %q", code, tc.wantCode, stdout.String(), stderr.String())
			}
			if !strings.Contains(stdout.String(), tc.wantStdout) {
				t.Errorf("stdout %q does not contain %q", stdout.String(), tc.wantStdout)
			}
			if tc.wantStderr != "" && stderr.String() != tc.wantStderr+"\n" {
				t.Errorf("stderr = %q, want the one line %q", stderr.String(), tc.wantStderr)
			}
			if tc.wantStderr == "" && stderr.Len() > 0 {
				t.Errorf("stderr = %q, want nothing", stderr.String())
			}
		})
	}
}
