package kmsg

import (
	"bufio"
	"io"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Scope is what ran out of memory in an OOM kill.
type Scope int

const (
	// ScopeUnknown: the log did not say (no summary, no recognised prefix).
	ScopeUnknown Scope = iota
	// ScopeMemcg: a memory cgroup reached its limit; OOMKill.OOMMemcg says
	// which, when the summary was logged.
	ScopeMemcg
	// ScopeGlobal: the node itself: the global OOM killer
	// (CONSTRAINT_NONE), or an allocation constrained by a cpuset or a NUMA
	// memory policy (CONSTRAINT_CPUSET, CONSTRAINT_MEMORY_POLICY), which is
	// also the node's memory running out, on some NUMA nodes.
	ScopeGlobal
)

func (s Scope) String() string {
	switch s {
	case ScopeMemcg:
		return "memcg"
	case ScopeGlobal:
		return "global"
	}
	return "unknown"
}

// Kernel constraint names (mm/oom_kill.c oom_constraint_text).
const (
	ConstraintNone         = "CONSTRAINT_NONE"
	ConstraintCpuset       = "CONSTRAINT_CPUSET"
	ConstraintMemoryPolicy = "CONSTRAINT_MEMORY_POLICY"
	ConstraintMemcg        = "CONSTRAINT_MEMCG"
)

// OOMKill is one process killed by an OOM killer, with what the kernel's
// report around the kill said about it.
type OOMKill struct {
	// Seq, Monotonic and HasTime are those of the kill line's record.
	Seq       uint64
	Monotonic time.Duration
	HasTime   bool
	// Time is the wall-clock time of the kill, when the reader knew the boot
	// time (see Reader); zero otherwise. Its precision is that of the
	// kernel's clock against the wall clock: about a second, worse over
	// long uptimes.
	Time time.Time

	Scope Scope
	// Constraint is the summary's constraint, e.g. CONSTRAINT_MEMCG.
	Constraint string
	// OOMMemcg is the memory cgroup whose limit was reached (the summary's
	// oom_memcg, or "limit of" on kernels before 4.19); empty for a global
	// OOM or when not logged.
	OOMMemcg string
	// TaskMemcg is the killed task's memory cgroup (task_memcg, or "Task in"
	// on kernels before 4.19); empty when not logged.
	TaskMemcg string
	// GroupMemcg is the cgroup of a memory.oom.group kill this kill was part
	// of ("Tasks in <cgroup> are going to be killed ...").
	GroupMemcg string

	// Task is the killed task's command name, PID its PID in the root PID
	// namespace (the host's), UID its user ID (-1 when not logged).
	Task string
	PID  int
	UID  int
	// AnonRSSKB, FileRSSKB, ShmemRSSKB are the task's resident memory at the
	// kill, from the kill line.
	AnonRSSKB, FileRSSKB, ShmemRSSKB int64
	// MemcgUsageKB and MemcgLimitKB are the OOMing memory cgroup's usage and
	// limit from the report ("memory: usage NkB, limit NkB, failcnt N"),
	// zero when not logged.
	MemcgUsageKB, MemcgLimitKB int64

	// Summary reports that the report's summary line (or, before 4.19, its
	// "Task in ... killed as a result of limit of ..." line) was seen, so
	// Scope, OOMMemcg and TaskMemcg are the kernel's word rather than
	// absent or inferred from a kill line alone.
	Summary bool
}

var (
	reHeader  = regexp.MustCompile(` invoked oom-killer: `)
	reUsage   = regexp.MustCompile(`^memory: usage (\d+)kB, limit (\d+)kB, failcnt \d+`)
	reTaskIn  = regexp.MustCompile(`Task in (.+) killed as a result of limit of (.+)$`)
	reKill    = regexp.MustCompile(`^(?:(.*?): )?Kill process (\d+) \((.*?)\) score \d+ or sacrifice child`)
	reKilled  = regexp.MustCompile(`^(?:(.*?): )?Killed process (\d+) \((.*?)\)(?:,? (total-vm:.*))?$`)
	reGroup   = regexp.MustCompile(`Tasks in (.+) are going to be killed due to memory\.oom\.group set`)
	reRSS     = regexp.MustCompile(`(anon-rss|file-rss|shmem-rss):(\d+)kB`)
	reUID     = regexp.MustCompile(`UID:(\d+)`)
	summaryOn = "oom-kill:"
)

// summaryKeys are the keys of the summary line; a comma-separated piece
// that does not start with one of them continues the previous value
// (nodemask=0-2,4 and mems_allowed=0,2-4 contain commas, and so can a task
// name).
var summaryKeys = map[string]bool{
	"constraint": true, "nodemask": true, "cpuset": true, "mems_allowed": true,
	"oom_memcg": true, "task_memcg": true, "task": true, "pid": true, "uid": true,
	// An unreleased 4.19-rc spelling, harmless to understand.
	"origin_memcg": true, "kill_memcg": true,
}

// ParseSummary parses the text after "oom-kill:" of the summary line (or the
// whole message). ok is false when msg holds no summary.
func ParseSummary(msg string) (k OOMKill, ok bool) {
	i := strings.Index(msg, summaryOn)
	if i < 0 {
		return OOMKill{}, false
	}
	fields := map[string]string{}
	global := false
	last := ""
	for _, piece := range strings.Split(msg[i+len(summaryOn):], ",") {
		if key, val, found := strings.Cut(piece, "="); found && summaryKeys[key] {
			fields[key] = val
			last = key
			continue
		}
		if piece == "global_oom" {
			global = true
			last = ""
			continue
		}
		if last != "" {
			fields[last] += "," + piece
		}
	}
	k = OOMKill{
		Constraint: fields["constraint"],
		OOMMemcg:   first(fields["oom_memcg"], fields["origin_memcg"]),
		TaskMemcg:  first(fields["task_memcg"], fields["kill_memcg"]),
		Task:       fields["task"],
		UID:        -1,
		Summary:    true,
	}
	if k.OOMMemcg == "(null)" {
		k.OOMMemcg = ""
	}
	if pid, err := strconv.Atoi(strings.TrimSpace(fields["pid"])); err == nil {
		k.PID = pid
	}
	if uid, err := strconv.Atoi(strings.TrimSpace(fields["uid"])); err == nil {
		k.UID = uid
	}
	switch {
	case global, k.Constraint == ConstraintNone, k.Constraint == ConstraintCpuset, k.Constraint == ConstraintMemoryPolicy:
		k.Scope = ScopeGlobal
	case k.Constraint == ConstraintMemcg, k.OOMMemcg != "":
		k.Scope = ScopeMemcg
	}
	return k, true
}

func first(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// scopeOfPrefix reads the scope from a kill line's prefix: "Memory cgroup
// out of memory" (memcg) or "Out of memory" (global, also "Out of memory
// (oom_kill_allocating_task)").
func scopeOfPrefix(prefix string) Scope {
	switch {
	case strings.Contains(prefix, "Memory cgroup out of memory"):
		return ScopeMemcg
	case strings.Contains(prefix, "Out of memory"):
		return ScopeGlobal
	}
	return ScopeUnknown
}

// report is what the current OOM report said before its kill line.
type report struct {
	scope            Scope
	constraint       string
	oomMemcg         string
	usageKB, limitKB int64
	// killed holds the PIDs killed since the last summary, to drop the
	// kernel's second line for a group kill's first victim.
	killed            map[int]bool
	group             string
	groupAt           time.Duration
	groupHasTime      bool
	memcgInfoRecorded bool
}

// Assembler turns a stream of records into OOMKill facts, joining the lines
// of one OOM report: the summary (or "Task in" line) waits for the kill line
// that follows it, and the kills of a memory.oom.group inherit the report's
// scope and oom_memcg. Feed it records in order with Add; call Flush when the
// stream ends or records were lost. The zero value is ready to use. It is not
// safe for concurrent use.
type Assembler struct {
	rep     *report
	pending *OOMKill
}

// groupWindow is how long after a "Tasks in ... memory.oom.group" line a
// kill line is taken as part of that group kill (the kernel prints them
// back to back; the window only guards against a stale group when the next
// report's header was rate limited).
const groupWindow = time.Second

// Add feeds one record and returns the OOM kills it completed (usually none
// or one).
func (a *Assembler) Add(r Record) []OOMKill {
	msg := r.Message
	switch {
	case reHeader.MatchString(msg):
		out := a.Flush()
		a.rep = &report{}
		return out

	case strings.Contains(msg, summaryOn):
		k, _ := ParseSummary(msg)
		out := a.takePending()
		rep := a.report()
		rep.scope, rep.constraint, rep.oomMemcg = k.Scope, k.Constraint, k.OOMMemcg
		rep.group, rep.killed = "", nil
		a.pending = &k
		return out

	case reTaskIn.MatchString(msg):
		m := reTaskIn.FindStringSubmatch(msg)
		out := a.takePending()
		rep := a.report()
		rep.scope, rep.oomMemcg, rep.constraint = ScopeMemcg, m[2], ConstraintMemcg
		rep.group, rep.killed = "", nil
		a.pending = &OOMKill{Scope: ScopeMemcg, Constraint: ConstraintMemcg, OOMMemcg: m[2], TaskMemcg: m[1], UID: -1, Summary: true}
		return out

	case reUsage.MatchString(msg):
		if a.rep != nil && !a.rep.memcgInfoRecorded {
			m := reUsage.FindStringSubmatch(msg)
			a.rep.usageKB, _ = strconv.ParseInt(m[1], 10, 64)
			a.rep.limitKB, _ = strconv.ParseInt(m[2], 10, 64)
			a.rep.memcgInfoRecorded = true
		}
		return nil

	case reKill.MatchString(msg):
		// Before 4.19: "<prefix>: Kill process N (x) score S or sacrifice
		// child", then "Killed process M (y) ..." where M may be a child of N.
		m := reKill.FindStringSubmatch(msg)
		scope := scopeOfPrefix(m[1])
		rep := a.report()
		if rep.scope == ScopeUnknown {
			rep.scope = scope
		}
		if a.pending == nil {
			a.pending = &OOMKill{Scope: scope, UID: -1}
		}
		if a.pending.Scope == ScopeUnknown {
			a.pending.Scope = scope
		}
		a.pending.PID, _ = strconv.Atoi(m[2])
		a.pending.Task = m[3]
		return nil

	case reGroup.MatchString(msg):
		rep := a.report()
		rep.group = reGroup.FindStringSubmatch(msg)[1]
		rep.groupAt, rep.groupHasTime = r.Monotonic, r.HasTime
		return nil

	case reKilled.MatchString(msg):
		return a.killed(r, reKilled.FindStringSubmatch(msg))
	}
	return nil
}

func (a *Assembler) killed(r Record, m []string) []OOMKill {
	pid, err := strconv.Atoi(m[2])
	if err != nil {
		return nil
	}
	rep := a.report()
	inGroup := rep.group != "" && a.groupFresh(r)
	if inGroup && rep.killed[pid] {
		// memory.oom.group kills the whole group, the first victim
		// included: the kernel may log that victim twice.
		return nil
	}
	var k OOMKill
	switch {
	case a.pending != nil:
		// The summary, "Task in" or "Kill process" line of this kill. A
		// different PID here is a child the kernel sacrificed in place of
		// the task it chose (kernels before 4.19), taken to be in the same
		// memory cgroup, which a child almost always is.
		k = *a.pending
		a.pending = nil
	case inGroup:
		k = OOMKill{Scope: rep.scope, Constraint: rep.constraint, OOMMemcg: rep.oomMemcg, GroupMemcg: rep.group, UID: -1}
	default:
		k = OOMKill{UID: -1}
	}
	if rep.killed == nil {
		rep.killed = map[int]bool{}
	}
	rep.killed[pid] = true

	k.PID, k.Task = pid, m[3]
	if s := scopeOfPrefix(m[1]); k.Scope == ScopeUnknown {
		k.Scope = s
	}
	k.Seq, k.Monotonic, k.HasTime = r.Seq, r.Monotonic, r.HasTime
	for _, f := range reRSS.FindAllStringSubmatch(m[4], -1) {
		n, _ := strconv.ParseInt(f[2], 10, 64)
		switch f[1] {
		case "anon-rss":
			k.AnonRSSKB = n
		case "file-rss":
			k.FileRSSKB = n
		case "shmem-rss":
			k.ShmemRSSKB = n
		}
	}
	if u := reUID.FindStringSubmatch(m[4]); u != nil && k.UID < 0 {
		k.UID, _ = strconv.Atoi(u[1])
	}
	// The usage line belongs to this kill's report only when the report's
	// header came with it: not for a lone kill line whose header the kernel
	// rate limited.
	if k.Scope == ScopeMemcg && rep.memcgInfoRecorded && (k.Summary || k.GroupMemcg != "") {
		k.MemcgUsageKB, k.MemcgLimitKB = rep.usageKB, rep.limitKB
	}
	return []OOMKill{k}
}

func (a *Assembler) groupFresh(r Record) bool {
	if !r.HasTime || !a.rep.groupHasTime {
		return true
	}
	d := r.Monotonic - a.rep.groupAt
	return d >= 0 && d <= groupWindow
}

// report returns the current report, starting one when the header was not
// seen (the kernel rate limits it).
func (a *Assembler) report() *report {
	if a.rep == nil {
		a.rep = &report{}
	}
	return a.rep
}

// takePending returns the summary still waiting for its kill line as a kill
// of its own (its kill line was lost), and forgets it.
func (a *Assembler) takePending() []OOMKill {
	if a.pending == nil || (a.pending.PID == 0 && a.pending.TaskMemcg == "") {
		a.pending = nil
		return nil
	}
	k := *a.pending
	a.pending = nil
	return []OOMKill{k}
}

// Flush ends the current report: a summary whose kill line never came is
// returned as a kill of its own (without the kill line's time), and the
// next record starts afresh. Call it at the end of the stream and when
// records were lost.
func (a *Assembler) Flush() []OOMKill {
	out := a.takePending()
	a.rep = nil
	return out
}

// ParseText reads the OOM kills of a kernel log kept as text, one record per line in
// /dev/kmsg's or dmesg's format (see ParseLine), as captured from a node or kept in
// test data; lines starting with "#" are comments, lines that are not records are skipped.
func ParseText(r io.Reader) ([]OOMKill, error) {
	var a Assembler
	var out []OOMKill
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "#") {
			continue
		}
		if rec, ok := ParseLine(sc.Text()); ok {
			out = append(out, a.Add(rec)...)
		}
	}
	return append(out, a.Flush()...), sc.Err()
}
