// Package kmsg reads the kernel log and turns its OOM killer reports into
// OOMKill facts: which task was killed, in which memory cgroup, and which
// cgroup's limit (or the whole node) ran out.
//
// The kernel says which cgroup hit its limit only in its log. An OOM report
// on Linux 4.19 and later ends with a one-line summary, then the kill:
//
//	oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=<name>,mems_allowed=0,oom_memcg=/kubepods/burstable/pod<uid>,task_memcg=/kubepods/burstable/pod<uid>/<id>,task=python3,pid=4242,uid=0
//	Memory cgroup out of memory: Killed process 4242 (python3) total-vm:..kB, anon-rss:..kB, file-rss:..kB, shmem-rss:..kB, UID:0 pgtables:..kB oom_score_adj:984
//
// A global OOM (the node out of memory) says ",global_oom" instead of
// ",oom_memcg=..." and usually constraint=CONSTRAINT_NONE, and its kill line
// starts "Out of memory: Killed process". Kernels before 4.19 print
// "Task in <task memcg> killed as a result of limit of <oom memcg>" in the
// report and "Memory cgroup out of memory: Kill process N (x) score S or
// sacrifice child" then "Killed process N (x) ..." for the kill; both are
// understood. With memory.oom.group set (the kubelet sets it on cgroup v2
// container cgroups), "Tasks in <memcg> are going to be killed due to
// memory.oom.group set" follows the first kill, then one kill line per task
// of the group.
//
// The report header and the summary are rate limited by the kernel (ten per
// five seconds); the kill lines are not. Under a burst of OOMs some kills
// therefore come with no summary: such an OOMKill says whether it was a
// memory cgroup OOM or a global one (from its kill line's prefix) but not
// which cgroup.
//
// Records come from /dev/kmsg ("prio,seq,usec,flags;message", one record per
// read, continuation lines starting with a space) or from dmesg output
// ("[ 1234.567890] message"); ParseLine takes either.
package kmsg

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Record is one kernel log record.
type Record struct {
	// Level is the syslog level 0 (emerg) to 7 (debug), -1 when unknown.
	Level int
	// Facility is the syslog facility, 0 for the kernel, -1 when unknown.
	Facility int
	// Seq is the /dev/kmsg sequence number, 0 when unknown (dmesg lines).
	Seq uint64
	// Monotonic is the kernel timestamp, the time since boot on the
	// kernel's printk clock, valid when HasTime.
	Monotonic time.Duration
	HasTime   bool
	// Continued is /dev/kmsg's 'c' flag (a fragment of a continued line,
	// older kernels only).
	Continued bool
	// Message is the text, with /dev/kmsg's \xNN escapes undone.
	Message string
}

// ParseKmsg parses one /dev/kmsg record, "prio,seq,usec,flags[,...];message",
// ignoring its continuation lines (" KEY=value" dictionary entries after the
// first newline).
func ParseKmsg(rec string) (Record, error) {
	rec, _, _ = strings.Cut(rec, "\n")
	head, msg, ok := strings.Cut(rec, ";")
	if !ok {
		return Record{}, fmt.Errorf("kmsg: record without ';': %q", truncate(rec))
	}
	fields := strings.Split(head, ",")
	if len(fields) < 4 {
		return Record{}, fmt.Errorf("kmsg: record header %q has fewer than 4 fields", truncate(head))
	}
	prio, err := strconv.ParseUint(fields[0], 10, 32)
	if err != nil {
		return Record{}, fmt.Errorf("kmsg: priority %q: %w", fields[0], err)
	}
	seq, err := strconv.ParseUint(fields[1], 10, 64)
	if err != nil {
		return Record{}, fmt.Errorf("kmsg: sequence %q: %w", fields[1], err)
	}
	usec, err := strconv.ParseUint(fields[2], 10, 63)
	if err != nil || usec > uint64(maxMicros) {
		return Record{}, fmt.Errorf("kmsg: timestamp %q is not a number of microseconds", fields[2])
	}
	return Record{
		Level:     int(prio & 7),
		Facility:  int(prio >> 3),
		Seq:       seq,
		Monotonic: time.Duration(usec) * time.Microsecond,
		HasTime:   true,
		Continued: strings.Contains(fields[3], "c"),
		Message:   unescape(msg),
	}, nil
}

// maxMicros keeps Monotonic within time.Duration.
const maxMicros = int64(1<<63-1) / int64(time.Microsecond)

// dmesgLine is "[   12.345678] message", optionally after a "<6>" level
// (dmesg -r) or a "kern  :info  : " prefix (dmesg -x).
var dmesgLine = regexp.MustCompile(`^(?:<(\d+)>)?(?:[a-z]+ *:[a-z]+ *: )?\[ *(\d+)\.(\d{1,9})\] ?(.*)$`)

// ParseDmesg parses a dmesg line. A line without a "[seconds.micros]"
// timestamp is taken as a bare message (HasTime false), so journal or syslog
// lines ("... kernel: message") still yield their message.
func ParseDmesg(line string) Record {
	line = strings.TrimRight(line, "\r\n")
	r := Record{Level: -1, Facility: -1}
	m := dmesgLine.FindStringSubmatch(line)
	if m == nil {
		r.Message = line
		return r
	}
	if m[1] != "" {
		if p, err := strconv.ParseUint(m[1], 10, 32); err == nil {
			r.Level, r.Facility = int(p&7), int(p>>3)
		}
	}
	secs, err1 := strconv.ParseInt(m[2], 10, 64)
	frac := m[3] + strings.Repeat("0", 9-len(m[3]))
	nanos, err2 := strconv.ParseInt(frac, 10, 64)
	if err1 == nil && err2 == nil && secs <= int64(maxMicros)/1e6 {
		r.Monotonic = time.Duration(secs)*time.Second + time.Duration(nanos)
		r.HasTime = true
	}
	r.Message = m[4]
	return r
}

// kmsgHead recognises a /dev/kmsg record: "digits,digits,digits,".
var kmsgHead = regexp.MustCompile(`^\d+,\d+,\d+,[^;]*;`)

// ParseLine parses a /dev/kmsg record or a dmesg line, whichever it is.
// Continuation lines of /dev/kmsg records (starting with a space) are not
// records: ok is false for them and for empty lines.
func ParseLine(line string) (r Record, ok bool) {
	if line == "" || line[0] == ' ' {
		return Record{}, false
	}
	if kmsgHead.MatchString(line) {
		r, err := ParseKmsg(line)
		return r, err == nil
	}
	r = ParseDmesg(line)
	return r, r.Message != ""
}

// unescape undoes /dev/kmsg's escaping of bytes below ' ', from 127 up, and
// the backslash, as \xNN.
func unescape(s string) string {
	if !strings.Contains(s, `\x`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) && s[i+1] == 'x' {
			if n, err := strconv.ParseUint(s[i+2:i+4], 16, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func truncate(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}
