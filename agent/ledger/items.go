package ledger

// A work item's course through the ledger (an exit, or OOM events, of one container):
// pending, waiting for its pod, snapshot for its classification, waiting once for late
// evidence, then claimed (or dropped).

import (
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/coroner-dev/coroner/agent/cgroup"
	"github.com/coroner-dev/coroner/agent/classify"
	"github.com/coroner-dev/coroner/cri"
)

// Snapshot is a value copy of what the ledger knows about a container, for classifying
// one of its items: ClassifyOOM's facts, and whether the item has waited for late
// evidence already (KernelWait).
type Snapshot struct {
	Facts        classify.OOMFacts
	KernelWaited bool
}

// ExitClaim is what FinishExit hands the caller that classified an exit: the Exited
// event, whether it is from before the agent started (Replay), and whether its UnknownOOM
// verdict is to be counted.
type ExitClaim struct {
	Exit         cri.ContainerEvent
	Replay       bool
	CountUnknown bool
}

// OOMClaim is what FinishOOM hands the caller that classified OOM events: the times of
// the first and the last not classified before, and whether the UnknownOOM verdict is to
// be counted.
type OOMClaim struct {
	First, Last  time.Time
	CountUnknown bool
}

// Pending returns the container's last event (its identity) when the item has work left:
// an exit not classified yet, OOM events not classified and no exit classified.
func (l *Ledger) Pending(id string, kind Item) (cri.ContainerEvent, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.containers[id]
	switch {
	case c == nil,
		kind == Exit && (c.exit == nil || c.exitDone),
		kind == OOM && (c.exitDone || c.oomHandled >= len(c.ooms)):
		return cri.ContainerEvent{}, false
	}
	return c.ev, true
}

// AwaitPod records that an item missed its pod in the cache: it returns when it first
// did (now, the first time) and whether the API server has confirmed the pod is this
// node's (PodConfirmed).
func (l *Ledger) AwaitPod(id string, kind Item, now time.Time) (first time.Time, confirmed bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.containers[id]
	if c == nil {
		return now, false
	}
	if c.podWait[kind].IsZero() {
		c.podWait[kind] = now
	}
	return c.podWait[kind], c.podChecked
}

// PodConfirmed records that the API server said the container's pod exists on this node.
func (l *Ledger) PodConfirmed(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c := l.containers[id]; c != nil {
		c.podChecked = true
	}
}

// Drop gives up on an item: the exit counts as done, or the OOM events as handled; with
// forgetPod the runtime's states of the container's pod are forgotten too (the pod is
// gone, or not this node's).
func (l *Ledger) Drop(id string, kind Item, now time.Time, forgetPod bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.containers[id]
	if c == nil {
		return
	}
	switch kind {
	case Exit:
		c.exitDone, c.doneAt = true, now
	case OOM:
		c.oomHandled = len(c.ooms)
	}
	if c.exitDone && c.doneAt.IsZero() {
		c.doneAt = now
	}
	if forgetPod {
		delete(l.observed, types.UID(c.ev.PodUID))
	}
}

// Snapshot copies what the node knows about a container for ClassifyOOM (for an exit,
// with the exit's code, reason and time), and whether the item has waited for late
// evidence.
func (l *Ledger) Snapshot(id string, kind Item) (Snapshot, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.containers[id]
	if c == nil {
		return Snapshot{}, false
	}
	return Snapshot{Facts: l.factsLocked(c, kind), KernelWaited: c.kernelWaited[kind]}, true
}

// factsLocked gathers what the node knows about a container for ClassifyOOM, copied: the
// runtime's and the cgroups' here, the evidence's by evidence.addFacts. l.mu is held.
func (l *Ledger) factsLocked(c *container, kind Item) classify.OOMFacts {
	ev := c.ev
	f := classify.OOMFacts{
		Container: ev.ContainerName, ContainerID: ev.ContainerID, PodUID: ev.PodUID,
		StartedAt: ev.StartedAt, PIDs: classify.TrustedPIDs(l.pids, c.runtimePID, c.pids), TaskOOM: len(c.ooms) > 0,
		PodCgroup: c.podCgroup, ContainerCgroup: c.cgroup, MemoryLimit: ev.MemoryLimit,
		KernelPrefix: l.pids.HostPrefix, PrefixKnown: l.pids.PrefixKnown,
	}
	l.evidence.addFacts(&f)
	if kind == Exit && c.exit != nil {
		f.ExitCode, f.Reason, f.FinishedAt = c.exit.ExitCode, c.exit.Reason, c.exit.FinishedAt
	}
	if c.last != nil {
		// A container's cgroup is its own (its path holds its ID): its counters since
		// creation are those of its life.
		d := cgroup.Sub(cgroup.Memory{}, *c.last)
		f.Counters = &d
		f.PeakUsage = c.last.Peak
		if f.MemoryLimit == 0 {
			f.MemoryLimit = c.last.Limit
		}
	}
	if c.podLast != nil && c.podAtStart != nil {
		d := cgroup.Sub(*c.podAtStart, *c.podLast)
		f.PodCounters = &d
	}
	if c.podLast != nil {
		p := *c.podLast
		f.Pod = &p
	}
	return f
}

// KernelWait records that the item waits once for late evidence (the kernel's report of
// the kill, containerd's OOM event).
func (l *Ledger) KernelWait(id string, kind Item) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c := l.containers[id]; c != nil {
		c.kernelWaited[kind] = true
	}
}

// FinishExit claims a classified exit: false when it was classified or dropped meanwhile.
// The exit is done (at now), and so are the OOM events recorded so far, its evidence.
// unknown says the verdict was UnknownOOM: it is counted once per container, and not for
// an exit from before started (the first relist replays them; an earlier run of the
// agent may have counted it).
func (l *Ledger) FinishExit(id string, now, started time.Time, unknown bool) (ExitClaim, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.containers[id]
	if c == nil || c.exit == nil || c.exitDone {
		return ExitClaim{}, false
	}
	x := *c.exit
	c.exitDone, c.doneAt = true, now
	c.oomHandled = len(c.ooms)
	replay := !x.FinishedAt.IsZero() && x.FinishedAt.Before(started)
	countUnknown := unknown && !c.unknownCounted && !replay
	c.unknownCounted = c.unknownCounted || countUnknown
	return ExitClaim{Exit: x, Replay: replay, CountUnknown: countUnknown}, true
}

// FinishOOM claims the OOM events classified: false when there are none left (the exit
// was classified meanwhile, with them as evidence). unknown says the verdict was
// UnknownOOM: it is counted once per container, and not for an OOM kill found counted
// when the container was first seen (replay).
func (l *Ledger) FinishOOM(id string, unknown bool) (OOMClaim, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.containers[id]
	if c == nil || c.exitDone || c.oomHandled >= len(c.ooms) {
		return OOMClaim{}, false
	}
	claim := OOMClaim{First: c.ooms[c.oomHandled], Last: c.ooms[len(c.ooms)-1]}
	c.oomHandled = len(c.ooms)
	claim.CountUnknown = unknown && !c.unknownCounted && !c.replay
	c.unknownCounted = c.unknownCounted || claim.CountUnknown
	return claim, true
}
