package kmsg

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"
	"time"
)

// backlogDevice is a fake /dev/kmsg opened at its oldest record, with read
// deadlines as Go's poller gives them: the records of the backlog come at once;
// then a read waits until its deadline (os.ErrDeadlineExceeded) or, without one,
// for a record added later or the device closed.
type backlogDevice struct {
	mu        sync.Mutex
	records   []string
	deadline  time.Time
	deadlines int
	added     chan struct{}
	closed    chan struct{}
}

func newBacklogDevice(records ...string) *backlogDevice {
	return &backlogDevice{records: records, added: make(chan struct{}, 10), closed: make(chan struct{})}
}

func (d *backlogDevice) SetReadDeadline(t time.Time) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.deadline = t
	if !t.IsZero() {
		d.deadlines++
	}
	return nil
}

func (d *backlogDevice) add(rec string) {
	d.mu.Lock()
	d.records = append(d.records, rec)
	d.mu.Unlock()
	d.added <- struct{}{}
}

func (d *backlogDevice) Close() error { close(d.closed); return nil }

func (d *backlogDevice) Read(p []byte) (int, error) {
	for {
		d.mu.Lock()
		if len(d.records) > 0 {
			n := copy(p, d.records[0])
			d.records = d.records[1:]
			d.mu.Unlock()
			return n, nil
		}
		var timeout <-chan time.Time
		if !d.deadline.IsZero() {
			timeout = time.After(time.Until(d.deadline))
		}
		d.mu.Unlock()
		select {
		case <-timeout:
			return 0, os.ErrDeadlineExceeded
		case <-d.added:
		case <-d.closed:
			return 0, os.ErrClosed
		}
	}
}

// TestReaderBacklogCaughtUp: a Reader over a device opened at its oldest record
// sends the kills of the backlog, with their wall-clock times, and only then closes
// CaughtUp; it goes on reading new records afterwards, without deadlines.
func TestReaderBacklogCaughtUp(t *testing.T) {
	boot := time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)
	summary := "6,10,1000000,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/kubepods/pod" + uid1 +
		",task_memcg=/kubepods/pod" + uid1 + "/" + cid1 + ",task=x,pid=7,uid=0\n"
	kill := func(seq, usec, pid string) string {
		return "3," + seq + "," + usec + ",-;Memory cgroup out of memory: Killed process " + pid + " (x) total-vm:1kB, anon-rss:1kB, file-rss:0kB, shmem-rss:0kB, UID:0\n"
	}
	dev := newBacklogDevice(summary, kill("11", "1000100", "7"), kill("12", "5000000", "8"))
	rd := NewReader(dev, boot)
	rd.BacklogIdle = 20 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := make(chan OOMKill, 10)
	done := make(chan error, 1)
	go func() { done <- rd.Run(ctx, out) }()

	select {
	case <-rd.CaughtUp():
	case <-time.After(5 * time.Second):
		t.Fatal("CaughtUp not closed after the backlog")
	}
	// Every kill of the backlog is buffered by the time CaughtUp is closed.
	if len(out) != 2 {
		t.Fatalf("%d kills buffered when CaughtUp closed, want the backlog's 2", len(out))
	}
	first := <-out
	if first.PID != 7 || first.OOMMemcg == "" || !first.Time.Equal(boot.Add(1000100*time.Microsecond)) {
		t.Errorf("first backlog kill = %+v, want pid 7 with its oom_memcg at boot+1.0001s", first)
	}
	if second := <-out; second.PID != 8 || !second.Time.Equal(boot.Add(5*time.Second)) {
		t.Errorf("second backlog kill = %+v, want pid 8 at boot+5s", second)
	}

	// After the backlog: no deadline any more, new records still come.
	time.Sleep(3 * rd.BacklogIdle)
	dev.add(kill("13", "9000000", "9"))
	select {
	case k := <-out:
		if k.PID != 9 {
			t.Errorf("kill after the backlog = %+v, want pid 9", k)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a record logged after the backlog was not read")
	}
	dev.mu.Lock()
	if !dev.deadline.IsZero() {
		t.Errorf("a read deadline is left after the backlog: %v", dev.deadline)
	}
	dev.mu.Unlock()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Run() = %v, want context.Canceled", err)
	}
}

// TestReaderCaughtUpWithoutDeadlines: a plain reader (no deadlines) is caught up at
// its end, and CaughtUp is closed when Run returns however it ended.
func TestReaderCaughtUpWithoutDeadlines(t *testing.T) {
	rd := NewReader(&kmsgDevice{steps: []any{"[ 9.0] Out of memory: Killed process 5 (x)\n"}}, time.Time{})
	if _, err := run(t, rd); err != nil {
		t.Fatal(err)
	}
	select {
	case <-rd.CaughtUp():
	default:
		t.Error("CaughtUp not closed at the end of the input")
	}
}
