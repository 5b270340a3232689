package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The pods' scripts, run by the host's busybox (the lab's image is made of the same
// Debian busybox-static), write what readJobTruth and readRestartTruth read.
func TestScriptsWriteTheirTruth(t *testing.T) {
	bb, err := exec.LookPath("busybox")
	if err != nil {
		t.Skip("no busybox on this machine")
	}
	root := t.TempDir()
	run := func(script string, env ...string) int {
		t.Helper()
		cmd := exec.Command(bb, "sh", "-c", strings.ReplaceAll(script, "/truth", root))
		cmd.Env = append(os.Environ(), env...)
		err := cmd.Run()
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0
	}
	common := []string{"JOB=j", "NODE=n1", "RUN_TICKS=1", "RERUN_TICKS=1", "JITTER=1", "FAIL=2,5"}
	// Index 2 fails once then succeeds, index 3 succeeds at once.
	codes := []int{
		run(truthScript, append(common, "JOB_COMPLETION_INDEX=2", "POD=j-2-a")...),
		run(truthScript, append(common, "JOB_COMPLETION_INDEX=2", "POD=j-2-b")...),
		run(truthScript, append(common, "JOB_COMPLETION_INDEX=3", "POD=j-3-a")...),
	}
	if codes[0] != 1 || codes[1] != 0 || codes[2] != 0 {
		t.Fatalf("exit codes %v, want [1 0 0]", codes)
	}
	tr, err := readJobTruth(root, "j")
	if err != nil {
		t.Fatal(err)
	}
	if tr.failures() != 1 || tr.failuresOf(2) != 1 || len(tr[2]) != 2 || len(tr[3]) != 1 {
		t.Errorf("truth %+v", tr)
	}
	if o, _ := tr.maxOverlap(); o != 0 {
		t.Errorf("overlap %v of attempts run one after the other", o)
	}
	if _, err := os.Stat(filepath.Join(root, "j", "2", "failed")); err != nil {
		t.Errorf("no failed marker: %v", err)
	}

	for range 2 {
		if c := run(restartScript, "POD=r"); c != 3 {
			t.Fatalf("restart script exited %d, want 3", c)
		}
	}
	runs, err := readRestartTruth(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs["r"]) != 2 || runs["r"][1].Ordinal != 1 || !runs["r"][1].Exited || runs["r"][1].Code != 3 {
		t.Errorf("restart runs %+v", runs["r"])
	}
}
