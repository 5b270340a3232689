package classify

import (
	"fmt"
	"time"

	"github.com/coroner-dev/coroner/agent/cgroup"
	"github.com/coroner-dev/coroner/agent/kmsg"
)

// ReasonOOMKilled is the container runtime's reason for a container whose
// process was killed by an OOM killer (containerd and CRI-O spell it so).
const ReasonOOMKilled = "OOMKilled"

// OOMKind is what ClassifyOOM makes of a container exit.
type OOMKind string

const (
	// NotOOM: no evidence that an OOM killer touched the container.
	NotOOM OOMKind = ""
	// LimitOOM: killed because the container or its pod reached its own
	// memory limit: the kernel's oom_memcg is inside the pod's cgroup.
	LimitOOM OOMKind = "LimitOOM"
	// NodeOOM: killed by the node: the global OOM killer, or a cgroup above
	// the pod (kubepods, a QoS class cgroup, the kubelet's cgroup root, the
	// root) out of memory.
	NodeOOM OOMKind = "NodeOOM"
	// UnknownOOM: an OOM killer killed a process of the container, but
	// nothing says whose limit it was.
	UnknownOOM OOMKind = "UnknownOOM"
)

// OOMFacts is what the node knows about one container exit, for
// ClassifyOOM. Every field but Container is optional: the zero value means
// "not known", and the classification uses what there is.
type OOMFacts struct {
	// Container is the container's name in the pod spec; ContainerID the
	// runtime's ID of the instance that exited.
	Container   string
	ContainerID string
	// ExitCode and Reason are the runtime's (Reason "OOMKilled", "Error",
	// "Completed", ...).
	ExitCode int32
	Reason   string
	// StartedAt and FinishedAt bound the container's life.
	StartedAt, FinishedAt time.Time
	// PIDs are PIDs of the container's processes in the kernel's numbering
	// (the init PID namespace), to match kernel kills that name no cgroup:
	// only those TrustedPIDs returns. Empty when none can be trusted.
	PIDs []int

	// TaskOOM reports a containerd /tasks/oom event for this container.
	// (containerd sends it when its cgroup's OOM counters move, which they
	// also do when an ancestor's limit or the global OOM killer killed one of
	// its processes: it says "OOM kill", not "whose".)
	TaskOOM bool

	// PodUID is the pod's metadata.uid.
	PodUID string
	// PodCgroup and ContainerCgroup are the memory cgroup paths of the pod
	// and the container as the runtime knows them (relative to the memory
	// hierarchy's root in the runtime's cgroup namespace, e.g.
	// /kubepods/burstable/pod<uid>/<id>); the kernel prints KernelPrefix
	// before them.
	PodCgroup       string
	ContainerCgroup string
	// KernelPrefix is the host prefix the kernel prints before the runtime's
	// paths on a nested node (cgroup.HostPrefix, e.g.
	// /system.slice/docker-<nodeID>.scope for kind under Docker), when
	// PrefixKnown; "" on an ordinary node. Unknown, kernel paths are
	// matched by the container ID and pod UID they name, and by the runtime's
	// paths as they are.
	KernelPrefix string
	PrefixKnown  bool
	// Counters is how the container cgroup's memory event counters moved
	// over its life (cgroup.Sub of a reading at start, or zero, and one at
	// exit); PodCounters the same for the pod's cgroup over the same time.
	Counters    *cgroup.Delta
	PodCounters *cgroup.Delta
	// Pod is the pod cgroup's reading at the exit (nil: not read). Its
	// counters count since the pod's cgroup was made. PodCounters may miss a
	// kill: its first reading is taken when the agent learns that the
	// container started, which on a relisting node can be a second late, and
	// a container that allocates fast is killed at its pod's limit before
	// that (bench-beside on the lab: a pod-limit OOM read as "the pod's
	// failcnt did not move"). So a counter that moved in PodCounters is
	// evidence of a limit OOM, and only counters of Pod that are still 0 are
	// evidence that the pod's limit was never reached. Its limit and peak
	// place a kill whose container cgroup could not be read (the pod's
	// cgroup outlives its containers': the kubelet removes it once the pod
	// is terminal).
	Pod *cgroup.Memory
	// MemoryLimit is the container's memory limit in bytes (0: none or not
	// known); PeakUsage its peak memory usage in bytes (0: not known).
	MemoryLimit int64
	PeakUsage   int64

	// Kernel are OOM kills from the kernel log around the container's life,
	// in the order logged. Kills of other cgroups may be included:
	// ClassifyOOM keeps only those of this container (see relevantKills).
	Kernel []kmsg.OOMKill
}

// Verdict is ClassifyOOM's answer.
type Verdict struct {
	Kind      OOMKind
	Container string
	// Killer is the memory cgroup that ran out of memory (the kernel's
	// oom_memcg), when known; KillerLevel what it is. For a global OOM,
	// Global is true, Killer empty and KillerLevel cgroup.LevelRoot.
	Killer      string
	KillerLevel cgroup.Level
	Global      bool
	// Constraint is the kernel's constraint (CONSTRAINT_MEMCG, ...), when
	// logged.
	Constraint string
	// Limit and Peak are the container's memory limit and peak usage in
	// bytes (0: not known); KillerLimit the killing cgroup's limit from the
	// kernel's report.
	Limit, Peak, KillerLimit int64
	// Basis says which evidence decided, Evidence lists all of it; both for
	// logs and Events.
	Basis    string
	Evidence []string
}

// kernelSlack is how far around the container's life a kernel kill matched
// by PID alone may lie: the kernel's clock against the wall clock, plus the
// time from the kill to the runtime noticing the exit.
const kernelSlack = 30 * time.Second

// ClassifyOOM decides whether a container exit was an OOM kill and whose
// limit it was. The rules, in order; the first that applies decides:
//
//  0. Evidence of an OOM kill is any of: the runtime's reason OOMKilled, a
//     containerd TaskOOM event, the container cgroup's oom_kill (or v2 oom,
//     oom_group_kill) counter having moved, or a kernel OOM kill of one of
//     the container's processes. Without any, the exit is NotOOM, whatever
//     its code: exit 137 alone is a SIGKILL from anyone (the kubelet
//     stopping the container, a liveness probe, a preemption), not an OOM
//     kill. With any, it is an OOM kill whatever the exit code: 137 without
//     the reason OOMKilled, and also 0 or 1, when a process other than the
//     container's PID 1 was killed and PID 1 carried on.
//  1. The kernel's word. A kernel kill of one of the container's processes
//     that says where the OOM happened decides: a global OOM (the global
//     OOM killer, constraint CONSTRAINT_NONE, or a cpuset or NUMA memory
//     policy constraint) is NodeOOM; an oom_memcg inside the pod's own
//     cgroup subtree (the pod's cgroup or a container's) is LimitOOM; an
//     oom_memcg above the pod (kubepods, a QoS class cgroup, the kubelet's
//     cgroup root, the root) is NodeOOM. When several kills of the
//     container say different things, the kill of one of PIDs (the
//     container's main process) decides, else the last one logged.
//  2. cgroup v2 counters (memory.events, hierarchical: a cgroup's oom counts
//     OOMs at its own limit and at its descendants'). The container's own
//     oom counter moved: its limit (LimitOOM). The pod's oom counter moved
//     during the container's life: a limit inside the pod (LimitOOM; a
//     sibling container reaching its own limit at the same time as a node
//     OOM would be mistaken for it, a rare coincidence). Neither ever moved
//     (the pod's since the pod's cgroup was made, Pod), both known:
//     the OOM was above the pod (NodeOOM).
//  3. cgroup v1 counters. The failcnt of the container and, since the
//     pod's cgroup was made, of the pod stayed 0, so neither limit was ever
//     reached: the OOM was above the pod (NodeOOM). A failcnt above 0 is not
//     taken as proof of the opposite: usage reaches a limit routinely (page
//     cache) without an OOM.
//  4. Usage at the limit. The container's peak usage reached its memory
//     limit (within 1%), or the pod's reached the pod's: LimitOOM. Reached
//     when the kernel's kill lines were rate limited (memcg OOM, no summary:
//     the kernel prints at most 10 in 5 s, for every node of a shared
//     kernel), or not read. The pod's peak is what is left when the
//     container's cgroup was removed before it could be read (bench-beside
//     on the lab: 6 Jobs at a time per node, cgroup v1).
//  5. Otherwise UnknownOOM.
func ClassifyOOM(f OOMFacts) Verdict {
	v := Verdict{Container: f.Container, Limit: f.MemoryLimit, Peak: f.PeakUsage}
	podUID := f.PodUID
	if podUID == "" {
		podUID = firstNonEmpty(cgroup.ParsePath(f.PodCgroup).PodUID, cgroup.ParsePath(f.ContainerCgroup).PodUID)
	}
	kills := relevantKills(f)

	// 0. Is there any evidence of an OOM kill?
	var ev []string
	if f.Reason == ReasonOOMKilled {
		ev = append(ev, "runtime reason OOMKilled")
	}
	if f.TaskOOM {
		ev = append(ev, "containerd TaskOOM event")
	}
	if c := f.Counters; c != nil {
		if c.OOMKill > 0 {
			ev = append(ev, fmt.Sprintf("container cgroup %s oom_kill +%d", c.Version, c.OOMKill))
		}
		if c.Version == cgroup.V2 && c.OOM > 0 {
			ev = append(ev, fmt.Sprintf("container cgroup v2 oom +%d", c.OOM))
		}
		if c.OOMGroupKill > 0 {
			ev = append(ev, fmt.Sprintf("container cgroup v2 oom_group_kill +%d", c.OOMGroupKill))
		}
	}
	for _, k := range kills {
		ev = append(ev, describeKill(k))
	}
	if len(ev) == 0 {
		if f.ExitCode == 137 {
			v.Evidence = []string{"exit code 137 (SIGKILL) without any OOM evidence"}
		}
		return v
	}
	v.Evidence = ev

	// 1. The kernel's word.
	if k, conflict, ok := decisiveKill(kills, f, podUID); ok {
		v.Constraint = k.Constraint
		if conflict {
			v.Evidence = append(v.Evidence, "kernel kills of the container disagree; the main process's (or the last) decides")
		}
		switch placeOf(k, f, podUID) {
		case inPod:
			v.Kind = LimitOOM
			v.Killer = k.OOMMemcg
			v.KillerLevel = cgroup.ParsePath(k.OOMMemcg).Level
			if v.KillerLevel != cgroup.LevelPod && v.KillerLevel != cgroup.LevelContainer {
				// A layout without pod<uid> elements: placed by PodCgroup.
				v.KillerLevel = cgroup.LevelContainer
				if cgroup.Within(f.PodCgroup, k.OOMMemcg) {
					v.KillerLevel = cgroup.LevelPod
				}
			}
			v.KillerLimit = k.MemcgLimitKB * 1024
			if v.Peak == 0 && v.KillerLevel == cgroup.LevelContainer {
				v.Peak = k.MemcgUsageKB * 1024
			}
			v.Basis = fmt.Sprintf("kernel: oom_memcg %s is inside the pod's cgroup", k.OOMMemcg)
		case abovePod:
			v.Kind = NodeOOM
			if k.Scope == kmsg.ScopeGlobal {
				v.Global, v.KillerLevel = true, cgroup.LevelRoot
				v.Basis = "kernel: global OOM (" + orUnknown(k.Constraint) + ")"
			} else {
				v.Killer = k.OOMMemcg
				v.KillerLevel = cgroup.ParsePath(k.OOMMemcg).Level
				v.KillerLimit = k.MemcgLimitKB * 1024
				v.Basis = fmt.Sprintf("kernel: oom_memcg %s is above the pod's cgroup", k.OOMMemcg)
			}
		}
		return v
	}

	// 2. cgroup v2 counters.
	c, p := f.Counters, f.PodCounters
	var pt *cgroup.Delta // the pod's counters since its cgroup was made
	if f.Pod != nil {
		d := cgroup.Sub(cgroup.Memory{}, *f.Pod)
		pt = &d
	}
	cV2 := c != nil && c.Version == cgroup.V2
	pV2 := p != nil && p.Version == cgroup.V2
	ptV2 := pt != nil && pt.Version == cgroup.V2
	switch {
	case cV2 && c.OOM > 0:
		v.Kind, v.KillerLevel = LimitOOM, cgroup.LevelContainer
		v.Killer = f.ContainerCgroup
		v.Basis = "cgroup v2: the container's own memory.events oom counter moved"
		return v
	case pV2 && p.OOM > 0:
		v.Kind, v.KillerLevel = LimitOOM, cgroup.LevelPod
		v.Killer = f.PodCgroup
		v.Basis = "cgroup v2: the pod's memory.events oom counter moved"
		return v
	case cV2 && ptV2 && c.OOM == 0 && pt.OOM == 0:
		v.Kind, v.KillerLevel = NodeOOM, cgroup.LevelOther
		v.Basis = "cgroup v2: killed while neither the container's nor the pod's oom counter moved"
		return v
	}

	// 3. cgroup v1 counters: failcnt 0 is proof the limit was never reached.
	if c != nil && c.Version == cgroup.V1 && pt != nil && pt.Version == cgroup.V1 && c.FailCnt == 0 && pt.FailCnt == 0 {
		v.Kind, v.KillerLevel = NodeOOM, cgroup.LevelOther
		v.Basis = "cgroup v1: neither the container's nor the pod's memory.failcnt moved, so neither limit was reached"
		return v
	}

	// 4. Usage at the limit.
	if atLimit(f.PeakUsage, f.MemoryLimit) {
		v.Kind, v.KillerLevel = LimitOOM, cgroup.LevelContainer
		v.Killer = f.ContainerCgroup
		v.Basis = "peak usage reached the container's memory limit"
		return v
	}
	if f.Pod != nil && atLimit(f.Pod.Peak, f.Pod.Limit) {
		v.Kind, v.KillerLevel = LimitOOM, cgroup.LevelPod
		v.Killer, v.KillerLimit = f.PodCgroup, f.Pod.Limit
		v.Basis = "the pod's peak usage reached the pod's memory limit"
		return v
	}

	// 5.
	v.Kind = UnknownOOM
	v.Basis = "OOM kill without evidence of whose limit"
	return v
}

// atLimit reports whether peak is within 1% (at least a page) of limit.
func atLimit(peak, limit int64) bool {
	if peak <= 0 || limit <= 0 {
		return false
	}
	tol := max(limit/100, 4096)
	return peak >= limit-tol
}
