package agent

import (
	"context"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/coroner-dev/coroner/agent/cgroup"
	"github.com/coroner-dev/coroner/agent/classify"
	"github.com/coroner-dev/coroner/agent/kmsg"
	"github.com/coroner-dev/coroner/cri"
)

// itemKind is what a work item is about.
type itemKind int

const (
	// itemExit: classify a container's exit (id: container ID).
	itemExit itemKind = iota
	// itemOOM: classify an OOM kill in a container that may still run (id: container ID).
	itemOOM
	// itemPod: the pod-level decision, A3 and A4 (id: pod UID).
	itemPod
)

func (k itemKind) String() string {
	switch k {
	case itemExit:
		return "exit"
	case itemOOM:
		return "oom"
	}
	return "pod"
}

// item is a unit of work of the agent's queue.
type item struct {
	kind itemKind
	id   string
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
	// first saw it running (see handleEvent); like an exit from before the start, it is
	// not counted as an unknown OOM (an agent restarted again would count it again).
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

// goneRecord says why events of a pod are dropped.
type goneRecord struct {
	reason string
	at     time.Time
}

// consumeEvents applies the runtime's events until the channel closes.
func (a *Agent) consumeEvents(ctx context.Context, events <-chan cri.ContainerEvent) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-events:
			if !ok {
				return
			}
			a.handleEvent(ev)
		}
	}
}

// handleEvent records one container event and queues its classification. Cgroups are
// read here, as early as possible: a container's cgroup goes away soon after it exits.
func (a *Agent) handleEvent(ev cri.ContainerEvent) {
	if ev.ContainerID == "" || ev.PodUID == "" {
		return
	}
	now := a.clock.Now()
	a.mu.Lock()
	c := a.containers[ev.ContainerID]
	firstSeen := c == nil
	if c == nil {
		c = &container{kernelWaited: map[itemKind]bool{}, podWait: map[itemKind]time.Time{}}
		a.containers[ev.ContainerID] = c
	}
	c.ev = mergeEvent(c.ev, ev)
	if ev.PID > 0 {
		c.runtimePID = ev.PID
	}
	if c.cgroup == "" && ev.CgroupPath != "" {
		c.cgroup, c.podCgroup = cgroupPaths(ev.CgroupPath)
		// Kernel lines read before the container's path was known may name it.
		for _, kk := range a.kernel.kills {
			a.learnLocked(kk.kill)
		}
	}
	cgPath, podPath := c.cgroup, c.podCgroup
	a.mu.Unlock()

	switch ev.Kind {
	case cri.Started:
		m, pm := a.readCgroup(cgPath), a.readCgroup(podPath)
		pids := readPIDs(m)
		a.mu.Lock()
		c.pids = mergePIDs(c.pids, pids)
		if m != nil {
			c.procCount = len(pids)
		}
		if c.podAtStart == nil {
			c.podAtStart = pm
		}
		a.observe(ev, classify.ContainerState{Name: ev.ContainerName, State: classify.StateRunning,
			ContainerID: ev.ContainerID, StartedAt: ev.StartedAt})
		// A container first seen running whose own cgroup has already counted an OOM
		// kill (its counters start at 0 with it) was OOM-killed, in a process that was
		// not its main one, while nobody was looking: the agent was not running yet, or
		// its runtime watch was cut. Classified as an OOM event of its own.
		missed := firstSeen && m != nil && oomCounted(*m)
		if missed {
			c.last = m
			c.ooms = append(c.ooms, now)
			c.replay = true
		}
		a.mu.Unlock()
		if missed {
			a.queue.Add(item{kind: itemOOM, id: ev.ContainerID})
		}
	case cri.OOM:
		m, pm := a.readCgroup(cgPath), a.readCgroup(podPath)
		a.mu.Lock()
		c.ooms = append(c.ooms, nonZero(ev.OOMAt, now))
		c.pids = mergePIDs(c.pids, readPIDs(m))
		if m != nil {
			c.last = m
		}
		if pm != nil {
			c.podLast = pm
		}
		exitDone := c.exitDone
		a.mu.Unlock()
		if !exitDone {
			a.queue.Add(item{kind: itemOOM, id: ev.ContainerID})
		}
	case cri.Exited:
		m, pm := a.readCgroup(cgPath), a.readCgroup(podPath)
		a.mu.Lock()
		e := ev
		c.exit = &e
		c.pids = mergePIDs(c.pids, readPIDs(m))
		if m != nil {
			c.last = m
		}
		if pm != nil {
			c.podLast = pm
		}
		a.observe(ev, classify.ContainerState{Name: ev.ContainerName, State: classify.StateExited,
			ExitCode: ev.ExitCode, FinishedAt: ev.FinishedAt, ContainerID: ev.ContainerID, Reason: ev.Reason,
			StartedAt: ev.StartedAt, Attempt: int32(ev.Attempt)})
		a.mu.Unlock()
		a.queue.Add(item{kind: itemExit, id: ev.ContainerID})
	}
}

// oomCounted reports whether a cgroup's counters show an OOM kill of one of its
// processes since the cgroup was created.
func oomCounted(m cgroup.Memory) bool {
	return m.OOMKill > 0 || m.OOMGroupKill > 0 || m.Version == cgroup.V2 && m.OOM > 0
}

// observe records a container's state for its pod, unless a later attempt of the same
// container is known. a.mu is held.
func (a *Agent) observe(ev cri.ContainerEvent, st classify.ContainerState) {
	uid := types.UID(ev.PodUID)
	m := a.observed[uid]
	if m == nil {
		m = map[string]observedState{}
		a.observed[uid] = m
	}
	if old, ok := m[ev.ContainerName]; ok && old.attempt > ev.Attempt {
		return
	}
	m[ev.ContainerName] = observedState{attempt: ev.Attempt, state: st}
}

// observedStates returns the runtime's word on a pod's containers.
func (a *Agent) observedStates(uid types.UID) []classify.ContainerState {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []classify.ContainerState
	for _, s := range a.observed[uid] {
		out = append(out, s.state)
	}
	return out
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

// readCgroup reads a cgroup's memory controller; nil when cgroups are not read or the
// cgroup is gone (cgroup.Read fails for a cgroup removed while it is read, which the
// runtime does right after a container's exit).
func (a *Agent) readCgroup(p string) *cgroup.Memory {
	if a.cfg.CgroupRoot == "" || p == "" {
		return nil
	}
	m, err := cgroup.Read(a.cfg.CgroupRoot, p)
	if err != nil {
		return nil
	}
	return &m
}

// readPIDs lists the processes of a cgroup read by readCgroup, as cgroup.procs shows
// them to the agent: a process outside the agent's PID namespace is listed as 0.
func readPIDs(m *cgroup.Memory) []int {
	if m == nil || m.Dir == "" {
		return nil
	}
	b, err := os.ReadFile(filepath.Join(m.Dir, "cgroup.procs"))
	if err != nil {
		return nil
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(f); err == nil {
			pids = append(pids, n)
		}
	}
	return pids
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

// kernelLog keeps the kernel's recent OOM kills, for matching to containers.
type kernelLog struct {
	kills []kernelKill
}

type kernelKill struct {
	kill    kmsg.OOMKill
	arrived time.Time
}

// kernelKeep bounds the kernel log kept: the kills of the last kernelTTL, at most
// kernelMax of them.
const (
	kernelTTL = 10 * time.Minute
	kernelMax = 4096
)

func (k *kernelLog) add(kill kmsg.OOMKill, now time.Time) {
	k.kills = append(k.kills, kernelKill{kill: kill, arrived: now})
	if len(k.kills) > kernelMax {
		k.kills = append([]kernelKill(nil), k.kills[len(k.kills)-kernelMax:]...)
	}
}

func (k *kernelLog) trim(now time.Time) {
	i := 0
	for i < len(k.kills) && now.Sub(k.kills[i].arrived) > kernelTTL {
		i++
	}
	if i > 0 {
		k.kills = append([]kernelKill(nil), k.kills[i:]...)
	}
}

func (k *kernelLog) all() []kmsg.OOMKill {
	out := make([]kmsg.OOMKill, len(k.kills))
	for i, kk := range k.kills {
		out[i] = kk.kill
	}
	return out
}

// consumeKernel keeps the kernel's OOM kills until ctx is done. (An OOM kill whose line
// has not been read yet when it is classified waits for it once: see Config.KernelWait.)
// When Config.KernelCaughtUp is closed, the kills already buffered (the rest of the
// backlog) are taken at once, then the agent is kernelReady.
func (a *Agent) consumeKernel(ctx context.Context) {
	caughtUp := a.cfg.KernelCaughtUp
	var backlog int
	defer a.setKernelReady()
	for {
		select {
		case <-ctx.Done():
			return
		case <-caughtUp:
			caughtUp = nil
			for drained := false; !drained; {
				select {
				case k, ok := <-a.cfg.Kernel:
					if !ok {
						return
					}
					a.addKill(k)
					backlog++
				default:
					drained = true
				}
			}
			a.setKernelReady()
			a.logger.Info("Read the kernel log's backlog", "oomKills", backlog)
		case k, ok := <-a.cfg.Kernel:
			if !ok {
				return
			}
			a.addKill(k)
			if caughtUp != nil {
				backlog++
			}
		}
	}
}

func (a *Agent) addKill(k kmsg.OOMKill) {
	a.mu.Lock()
	a.kernel.add(k, a.clock.Now())
	a.learnLocked(k)
	a.mu.Unlock()
	a.logger.V(2).Info("Kernel OOM kill", "pid", k.PID, "task", k.Task, "scope", k.Scope.String(),
		"oomMemcg", k.OOMMemcg, "taskMemcg", k.TaskMemcg, "time", k.Time)
}

func (a *Agent) setKernelReady() {
	a.mu.Lock()
	a.kernelReady = true
	a.mu.Unlock()
}

// waitKernelBacklog reports whether a classification should wait for the kernel log's
// backlog: it has not been consumed yet, and the start was less than
// KernelBacklogWait ago.
func (a *Agent) waitKernelBacklog(now time.Time) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return !a.kernelReady && now.Sub(a.started) < KernelBacklogWait
}

// learnLocked learns from a kernel kill that names one of the node's containers by its
// cgroup (task_memcg, or a memory.oom.group kill's cgroup) how the kernel's paths relate
// to the runtime's, for classify.TrustedPIDs and for matching paths that name only
// levels above the pod:
//
//   - the host prefix: the kernel's path of the container's cgroup is the prefix
//     followed by the runtime's path of it (cgroup.HostPrefix), "" on an ordinary node,
//     e.g. /system.slice/docker-<nodeID>.scope on kind under Docker. The first prefix
//     learned stays (a node does not move); a different one is logged once.
//   - a PID mismatch: the kill's task_memcg is exactly the container's cgroup, whose
//     last reading listed a single process (its init), and the kill's PID is not the
//     runtime's PID of that init: the runtime numbers PIDs in a namespace of its own.
//
// A kill of a container the agent does not know (another node's, on a shared kernel)
// teaches nothing. a.mu is held.
func (a *Agent) learnLocked(k kmsg.OOMKill) {
	for _, p := range []string{k.TaskMemcg, k.GroupMemcg} {
		pp := cgroup.ParsePath(p)
		if pp.ContainerID == "" {
			continue
		}
		c := a.containers[pp.ContainerID]
		if c == nil || c.cgroup == "" {
			continue
		}
		prefix, ok := cgroup.HostPrefix(pp.Container, c.cgroup)
		if !ok {
			continue
		}
		switch {
		case !a.pids.PrefixKnown:
			a.pids.HostPrefix, a.pids.PrefixKnown = prefix, true
			a.logger.Info("Learned how the kernel prints this node's cgroup paths", "hostPrefix", prefix,
				"nested", prefix != "", "containerID", shortID(pp.ContainerID))
		case prefix != a.pids.HostPrefix && !a.prefixConflict:
			a.prefixConflict = true
			a.logger.Info("A kernel path names one of this node's containers under another host prefix; keeping the first",
				"hostPrefix", a.pids.HostPrefix, "seen", prefix, "containerID", shortID(pp.ContainerID))
		}
		if p == k.TaskMemcg && pp.Path == pp.Container && k.PID > 0 && c.runtimePID > 0 && k.PID != c.runtimePID &&
			c.procCount == 1 && !a.pids.PIDMismatch {
			a.pids.PIDMismatch = true
			a.logger.Info("The kernel killed the only process of a container under another PID than the runtime's: "+
				"the runtime's PIDs are not the kernel's; kernel lines that name only a PID are not attributed",
				"kernelPID", k.PID, "runtimePID", c.runtimePID, "containerID", shortID(pp.ContainerID))
		}
	}
}
