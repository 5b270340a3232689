package agent

// The agent's per-container state (containerTable): what it knows about each container of
// its node, the runtime's word on its pods' containers, and the kernel's recent OOM kills
// with what they taught about the node's cgroup paths and PIDs, which are only ever read
// together with the containers they are matched to.

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/coroner-dev/coroner/agent/cgroup"
	"github.com/coroner-dev/coroner/agent/classify"
	"github.com/coroner-dev/coroner/agent/kmsg"
	"github.com/coroner-dev/coroner/cri"
)

// containerTable owns the agent's per-container state under a lock of its own. Nothing
// outside it reads or writes its maps: it changes only through the transitions below,
// each of which takes the lock once, and what it hands out are copies.
//
//   - the runtime's events (one goroutine, handleEvent): see, then started, oomEvent or
//     exited with the cgroups read in between, outside the lock;
//   - the kernel's kills: addKill;
//   - a work item's classification (processContainer): pending, awaitPod, podConfirmed
//     or drop while its pod is looked for, then snapshot, a value copy of what
//     ClassifyOOM needs, then kernelWait (the item waits for the kernel's report once) or
//     finishExit or finishOOM, which claim the item and say what to count and stamp;
//   - pods: observedStates (StampsForPod's observed), forget (a deleted pod) and gc.
//
// It calls nothing of the agent's while it holds its lock, but gc's cached (the pod
// cache's own lock); the agent never holds Agent.mu while it calls the table, so the two
// locks are never nested.
type containerTable struct {
	mu sync.Mutex
	// containers are the containers by ID (one CRI container: a restart is a new one).
	containers map[string]*container
	// observed are the containers' states by pod UID (the runtime's: a static pod's config
	// hash) and container name, as the runtime reports them (StampsForPod's observed).
	observed map[types.UID]map[string]observedState
	// kernel is the kernel's recent OOM kills, for matching to containers.
	kernel kernelLog
	// pids is what the agent knows about whose numbering PIDs are in: its own PID
	// namespace, the host prefix learned from the kernel's paths, evidence that the
	// runtime's PIDs are not the kernel's (see learnLocked).
	pids classify.PIDFacts
	// prefixConflict: a kernel path named one of the node's containers under another
	// host prefix than the learned one (logged once).
	prefixConflict bool
}

// container is what the agent knows about one container (one CRI container: a restart
// is a new one).
type container struct {
	ev cri.ContainerEvent // identity, as last seen
	// cgroup is the container's memory cgroup as the kernel prints it, podCgroup its
	// pod's; empty when unknown.
	cgroup, podCgroup string
	// pids are the container's processes seen in its cgroup.procs, in the agent's PID
	// numbering (the kernel's only in the init PID namespace); procCount how many
	// processes the last reading listed (0 for those the agent cannot see count too).
	// runtimePID is the container's init process as the runtime reports it
	// (cri.ContainerEvent.PID), in the runtime's numbering. Which of them may match a
	// kernel line is classify.TrustedPIDs's decision.
	pids       []int
	procCount  int
	runtimePID int
	// podAtStart is the pod cgroup's reading when the container was first seen running;
	// last and podLast the container's and the pod's at the last OOM event or at the
	// exit, whichever came last and found the cgroup (a container's cgroup is usually
	// gone by the time the runtime reports the exit).
	podAtStart    *cgroup.Memory
	last, podLast *cgroup.Memory
	// ooms are the times of containerd's OOM events; oomHandled how many of them were
	// classified.
	ooms       []time.Time
	oomHandled int
	// exit is the Exited event; exitDone once classified (or dropped).
	exit     *cri.ContainerEvent
	exitDone bool
	// unknownCounted: an UnknownOOM verdict was counted for this container.
	unknownCounted bool
	// replay: the OOM kill was found in the container's cgroup counters when the agent
	// first saw it running (see started); like an exit from before the start, it is not
	// counted as an unknown OOM (an agent restarted again would count it again).
	replay bool
	// kernelWaited: the item waited once for the kernel log.
	kernelWaited map[itemKind]bool
	// podWait is when an item of this container first missed its pod in the cache, and
	// whether the API server confirmed the pod is this node's.
	podWait    map[itemKind]time.Time
	podChecked bool
	// doneAt is when nothing more was to be done (for garbage collection).
	doneAt time.Time
}

// observedState is a container's state as the runtime reports it, for StampsForPod.
type observedState struct {
	attempt uint32
	state   classify.ContainerState
}

// reading is what the agent read of a container's cgroups at one of its events: the
// container's and the pod's memory controllers (nil: not read, or gone) and the
// container's cgroup.procs.
type reading struct {
	mem, pod *cgroup.Memory
	pids     []int
}

// snapshot is a value copy of what the table knows about a container, for classifying
// one of its items: ClassifyOOM's facts, and whether the item has waited for the
// kernel's report already.
type snapshot struct {
	facts        classify.OOMFacts
	kernelWaited bool
}

// exitClaim is what finishExit hands the caller that classified an exit: the Exited
// event, whether it is from before the agent started (replay), and whether its UnknownOOM
// verdict is to be counted.
type exitClaim struct {
	exit         cri.ContainerEvent
	replay       bool
	countUnknown bool
}

// oomClaim is what finishOOM hands the caller that classified OOM events: the times of
// the first and the last not classified before, and whether the UnknownOOM verdict is to
// be counted.
type oomClaim struct {
	first, last  time.Time
	countUnknown bool
}

func newContainerTable(pids classify.PIDFacts) *containerTable {
	return &containerTable{
		containers: map[string]*container{},
		observed:   map[types.UID]map[string]observedState{},
		pids:       pids,
	}
}

// see records a runtime event's identity, the first of the transitions of each event: it
// creates the container when it is new (first), keeps what the event adds to what was
// known (mergeEvent, the runtime's PID) and, when it first gives the container's cgroup,
// learns from the kernel kills read before that may name it. It returns the container's
// and its pod's cgroup paths, to read.
func (t *containerTable) see(ev cri.ContainerEvent, logger klog.Logger) (cg, podCg string, first bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	c := t.containers[ev.ContainerID]
	first = c == nil
	if c == nil {
		c = &container{kernelWaited: map[itemKind]bool{}, podWait: map[itemKind]time.Time{}}
		t.containers[ev.ContainerID] = c
	}
	c.ev = mergeEvent(c.ev, ev)
	if ev.PID > 0 {
		c.runtimePID = ev.PID
	}
	if c.cgroup == "" && ev.CgroupPath != "" {
		c.cgroup, c.podCgroup = cgroupPaths(ev.CgroupPath)
		// Kernel lines read before the container's path was known may name it.
		for _, kk := range t.kernel.kills {
			t.learnLocked(logger, kk.kill)
		}
	}
	return c.cgroup, c.podCgroup, first
}

// started records a Started event with the cgroups read at it (see handleEvent). It
// reports whether the container, first seen now (first, from see), had already had a
// process OOM-killed: its own cgroup counted one, which is then an OOM event of its own
// to classify.
func (t *containerTable) started(ev cri.ContainerEvent, now time.Time, r reading, first bool) (missedOOM bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.observeLocked(ev, classify.ContainerState{Name: ev.ContainerName, State: classify.StateRunning,
		ContainerID: ev.ContainerID, StartedAt: ev.StartedAt})
	c := t.containers[ev.ContainerID]
	if c == nil {
		return false // forgotten (gc) since see: nothing is left to classify
	}
	c.pids = mergePIDs(c.pids, r.pids)
	if r.mem != nil {
		c.procCount = len(r.pids)
	}
	if c.podAtStart == nil {
		c.podAtStart = r.pod
	}
	// A container first seen running whose own cgroup has already counted an OOM kill
	// (its counters start at 0 with it) was OOM-killed, in a process that was not its
	// main one, while nobody was looking: the agent was not running yet, or its runtime
	// watch was cut.
	missedOOM = first && r.mem != nil && oomCounted(*r.mem)
	if missedOOM {
		c.last = r.mem
		c.ooms = append(c.ooms, now)
		c.replay = true
	}
	return missedOOM
}

// oomEvent records containerd's OOM event with the cgroups read at it. It reports
// whether the OOM event is to be classified: not when the exit is classified already.
func (t *containerTable) oomEvent(ev cri.ContainerEvent, now time.Time, r reading) (classify bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	c := t.containers[ev.ContainerID]
	if c == nil {
		return false
	}
	c.ooms = append(c.ooms, nonZero(ev.OOMAt, now))
	c.recordLocked(r)
	return !c.exitDone
}

// exited records an Exited event with the cgroups read at it.
func (t *containerTable) exited(ev cri.ContainerEvent, r reading) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if c := t.containers[ev.ContainerID]; c != nil {
		e := ev
		c.exit = &e
		c.recordLocked(r)
	}
	t.observeLocked(ev, classify.ContainerState{Name: ev.ContainerName, State: classify.StateExited,
		ExitCode: ev.ExitCode, FinishedAt: ev.FinishedAt, ContainerID: ev.ContainerID, Reason: ev.Reason,
		StartedAt: ev.StartedAt, Attempt: int32(ev.Attempt)})
}

// recordLocked keeps a reading at an OOM event or the exit. t.mu is held.
func (c *container) recordLocked(r reading) {
	c.pids = mergePIDs(c.pids, r.pids)
	if r.mem != nil {
		c.last = r.mem
	}
	if r.pod != nil {
		c.podLast = r.pod
	}
}

// observeLocked records a container's state for its pod, unless a later attempt of the
// same container is known. t.mu is held.
func (t *containerTable) observeLocked(ev cri.ContainerEvent, st classify.ContainerState) {
	uid := types.UID(ev.PodUID)
	m := t.observed[uid]
	if m == nil {
		m = map[string]observedState{}
		t.observed[uid] = m
	}
	if old, ok := m[ev.ContainerName]; ok && old.attempt > ev.Attempt {
		return
	}
	m[ev.ContainerName] = observedState{attempt: ev.Attempt, state: st}
}

// addKill keeps a kernel OOM kill and learns from it (learnLocked).
func (t *containerTable) addKill(k kmsg.OOMKill, now time.Time, logger klog.Logger) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.kernel.add(k, now)
	t.learnLocked(logger, k)
}

// pending returns the container's last event (its identity) when the item has work left:
// an exit not classified yet, OOM events not classified and no exit classified.
func (t *containerTable) pending(id string, kind itemKind) (cri.ContainerEvent, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	c := t.containers[id]
	switch {
	case c == nil,
		kind == itemExit && (c.exit == nil || c.exitDone),
		kind == itemOOM && (c.exitDone || c.oomHandled >= len(c.ooms)):
		return cri.ContainerEvent{}, false
	}
	return c.ev, true
}

// awaitPod records that an item missed its pod in the cache: it returns when it first
// did (now, the first time) and whether the API server has confirmed the pod is this
// node's (podConfirmed).
func (t *containerTable) awaitPod(id string, kind itemKind, now time.Time) (first time.Time, confirmed bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	c := t.containers[id]
	if c == nil {
		return now, false
	}
	first, ok := c.podWait[kind]
	if !ok {
		first = now
		c.podWait[kind] = now
	}
	return first, c.podChecked
}

// podConfirmed records that the API server said the container's pod exists on this node.
func (t *containerTable) podConfirmed(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if c := t.containers[id]; c != nil {
		c.podChecked = true
	}
}

// drop gives up on an item: the exit counts as done, or the OOM events as handled; with
// forgetPod the runtime's states of the container's pod are forgotten too (the pod is
// gone, or not this node's).
func (t *containerTable) drop(id string, kind itemKind, now time.Time, forgetPod bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	c := t.containers[id]
	if c == nil {
		return
	}
	switch kind {
	case itemExit:
		c.exitDone, c.doneAt = true, now
	case itemOOM:
		c.oomHandled = len(c.ooms)
	}
	if c.exitDone && c.doneAt.IsZero() {
		c.doneAt = now
	}
	if forgetPod {
		delete(t.observed, types.UID(c.ev.PodUID))
	}
}

// snapshot copies what the node knows about a container for ClassifyOOM (for an exit,
// with the exit's code, reason and time), and whether the item has waited for the
// kernel's report.
func (t *containerTable) snapshot(id string, kind itemKind) (snapshot, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	c := t.containers[id]
	if c == nil {
		return snapshot{}, false
	}
	return snapshot{facts: t.factsLocked(c, kind), kernelWaited: c.kernelWaited[kind]}, true
}

// factsLocked gathers what the node knows about a container for ClassifyOOM, copied.
// t.mu is held.
func (t *containerTable) factsLocked(c *container, kind itemKind) classify.OOMFacts {
	ev := c.ev
	f := classify.OOMFacts{
		Container: ev.ContainerName, ContainerID: ev.ContainerID, PodUID: ev.PodUID,
		StartedAt: ev.StartedAt, PIDs: classify.TrustedPIDs(t.pids, c.runtimePID, c.pids), TaskOOM: len(c.ooms) > 0,
		PodCgroup: c.podCgroup, ContainerCgroup: c.cgroup, MemoryLimit: ev.MemoryLimit,
		KernelPrefix: t.pids.HostPrefix, PrefixKnown: t.pids.PrefixKnown,
		Kernel: t.kernel.all(),
	}
	if kind == itemExit && c.exit != nil {
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

// kernelWait records that the item waits once for the kernel's report of the kill.
func (t *containerTable) kernelWait(id string, kind itemKind) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if c := t.containers[id]; c != nil {
		c.kernelWaited[kind] = true
	}
}

// finishExit claims a classified exit: false when it was classified or dropped meanwhile.
// The exit is done (at now), and so are the OOM events recorded so far, its evidence.
// unknown says the verdict was UnknownOOM: it is counted once per container, and not for
// an exit from before started (the first relist replays them; an earlier run of the
// agent may have counted it).
func (t *containerTable) finishExit(id string, now, started time.Time, unknown bool) (exitClaim, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	c := t.containers[id]
	if c == nil || c.exit == nil || c.exitDone {
		return exitClaim{}, false
	}
	x := *c.exit
	c.exitDone, c.doneAt = true, now
	c.oomHandled = len(c.ooms)
	replay := !x.FinishedAt.IsZero() && x.FinishedAt.Before(started)
	countUnknown := unknown && !c.unknownCounted && !replay
	c.unknownCounted = c.unknownCounted || countUnknown
	return exitClaim{exit: x, replay: replay, countUnknown: countUnknown}, true
}

// finishOOM claims the OOM events classified: false when there are none left (the exit
// was classified meanwhile, with them as evidence). unknown says the verdict was
// UnknownOOM: it is counted once per container, and not for an OOM kill the agent found
// counted when it first saw the container (replay).
func (t *containerTable) finishOOM(id string, unknown bool) (oomClaim, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	c := t.containers[id]
	if c == nil || c.exitDone || c.oomHandled >= len(c.ooms) {
		return oomClaim{}, false
	}
	claim := oomClaim{first: c.ooms[c.oomHandled], last: c.ooms[len(c.ooms)-1]}
	c.oomHandled = len(c.ooms)
	claim.countUnknown = unknown && !c.unknownCounted && !c.replay
	c.unknownCounted = c.unknownCounted || claim.countUnknown
	return claim, true
}

// observedStates returns the runtime's word on the containers of the pods with uids (a
// static pod's: by its config hash and by its mirror pod's UID).
func (t *containerTable) observedStates(uids ...types.UID) []classify.ContainerState {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []classify.ContainerState
	for _, uid := range uids {
		for _, s := range t.observed[uid] {
			out = append(out, s.state)
		}
	}
	return out
}

// forget forgets the runtime's states of deleted pods.
func (t *containerTable) forget(uids ...types.UID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, uid := range uids {
		delete(t.observed, uid)
	}
}

// gc forgets the containers done for longer than containerTTL, the runtime's states of
// pods neither cached (cached) nor with containers still remembered, and the kernel's
// kills older than kernelTTL.
func (t *containerTable) gc(now time.Time, cached func(types.UID) bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for id, c := range t.containers {
		if !c.doneAt.IsZero() && now.Sub(c.doneAt) > containerTTL {
			delete(t.containers, id)
		}
	}
	live := map[types.UID]bool{}
	for _, c := range t.containers {
		live[types.UID(c.ev.PodUID)] = true
	}
	for uid := range t.observed {
		if !live[uid] && !cached(uid) {
			delete(t.observed, uid)
		}
	}
	t.kernel.trim(now)
}
