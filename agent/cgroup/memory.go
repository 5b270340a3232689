package cgroup

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
)

// Version is a cgroup version.
type Version int

const (
	V1 Version = 1
	V2 Version = 2
)

func (v Version) String() string {
	switch v {
	case V1:
		return "v1"
	case V2:
		return "v2"
	}
	return "unknown"
}

// Memory is what one cgroup's memory controller says. Counters are
// cumulative since the cgroup was created; compare two readings with Sub.
// A zero field is one the kernel does not provide on this version (see each
// field) or a file that was missing, which older kernels do.
type Memory struct {
	Version Version
	// Dir is the directory the files were read from.
	Dir string

	// Limit is the memory limit in bytes (v1 memory.limit_in_bytes, v2
	// memory.max); 0 means no limit.
	Limit int64
	// Usage is the current usage in bytes (v1 memory.usage_in_bytes, v2
	// memory.current).
	Usage int64
	// Peak is the highest usage in bytes (v1 memory.max_usage_in_bytes, v2
	// memory.peak, which needs Linux 5.19); 0 means unknown.
	Peak int64

	// OOMKill counts the processes of this cgroup killed by any OOM killer,
	// its own limit's, an ancestor's or the global one (v1 oom_kill in
	// memory.oom_control, Linux 4.13+; v2 oom_kill in memory.events).
	// HasOOMKill says whether the kernel reported it.
	OOMKill    uint64
	HasOOMKill bool

	// OOM (v2 only) counts the times this cgroup, or a cgroup below it (v2
	// events are hierarchical), reached its limit and the OOM killer ran.
	// Zero with OOMKill > 0 means the kill came from above: an ancestor's
	// limit or the global OOM killer.
	OOM uint64
	// Max (v2 only) counts the times usage was about to go over memory.max
	// (reclaim usually succeeds, so Max > 0 alone is no OOM).
	Max uint64
	// OOMGroupKill (v2 only, Linux 5.16+) counts group kills (memory.oom.group).
	OOMGroupKill uint64

	// UnderOOM (v1 only) is memory.oom_control's under_oom: the cgroup is
	// in OOM right now.
	UnderOOM bool
	// FailCnt (v1 only) is memory.failcnt: the times usage hit the limit
	// (reclaim usually follows, so FailCnt > 0 alone is no OOM).
	FailCnt uint64
}

// ErrNoMemoryController is wrapped when a cgroup directory exists but has no
// memory controller files (v2 without the memory controller enabled there).
var ErrNoMemoryController = errors.New("no memory controller files in cgroup")

// Detect finds the directory of cgroupPath's memory controller under root
// (usually /sys/fs/cgroup) and its version, looking in this order:
//
//  1. root/cgroupPath/memory.events: v2 (the unified hierarchy at root);
//  2. root/cgroupPath/memory.oom_control: v1, root being the memory
//     hierarchy itself (e.g. root=/sys/fs/cgroup/memory);
//  3. root/memory/cgroupPath/memory.oom_control: v1 under the usual
//     controller directory, which is also what a hybrid host (the lab's:
//     /sys/fs/cgroup a tmpfs with v1 controllers and a v2 "unified" tree
//     without controllers) has.
//
// The version is decided per path, so one agent works on v1, v2 and hybrid
// hosts. When none exists the error wraps fs.ErrNotExist: the cgroup is gone
// (the runtime removes a container's cgroup soon after it exits) or the path
// is wrong.
func Detect(root, cgroupPath string) (Version, string, error) {
	rel := filepath.FromSlash(strings.TrimPrefix(path.Clean("/"+cgroupPath), "/"))
	candidates := []struct {
		v    Version
		dir  string
		file string
	}{
		{V2, filepath.Join(root, rel), "memory.events"},
		{V1, filepath.Join(root, rel), "memory.oom_control"},
		{V1, filepath.Join(root, "memory", rel), "memory.oom_control"},
	}
	for _, c := range candidates {
		if _, err := os.Stat(filepath.Join(c.dir, c.file)); err == nil {
			return c.v, c.dir, nil
		}
	}
	for _, c := range candidates {
		if st, err := os.Stat(c.dir); err == nil && st.IsDir() {
			return 0, c.dir, fmt.Errorf("cgroup %s under %s: %w", cgroupPath, root, ErrNoMemoryController)
		}
	}
	return 0, "", fmt.Errorf("cgroup %s under %s: %w", cgroupPath, root, fs.ErrNotExist)
}

// Read reads the memory controller of cgroupPath under root (see Detect for
// where it looks). Files that some kernels lack (v2's memory.peak, before
// Linux 5.19; the oom_kill key of v1's memory.oom_control, before 4.13) are
// skipped and leave their fields zero; a file every kernel has that is
// missing means the cgroup is being removed, and is an error wrapping
// fs.ErrNotExist, as is a marker file gone after the reads; a file with
// content that does not parse is an error.
func Read(root, cgroupPath string) (Memory, error) {
	v, dir, err := Detect(root, cgroupPath)
	if err != nil {
		return Memory{}, err
	}
	m := Memory{Version: v, Dir: dir}
	if v == V2 {
		err = readV2(dir, &m)
	} else {
		err = readV1(dir, &m)
	}
	if err != nil {
		return Memory{}, fmt.Errorf("cgroup %s: %w", cgroupPath, err)
	}
	// A cgroup removed during the reads (the runtime removes a container's cgroup right
	// after its exit) must not read as limit 0, failcnt 0, peak 0, which looks like "the
	// limit was never reached" (a limit OOM then passes for a node OOM). The kernel's
	// rmdir removes the controller's files first (kill_css -> css_clear_dir), then the
	// directory (kernfs_remove): a reader between the two can find memory.oom_control,
	// then no memory.failcnt, with the directory still there. (Suspected, not caught, in
	// bench-beside's OOM kills left unplaced on the lab, cgroup v1: the window is short.)
	// So a file every kernel has that is missing is an error (the readers), and
	// the marker file Detect found must still be there after the reads: it was there
	// during them, and so were the files read before it went.
	marker := "memory.oom_control"
	if v == V2 {
		marker = "memory.events"
	}
	if _, err := os.Stat(filepath.Join(dir, marker)); err != nil {
		return Memory{}, fmt.Errorf("cgroup %s removed while it was read: %w", cgroupPath, err)
	}
	return m, nil
}

// unlimitedV1 is the smallest value read as "no limit" in v1's
// limit_in_bytes, which says 9223372036854771712 (PAGE_COUNTER_MAX pages)
// when unlimited.
const unlimitedV1 = int64(1) << 62

func readV1(dir string, m *Memory) error {
	kv, ok, err := readKeyValues(filepath.Join(dir, "memory.oom_control"))
	if err != nil {
		return err
	}
	if ok {
		if n, has := kv["oom_kill"]; has {
			m.OOMKill, m.HasOOMKill = n, true
		}
		m.UnderOOM = kv["under_oom"] != 0
	}
	if !ok {
		return fmt.Errorf("memory.oom_control: %w (the cgroup is being removed)", fs.ErrNotExist)
	}
	for _, f := range []struct {
		name string
		dst  *int64
	}{
		{"memory.limit_in_bytes", &m.Limit},
		{"memory.usage_in_bytes", &m.Usage},
		{"memory.max_usage_in_bytes", &m.Peak},
	} {
		if err := readInt(filepath.Join(dir, f.name), f.dst, true); err != nil {
			return err
		}
	}
	if m.Limit >= unlimitedV1 {
		m.Limit = 0
	}
	var failcnt int64
	if err := readInt(filepath.Join(dir, "memory.failcnt"), &failcnt, true); err != nil {
		return err
	}
	m.FailCnt = uint64(failcnt)
	return nil
}

func readV2(dir string, m *Memory) error {
	kv, ok, err := readKeyValues(filepath.Join(dir, "memory.events"))
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("memory.events: %w (the cgroup is being removed)", fs.ErrNotExist)
	}
	if n, has := kv["oom_kill"]; has {
		m.OOMKill, m.HasOOMKill = n, true
	}
	m.OOM, m.Max, m.OOMGroupKill = kv["oom"], kv["max"], kv["oom_group_kill"]
	for _, f := range []struct {
		name     string
		dst      *int64
		required bool
	}{
		{"memory.max", &m.Limit, true}, // "max" reads as 0: no limit
		{"memory.current", &m.Usage, true},
		{"memory.peak", &m.Peak, false}, // Linux 5.19+
	} {
		if err := readInt(filepath.Join(dir, f.name), f.dst, f.required); err != nil {
			return err
		}
	}
	return nil
}

// readInt reads a file holding one integer, or "max" (read as 0). A missing
// file leaves dst alone, or, when required (every kernel has it), is an error
// wrapping fs.ErrNotExist: the cgroup is being removed.
func readInt(name string, dst *int64, required bool) error {
	b, err := os.ReadFile(name)
	if errors.Is(err, fs.ErrNotExist) {
		if required {
			return fmt.Errorf("%s: %w (the cgroup is being removed)", filepath.Base(name), err)
		}
		return nil
	}
	if err != nil {
		return err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		*dst = 0
		return nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		// v1 can say 18446744073709551615 in some files of some kernels.
		if u, uerr := strconv.ParseUint(s, 10, 64); uerr == nil && u > math.MaxInt64 {
			*dst = math.MaxInt64
			return nil
		}
		return fmt.Errorf("%s: %q is not a number", filepath.Base(name), s)
	}
	*dst = n
	return nil
}

// PageCache returns the page cache charged to the memory cgroup directory dir of
// version v and to the cgroups below it, in bytes: memory.stat's total_cache on v1
// (hierarchical), file on v2 (hierarchical there). The agent does not need it; the lab's
// OOM squeeze does (it lowers a limit below what reclaim can give back).
func PageCache(v Version, dir string) (int64, error) {
	kv, ok, err := readKeyValues(filepath.Join(dir, "memory.stat"))
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, fmt.Errorf("%s: no memory.stat: %w", dir, fs.ErrNotExist)
	}
	key := "total_cache"
	if v == V2 {
		key = "file"
	}
	return int64(kv[key]), nil
}

// readKeyValues reads a flat-keyed file ("key value" lines, as
// memory.events and memory.oom_control are). ok is false when the file is
// missing.
func readKeyValues(name string) (kv map[string]uint64, ok bool, err error) {
	f, err := os.Open(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	defer f.Close()
	kv = map[string]uint64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		k, v, found := strings.Cut(line, " ")
		if !found {
			return nil, false, fmt.Errorf("%s: line %q is not \"key value\"", filepath.Base(name), line)
		}
		n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		if err != nil {
			return nil, false, fmt.Errorf("%s: line %q: %w", filepath.Base(name), line, err)
		}
		kv[k] = n
	}
	if err := sc.Err(); err != nil {
		return nil, false, err
	}
	return kv, true, nil
}

// Delta is how a cgroup's memory event counters moved between two readings
// (Sub), the OOM evidence of the container's life when the first reading is
// from its start (or zero) and the second from its exit.
type Delta struct {
	Version Version
	// OOMKill: processes of the cgroup killed by any OOM killer.
	OOMKill uint64
	// HasOOMKill: the kernel reports OOMKill (v1 needs Linux 4.13).
	HasOOMKill bool
	// OOM (v2): OOMs at this cgroup's limit or below it.
	OOM uint64
	// Max (v2): usage about to go over memory.max.
	Max uint64
	// OOMGroupKill (v2): memory.oom.group kills.
	OOMGroupKill uint64
	// FailCnt (v1): usage hit the limit.
	FailCnt uint64
}

// Sub returns the counters' change from before to after, two readings of the
// same cgroup. A counter that went down means the cgroup was re-created
// between the readings (a new container with the same path), so after's
// value is the change. Pass a zero before for "since creation".
func Sub(before, after Memory) Delta {
	d := func(b, a uint64) uint64 {
		if a < b {
			return a
		}
		return a - b
	}
	return Delta{
		Version:      after.Version,
		OOMKill:      d(before.OOMKill, after.OOMKill),
		HasOOMKill:   after.HasOOMKill,
		OOM:          d(before.OOM, after.OOM),
		Max:          d(before.Max, after.Max),
		OOMGroupKill: d(before.OOMGroupKill, after.OOMGroupKill),
		FailCnt:      d(before.FailCnt, after.FailCnt),
	}
}
