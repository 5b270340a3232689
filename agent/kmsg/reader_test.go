package kmsg

import (
	"bufio"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// run runs a Reader over r to the end and returns what it sent.
func run(t *testing.T, rd *Reader) ([]OOMKill, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out := make(chan OOMKill)
	done := make(chan error, 1)
	go func() { done <- rd.Run(ctx, out); close(out) }()
	var got []OOMKill
	for k := range out {
		got = append(got, k)
	}
	return got, <-done
}

// kmsgDevice is a fake /dev/kmsg: each Read returns one record, or the
// error scripted at that position.
type kmsgDevice struct {
	steps []any // string record or error
}

func (d *kmsgDevice) Read(p []byte) (int, error) {
	if len(d.steps) == 0 {
		return 0, io.EOF
	}
	s := d.steps[0]
	d.steps = d.steps[1:]
	switch s := s.(type) {
	case error:
		return 0, s
	case string:
		if len(s) > len(p) {
			return 0, syscall.EINVAL
		}
		return copy(p, s), nil
	}
	panic("bad step")
}

func records(t *testing.T, file string) []any {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", file))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := f.Close(); err != nil {
			t.Error(err)
		}
	}()
	// Join continuation lines to their record, as /dev/kmsg returns them.
	var steps []any
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text() + "\n"
		if strings.HasPrefix(line, " ") && len(steps) > 0 {
			steps[len(steps)-1] = steps[len(steps)-1].(string) + line
			continue
		}
		steps = append(steps, line)
	}
	return steps
}

func TestReaderOverFiles(t *testing.T) {
	boot := time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)
	withTime := func(ks []OOMKill) []OOMKill {
		for i := range ks {
			ks[i].Time = boot.Add(ks[i].Monotonic)
		}
		return ks
	}

	t.Run("captured kmsg, one record per read, wall-clock times from the boot time", func(t *testing.T) {
		rd := NewReader(&kmsgDevice{steps: records(t, "kmsg-v1-cgroupfs-linux-6.18.txt")}, boot)
		got, err := run(t, rd)
		if err != nil {
			t.Fatalf("Run() = %v", err)
		}
		if diff := cmp.Diff(withTime(capturedV1(true)), got); diff != "" {
			t.Errorf("kills mismatch (-want +got):\n%s", diff)
		}
		if rd.Records() != 310 || rd.Lost() != 0 {
			t.Errorf("Records() = %d, Lost() = %d; want 310, 0", rd.Records(), rd.Lost())
		}
	})

	t.Run("captured dmesg through a plain file, reads across lines, no boot time", func(t *testing.T) {
		f, err := os.Open(filepath.Join("testdata", "dmesg-v1-cgroupfs-linux-6.18.txt"))
		if err != nil {
			t.Fatal(err)
		}
		got, err := run(t, NewReader(f, time.Time{}))
		if err != nil {
			t.Fatalf("Run() = %v", err)
		}
		if diff := cmp.Diff(capturedV1(false), got); diff != "" {
			t.Errorf("kills mismatch (-want +got):\n%s", diff)
		}
	})

	t.Run("last line without a newline", func(t *testing.T) {
		in := "[ 9.000000] Out of memory: Killed process 5 (x) total-vm:1kB, anon-rss:1kB, file-rss:0kB, shmem-rss:0kB, UID:0"
		got, err := run(t, NewReader(strings.NewReader(in), time.Time{}))
		if err != nil || len(got) != 1 || got[0].PID != 5 || got[0].Scope != ScopeGlobal {
			t.Errorf("Run() = %+v, %v; want one global kill of pid 5", got, err)
		}
	})
}

func TestReaderLostRecordsAndRetries(t *testing.T) {
	summary := "6,10,1000000,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/kubepods/pod" + uid1 +
		",task_memcg=/kubepods/pod" + uid1 + "/" + cid1 + ",task=x,pid=7,uid=0\n"
	kill := func(seq, pid string) string {
		return "3," + seq + ",2000000,-;Memory cgroup out of memory: Killed process " + pid + " (x) total-vm:1kB, anon-rss:1kB, file-rss:0kB, shmem-rss:0kB, UID:0\n"
	}
	dev := &kmsgDevice{steps: []any{
		summary,
		&os.PathError{Op: "read", Path: "/dev/kmsg", Err: syscall.EPIPE}, // the kill line of pid 7 was overwritten
		kill("20", "8"),
		syscall.EAGAIN,
		"12,21,2000001,-;" + strings.TrimPrefix(kill("21", "9"), "3,21,2000000,-;"), // user space forging a kill
		kill("22", "10"),
	}}
	rd := NewReader(dev, time.Time{})
	rd.PollInterval = time.Millisecond
	got, err := run(t, rd)
	if err != nil {
		t.Fatalf("Run() = %v", err)
	}
	var pids []int
	for _, k := range got {
		pids = append(pids, k.PID)
	}
	// 7 from the flushed summary (no kill time), then 8 and 10 without the
	// summary's context; 9 was written by user space and is ignored.
	if diff := cmp.Diff([]int{7, 8, 10}, pids); diff != "" {
		t.Errorf("pids mismatch (-want +got):\n%s", diff)
	}
	if got[0].OOMMemcg == "" || got[0].HasTime {
		t.Errorf("flushed summary = %+v, want its oom_memcg and no kill time", got[0])
	}
	if got[1].OOMMemcg != "" || got[1].Summary {
		t.Errorf("kill after the loss = %+v, want no context from before the loss", got[1])
	}
	if rd.Lost() != 1 || rd.Records() != 4 {
		t.Errorf("Lost() = %d, Records() = %d; want 1, 4", rd.Lost(), rd.Records())
	}
}

func TestReaderErrors(t *testing.T) {
	boom := errors.New("boom")
	_, err := run(t, NewReader(&kmsgDevice{steps: []any{boom}}, time.Time{}))
	if !errors.Is(err, boom) {
		t.Errorf("Run() = %v, want an error wrapping %v", err, boom)
	}
}

func TestReaderStopsWhenContextIsDone(t *testing.T) {
	pr, pw := io.Pipe() // a read that blocks until closed, like /dev/kmsg
	defer func() { _ = pw.Close() }()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- NewReader(pr, time.Time{}).Run(ctx, make(chan OOMKill)) }()
	time.Sleep(10 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Run() = %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run() did not return after the context was canceled")
	}
}

func TestReaderStopsWhileSending(t *testing.T) {
	in := "[ 9.0] Out of memory: Killed process 5 (x)\n"
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- NewReader(strings.NewReader(in), time.Time{}).Run(ctx, make(chan OOMKill)) }() // nobody receives
	time.Sleep(10 * time.Millisecond)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Run() = %v, want context.Canceled", err)
	}
}

// TestDevice reads the real /dev/kmsg: Open seeks to the end, a record
// written by user space arrives (and makes no kill), and canceling the
// context stops a read that waits for the next record. It writes one line to
// the host's kernel log, so it runs only with CORONER_KMSG_DEVICE_TEST=1 (as
// root). The line is deliberately not shaped like an OOM kill, so that no
// other tool reading the host's log is misled; TestReaderLostRecordsAndRetries
// covers a forged one.
func TestDevice(t *testing.T) {
	if os.Getenv("CORONER_KMSG_DEVICE_TEST") != "1" {
		t.Skip("set CORONER_KMSG_DEVICE_TEST=1 to read and write the real /dev/kmsg")
	}
	f, err := Open(DevKmsg)
	if err != nil {
		t.Fatalf("Open() = %v", err)
	}
	boot, err := BootTime(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	rd := NewReader(f, boot)
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan OOMKill, 1)
	done := make(chan error, 1)
	go func() { done <- rd.Run(ctx, out) }()

	w, err := os.OpenFile(DevKmsg, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Facility 1 (user), level 6.
	if _, err := w.WriteString("<14>coroner kmsg device test\n"); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}

	// From the oldest record: the line just written is in the backlog, and the
	// backlog is read to its end (CaughtUp) without waiting for a new record.
	old, err := OpenFromOldest(DevKmsg)
	if err != nil {
		t.Fatalf("OpenFromOldest() = %v", err)
	}
	ord := NewReader(old, boot)
	octx, ocancel := context.WithCancel(context.Background())
	odone := make(chan error, 1)
	go func() { odone <- ord.Run(octx, make(chan OOMKill, 4096)) }()
	select {
	case <-ord.CaughtUp():
		if ord.Records() == 0 {
			t.Error("OpenFromOldest: no record in the backlog, not even the one just written")
		}
		t.Logf("backlog: %d records", ord.Records())
	case <-time.After(10 * time.Second):
		t.Error("OpenFromOldest: the backlog was not read to its end within 10s")
	}
	ocancel()
	if err := <-odone; !errors.Is(err, context.Canceled) {
		t.Errorf("OpenFromOldest: Run() = %v, want context.Canceled", err)
	}

	deadline := time.Now().Add(5 * time.Second)
	for rd.Records() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if rd.Records() == 0 {
		t.Errorf("no record read from %s after writing one", DevKmsg)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Run() = %v, want context.Canceled", err)
	}
	select {
	case k := <-out:
		t.Errorf("a user-space record was reported as a kill: %+v", k)
	default:
	}
}
