package kmsg

// NVIDIA Xid reports: the Reader also hands on the driver's Xid lines (agent/nvidia), so
// that the agent reads the kernel log once for OOM kills and device faults alike.

import (
	"strings"
	"time"

	"github.com/coroner-dev/coroner/agent/nvidia"
)

// XidReport is an Xid report read from the kernel log.
type XidReport struct {
	Xid nvidia.Xid
	// Seq, Monotonic and HasTime are the record's; Time is the wall-clock time the
	// Reader computed from its boot time (zero when either is not known).
	Seq       uint64
	Monotonic time.Duration
	HasTime   bool
	Time      time.Time
}

// xid reads an Xid report from a kernel record: ok false when the record is none, or a
// malformed one (counted in BadXids).
func (r *Reader) xid(rec Record) (XidReport, bool) {
	if !strings.Contains(rec.Message, "NVRM: Xid") {
		return XidReport{}, false
	}
	x, ok, err := nvidia.ParseXid(rec.Message)
	if err != nil {
		r.badXids.Add(1)
		return XidReport{}, false
	}
	if !ok {
		return XidReport{}, false
	}
	rep := XidReport{Xid: x, Seq: rec.Seq, Monotonic: rec.Monotonic, HasTime: rec.HasTime}
	if rec.HasTime && !r.bootTime.IsZero() {
		rep.Time = r.bootTime.Add(rec.Monotonic)
	}
	return rep, true
}

// BadXids returns how many records looked like Xid reports but could not be read. Safe
// to call while Run runs.
func (r *Reader) BadXids() uint64 { return r.badXids.Load() }
