package agent

// Tests of the agent's own OOM score.

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestSetOOMScoreAdj sets the score of a real child process through the kernel's own
// file and reads back what the kernel holds.
func TestSetOOMScoreAdj(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	path := filepath.Join("/proc", strconv.Itoa(cmd.Process.Pid), "oom_score_adj")
	orig := readScore(t, path)

	// Raising a score needs no privilege.
	before, err := setOOMScoreAdj(path, 500)
	if err != nil {
		t.Fatal(err)
	}
	if before != orig || readScore(t, path) != 500 {
		t.Fatalf("before=%d (want %d), now %d (want 500)", before, orig, readScore(t, path))
	}
	// Lowering it below 0 needs CAP_SYS_RESOURCE; without it (as on the machines the lab
	// runs on, whose bounding set lacks it even for root) the kernel refuses, and the error
	// says what was asked.
	before, err = setOOMScoreAdj(path, -999)
	if !hasCapSysResource(t) {
		if err == nil || !strings.Contains(err.Error(), "from 500 to -999") || readScore(t, path) != 500 {
			t.Fatalf("lowering without CAP_SYS_RESOURCE: err=%v, score %d; want the kernel's refusal and 500 kept", err, readScore(t, path))
		}
		return
	}
	if err != nil || before != 500 || readScore(t, path) != -999 {
		t.Fatalf("lowering with CAP_SYS_RESOURCE: before=%d err=%v now=%d, want 500, nil, -999", before, err, readScore(t, path))
	}
	// Out of the kernel's range: its EINVAL, with the values in the message.
	if _, err := setOOMScoreAdj(path, 1001); err == nil || !strings.Contains(err.Error(), "to 1001") {
		t.Fatalf("1001: err=%v, want the kernel's refusal", err)
	}
	if _, err := setOOMScoreAdj(filepath.Join(t.TempDir(), "none"), 0); err == nil {
		t.Fatal("a missing file: want an error")
	}
}

func readScore(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// hasCapSysResource reads this process's effective capabilities (CAP_SYS_RESOURCE is
// bit 24).
func hasCapSysResource(t *testing.T) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if hex, ok := strings.CutPrefix(line, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			return caps&(1<<24) != 0
		}
	}
	t.Fatal("no CapEff in /proc/self/status")
	return false
}
