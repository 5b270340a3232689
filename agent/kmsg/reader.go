package kmsg

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// DevKmsg is the kernel log device.
const DevKmsg = "/dev/kmsg"

// Open opens the kernel log device (DevKmsg) for reading, non-blocking, and
// seeks to its end: a Reader over it sees only records logged from now on,
// never the OOM kills already in the ring buffer. The agent uses
// OpenFromOldest instead, to attribute kills that happened while it was not
// running.
//
// Reading /dev/kmsg needs CAP_SYSLOG when kernel.dmesg_restrict is 1. Go
// registers the descriptor with its poller, so a read waits without holding
// a thread and Close makes a waiting read return.
func Open(name string) (*os.File, error) {
	return open(name, io.SeekEnd)
}

// OpenFromOldest opens the kernel log device as Open does, but positioned at
// the oldest record still in the kernel's ring buffer (SEEK_SET 0): a Reader
// over it first reads the backlog, the OOM kills logged before it was opened
// (for instance while the agent was restarting: its kill line may be the only
// evidence of whose limit it was), then follows new records. A Reader closes
// CaughtUp once it has read the backlog.
func OpenFromOldest(name string) (*os.File, error) {
	return open(name, io.SeekStart)
}

func open(name string, whence int) (*os.File, error) {
	f, err := os.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	if _, err := f.Seek(0, whence); err != nil {
		f.Close()
		return nil, fmt.Errorf("kmsg: seeking in %s: %w", name, err)
	}
	return f, nil
}

// BootTime returns when the machine booted, as now minus the uptime in
// /proc/uptime, to turn kernel timestamps into wall-clock times.
//
// /proc/uptime counts time suspended and the kernel log's clock does not,
// and the two drift apart by a few parts per million, so times computed from
// it are good to about a second on a server that never suspends; good enough
// to order an OOM kill against a container's exit, not to match them to the
// millisecond (which is why OOM kills are matched to containers by cgroup and
// PID first).
func BootTime(now time.Time) (time.Time, error) {
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return time.Time{}, err
	}
	return ParseUptime(string(b), now)
}

// ParseUptime is BootTime on the content of /proc/uptime
// ("12345.67 23456.78").
func ParseUptime(content string, now time.Time) (time.Time, error) {
	fields := strings.Fields(content)
	if len(fields) == 0 {
		return time.Time{}, errors.New("kmsg: empty /proc/uptime")
	}
	secs, err := strconv.ParseFloat(fields[0], 64)
	if err != nil || secs < 0 || secs > 1e10 {
		return time.Time{}, fmt.Errorf("kmsg: /proc/uptime: %q is not an uptime", fields[0])
	}
	return now.Add(-time.Duration(secs * float64(time.Second))), nil
}

// Reader reads kernel log records from an io.Reader (the file Open returns,
// or any text of /dev/kmsg records or dmesg lines) and sends the OOM kills
// they report, and, with Xids set, the NVIDIA driver's Xid reports.
//
// Only kernel records are read: a /dev/kmsg record whose facility is not 0
// (kern) was written by a user-space program and is skipped, so that nothing
// can forge an OOM kill by writing to /dev/kmsg (the kernel refuses facility
// 0 to writers). dmesg lines carry no facility and are all read.
type Reader struct {
	r        io.Reader
	bootTime time.Time

	// PollInterval is how long Run waits after a read found no record
	// (EAGAIN), which only happens on a descriptor Go could not register with
	// its poller. Default 200ms.
	PollInterval time.Duration

	// BacklogIdle is how long a read of a descriptor with read deadlines
	// (/dev/kmsg registered with Go's poller) may find no record before the
	// backlog is taken as read (CaughtUp). Default 50ms.
	BacklogIdle time.Duration

	// Xids, when not nil, receives the NVIDIA Xid reports read (in the order logged),
	// beside the OOM kills on Run's out.
	Xids chan<- XidReport
	// UserSpaceXids: Xid reports in records a program wrote (a facility other than the
	// kernel's) are sent on Xids too. For emulated GPUs (the lab's test GPUs write their
	// Xid lines to /dev/kmsg); OOM kills are never read from such records.
	UserSpaceXids bool

	asm      Assembler
	badXids  atomic.Uint64
	lost     atomic.Uint64
	records  atomic.Uint64
	caughtUp chan struct{}
	upOnce   sync.Once
}

// NewReader returns a Reader of r. bootTime (see BootTime) turns kernel
// timestamps into OOMKill.Time; when zero, OOMKill.Time is left zero.
func NewReader(r io.Reader, bootTime time.Time) *Reader {
	return &Reader{r: r, bootTime: bootTime, PollInterval: 200 * time.Millisecond, BacklogIdle: 50 * time.Millisecond,
		caughtUp: make(chan struct{})}
}

// CaughtUp is closed once Run has read every record that was there when it
// started (the backlog of a descriptor from OpenFromOldest) and sent its OOM
// kills on out: when a read found no record (EAGAIN, or no record within
// BacklogIdle on a descriptor with read deadlines), at the end of the input,
// or when Run returned. A receiver that sees it closed and then drains what
// is buffered in out has every kill of the backlog.
func (r *Reader) CaughtUp() <-chan struct{} { return r.caughtUp }

func (r *Reader) markCaughtUp() { r.upOnce.Do(func() { close(r.caughtUp) }) }

// deadliner is a reader with read deadlines (an *os.File the poller knows).
type deadliner interface{ SetReadDeadline(time.Time) error }

// Lost returns how many times records were overwritten in the kernel's ring
// buffer before they could be read (EPIPE from /dev/kmsg): OOM kills in them
// are not reported. Safe to call while Run runs.
func (r *Reader) Lost() uint64 { return r.lost.Load() }

// Records returns how many records were read. Safe to call while Run runs.
func (r *Reader) Records() uint64 { return r.records.Load() }

// maxLine bounds a line without a newline (a record is at most 8 KiB).
const maxLine = 64 << 10

// Run reads until the reader ends (io.EOF: it returns nil), ctx is done (it
// returns ctx.Err()) or a read fails (it returns the error), and sends every
// OOM kill on out, in the order the kernel logged them.
//
// Records overwritten before they were read (EPIPE) are counted in Lost and
// reading goes on with the oldest record still there, as /dev/kmsg
// prescribes; a report cut in two by the loss is not joined across it.
//
// When ctx is done Run closes r if r is an io.Closer, so that a read waiting
// on /dev/kmsg returns; the caller need not close it.
func (r *Reader) Run(ctx context.Context, out chan<- OOMKill) error {
	stop := context.AfterFunc(ctx, func() {
		if c, ok := r.r.(io.Closer); ok {
			c.Close()
		}
	})
	defer stop()
	defer r.markCaughtUp()
	// While the backlog is read, every read has a deadline BacklogIdle away: a
	// read that finds no record in that time means the backlog is done.
	dl, backlog := r.r.(deadliner)
	caughtUp := func() {
		if backlog {
			backlog = false
			_ = dl.SetReadDeadline(time.Time{})
		}
		r.markCaughtUp()
	}

	emit := func(kills []OOMKill) error {
		for _, k := range kills {
			if k.HasTime && !r.bootTime.IsZero() {
				k.Time = r.bootTime.Add(k.Monotonic)
			}
			select {
			case out <- k:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}

	line1 := func(l string) error {
		kills, x, ok := r.add(l)
		if ok && r.Xids != nil {
			select {
			case r.Xids <- x:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return emit(kills)
	}

	buf := make([]byte, 16<<10) // more than a record: a smaller read fails with EINVAL
	var line []byte
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		if backlog {
			if err := dl.SetReadDeadline(time.Now().Add(r.BacklogIdle)); err != nil {
				backlog = false // no deadlines on this descriptor: EAGAIN or EOF tell
			}
		}
		n, err := r.r.Read(buf)
		if n > 0 {
			line = append(line, buf[:n]...)
			for {
				i := bytes.IndexByte(line, '\n')
				if i < 0 {
					break
				}
				if err := line1(string(line[:i])); err != nil {
					return err
				}
				line = line[i+1:]
			}
			if len(line) > maxLine {
				line = line[:0]
			}
			line = append([]byte(nil), line...) // do not pin the consumed prefix
		}
		switch {
		case err == nil:
		case errors.Is(err, syscall.EPIPE):
			r.lost.Add(1)
			line = line[:0]
			if err := emit(r.asm.Flush()); err != nil {
				return err
			}
		case errors.Is(err, os.ErrDeadlineExceeded):
			caughtUp()
		case errors.Is(err, syscall.EAGAIN):
			caughtUp()
			t := time.NewTimer(r.PollInterval)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			}
		case errors.Is(err, io.EOF):
			if len(line) > 0 {
				if err := line1(string(line)); err != nil {
					return err
				}
			}
			return emit(r.asm.Flush())
		default:
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("kmsg: reading: %w", err)
		}
	}
}

// add parses one line and feeds it to the assembler; with Xids set, an Xid report in it
// is returned too.
func (r *Reader) add(line string) (kills []OOMKill, x XidReport, xidOK bool) {
	rec, ok := ParseLine(line)
	if !ok {
		return nil, XidReport{}, false
	}
	r.records.Add(1)
	if rec.Facility > 0 {
		if r.Xids != nil && r.UserSpaceXids {
			x, xidOK = r.xid(rec)
		}
		return nil, x, xidOK
	}
	if r.Xids != nil {
		x, xidOK = r.xid(rec)
	}
	return r.asm.Add(rec), x, xidOK
}
