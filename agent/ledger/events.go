package ledger

// The runtime's events: Observe takes an event's identity, Record what was read of the
// container's cgroups at it, and the merges keep what each event adds to what was known.

import (
	"path"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/coroner-dev/coroner/agent/cgroup"
	"github.com/coroner-dev/coroner/agent/classify"
	"github.com/coroner-dev/coroner/cri"
)

// Seen is what Observe hands back: the container's and its pod's memory cgroups, as the
// kernel prints them, to read ("" when unknown), and whether the container is new.
type Seen struct {
	Cgroup, PodCgroup string
	First             bool
}

// Reading is what the caller read of a container's cgroups at one of its events: the
// container's and the pod's memory controllers (nil: not read, or gone) and the
// container's cgroup.procs.
type Reading struct {
	Mem, Pod *cgroup.Memory
	PIDs     []int
}

// Observe records a runtime event's identity, the first step of every event: it creates
// the container when it is new, keeps what the event adds to what was known (mergeEvent,
// the runtime's PID) and, when the event first gives the container's cgroup, joins the
// evidence read before to it (joinLocked). logger says what the join taught.
func (l *Ledger) Observe(ev cri.ContainerEvent, logger klog.Logger) Seen {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.containers[ev.ContainerID]
	first := c == nil
	if c == nil {
		c = &container{}
		l.containers[ev.ContainerID] = c
	}
	c.ev = mergeEvent(c.ev, ev)
	if ev.PID > 0 {
		c.runtimePID = ev.PID
	}
	if c.cgroup == "" && ev.CgroupPath != "" {
		c.cgroup, c.podCgroup = cgroupPaths(ev.CgroupPath)
		l.joinLocked(logger)
	}
	return Seen{Cgroup: c.cgroup, PodCgroup: c.podCgroup, First: first}
}

// Reads reports whether an event of kind k is recorded with a reading of the cgroups
// (Record): Started, OOM and Exited. Other events only say who the container is.
func Reads(k cri.Kind) bool {
	return k == cri.Started || k == cri.OOM || k == cri.Exited
}

// Record records a Started, OOM or Exited event with the cgroups read at it, after
// Observe (first is its Seen.First), and says what is to be classified: the exit (Exit)
// of an Exited event; OOM events (OOM) of an OOM event whose exit is not classified yet,
// or of a container first seen running whose own cgroup has counted an OOM kill. ok is
// false when there is nothing to classify.
func (l *Ledger) Record(ev cri.ContainerEvent, first bool, now time.Time, r Reading) (kind Item, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch ev.Kind {
	case cri.Started:
		return OOM, l.startedLocked(ev, now, r, first)
	case cri.OOM:
		return OOM, l.oomEventLocked(ev, now, r)
	case cri.Exited:
		l.exitedLocked(ev, r)
		return Exit, true
	}
	return 0, false
}

// startedLocked records a Started event. It reports whether the container, first seen
// now, had already had a process OOM-killed: its own cgroup counted one, which is then an
// OOM event of its own to classify. l.mu is held.
func (l *Ledger) startedLocked(ev cri.ContainerEvent, now time.Time, r Reading, first bool) (missedOOM bool) {
	l.observeLocked(ev, classify.ContainerState{Name: ev.ContainerName, State: classify.StateRunning,
		ContainerID: ev.ContainerID, StartedAt: ev.StartedAt})
	c := l.containers[ev.ContainerID]
	if c == nil {
		return false // expired since Observe: nothing is left to classify
	}
	c.pids = mergePIDs(c.pids, r.PIDs)
	if r.Mem != nil {
		c.procCount = len(r.PIDs)
	}
	if c.podAtStart == nil {
		c.podAtStart = r.Pod
	}
	// A container first seen running whose own cgroup has already counted an OOM kill
	// (its counters start at 0 with it) was OOM-killed, in a process that was not its
	// main one, while nobody was looking: the agent was not running yet, or its runtime
	// watch was cut.
	missedOOM = first && r.Mem != nil && oomCounted(*r.Mem)
	if missedOOM {
		c.last = r.Mem
		c.ooms = append(c.ooms, now)
		c.replay = true
	}
	return missedOOM
}

// oomEventLocked records containerd's OOM event. It reports whether the OOM event is to
// be classified: not when the exit is classified already. l.mu is held.
func (l *Ledger) oomEventLocked(ev cri.ContainerEvent, now time.Time, r Reading) bool {
	c := l.containers[ev.ContainerID]
	if c == nil {
		return false
	}
	c.ooms = append(c.ooms, nonZero(ev.OOMAt, now))
	c.record(r)
	return !c.exitDone
}

// exitedLocked records an Exited event. l.mu is held.
func (l *Ledger) exitedLocked(ev cri.ContainerEvent, r Reading) {
	if c := l.containers[ev.ContainerID]; c != nil {
		e := ev
		c.exit = &e
		c.record(r)
	}
	l.observeLocked(ev, classify.ContainerState{Name: ev.ContainerName, State: classify.StateExited,
		ExitCode: ev.ExitCode, FinishedAt: ev.FinishedAt, ContainerID: ev.ContainerID, Reason: ev.Reason,
		StartedAt: ev.StartedAt, Attempt: int32(ev.Attempt)})
}

// record keeps a reading at an OOM event or the exit. The ledger's lock is held.
func (c *container) record(r Reading) {
	c.pids = mergePIDs(c.pids, r.PIDs)
	if r.Mem != nil {
		c.last = r.Mem
	}
	if r.Pod != nil {
		c.podLast = r.Pod
	}
}

// observeLocked records a container's state for its pod, unless a later attempt of the
// same container is known. l.mu is held.
func (l *Ledger) observeLocked(ev cri.ContainerEvent, st classify.ContainerState) {
	uid := types.UID(ev.PodUID)
	m := l.observed[uid]
	if m == nil {
		m = map[string]observedState{}
		l.observed[uid] = m
	}
	if old, ok := m[ev.ContainerName]; ok && old.attempt > ev.Attempt {
		return
	}
	m[ev.ContainerName] = observedState{attempt: ev.Attempt, state: st}
}

// oomCounted reports whether a cgroup's counters show an OOM kill of one of its
// processes since the cgroup was created.
func oomCounted(m cgroup.Memory) bool {
	return m.OOMKill > 0 || m.OOMGroupKill > 0 || m.Version == cgroup.V2 && m.OOM > 0
}

// mergeEvent keeps what an earlier event knew that a later one does not.
func mergeEvent(old, ev cri.ContainerEvent) cri.ContainerEvent {
	if ev.CgroupPath == "" {
		ev.CgroupPath = old.CgroupPath
	}
	if ev.MemoryLimit == 0 {
		ev.MemoryLimit = old.MemoryLimit
	}
	if ev.StartedAt.IsZero() {
		ev.StartedAt = old.StartedAt
	}
	if ev.SandboxID == "" {
		ev.SandboxID = old.SandboxID
	}
	if ev.PID == 0 {
		ev.PID = old.PID
	}
	return ev
}

// cgroupPaths turns the runtime's cgroupsPath (cgroupfs path, or systemd
// "slice:prefix:name") into the container's and the pod's cgroup paths as the kernel
// prints them.
func cgroupPaths(runtimePath string) (containerCg, podCg string) {
	p, err := cgroup.FromSystemd(runtimePath)
	if err != nil {
		p = path.Clean("/" + runtimePath)
	}
	pp := cgroup.ParsePath(p)
	podCg = pp.Pod
	if podCg == "" && p != "/" {
		podCg = path.Dir(p)
	}
	return p, podCg
}

// mergePIDs adds new PIDs (not 0), keeping at most 64 (a container's main process
// comes first).
func mergePIDs(have, more []int) []int {
	for _, p := range more {
		if p <= 0 {
			continue
		}
		found := false
		for _, h := range have {
			if h == p {
				found = true
				break
			}
		}
		if !found && len(have) < 64 {
			have = append(have, p)
		}
	}
	return have
}

func nonZero(t, fallback time.Time) time.Time {
	if t.IsZero() {
		return fallback
	}
	return t
}
