package ledger

// Evidence: what sources other than the runtime's events say about the node's
// containers, the rules that keep it (a time-to-live and a bound per source), join it to
// the containers it names, and hand it to a classification. Today one source: the
// kernel's OOM kills (agent/kmsg).
//
// # Adding a source
//
// A new source of evidence (the next one: device health, from a pod's
// status.containerStatuses[].allocatedResourcesStatus and from NVIDIA Xid kernel lines)
// plugs in here, and only here in the ledger:
//
//  1. its record, a plain value that names what it is about the way the source does:
//     a cgroup path or a PID (the kernel's kills), a pod UID and container name (a pod's
//     status), a device ID (an Xid line, joined to containers through the device IDs
//     their pod's status lists);
//  2. where evidence keeps it, with its TTL and bound beside KernelTTL and KernelMax,
//     trimmed in evidence.expire: a recent[R] for records that are events (a kill, an
//     Xid line: each one counts, in the order read); a map by its key for records that
//     are states (a device's health in a pod's status: the newer replaces the older);
//  3. a Learn method (LearnKill is the kernel's) that keeps a record and joins it to the
//     containers it names, and a line in joinLocked that joins the records read before a
//     container became known once Observe learns who it is;
//  4. what a classification gets of it, copied: into classify.OOMFacts in
//     evidence.addFacts when it weighs on an OOM verdict; a verdict of its own (a device
//     failure, not an OOM kill) takes facts of its own, built from the same container
//     and evidence beside factsLocked (items.go), with a Snapshot of its own.
//
// The agent feeds the new source's stream to its Learn method the way it feeds the
// kernel's to LearnKill (agent/kernel.go). The containers, the work items and their
// claims (ledger.go, events.go, items.go) do not change.
//
// The second source, device health and drivers' hardware faults, is devices.go: its state
// records (a map by pod, container and device) and its events (recent driver faults by
// device ID) live here beside the kernel's kills, its Learn methods are ObserveDevices,
// LearnAllocation and LearnFault, and its verdict takes facts of its own (DeviceFacts).

import (
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/coroner-dev/coroner/agent/cgroup"
	"github.com/coroner-dev/coroner/agent/classify"
	"github.com/coroner-dev/coroner/agent/kmsg"
)

// The kernel's kills are kept for KernelTTL after they were read, at most KernelMax of
// them (the newest).
const (
	KernelTTL = 10 * time.Minute
	KernelMax = 4096
)

// evidence is the ledger's evidence, by source. The ledger's lock guards it.
type evidence struct {
	// kernel are the kernel's recent OOM kills, matched to containers by
	// classify.ClassifyOOM (by cgroup and PID) when one is classified.
	kernel recent[kmsg.OOMKill]
	// devices are the device health states by pod, container and device (devices.go),
	// devicePods when each pod holding devices was first seen.
	devices    map[DeviceKey]deviceState
	devicePods map[types.UID]time.Time
	// faults are the hardware faults devices' drivers logged, by device ID (devices.go).
	faults recent[DriverFault]
}

func newEvidence() evidence {
	return evidence{devices: map[DeviceKey]deviceState{}, devicePods: map[types.UID]time.Time{}}
}

// expire forgets the evidence past its TTL (device states go with their pods:
// Ledger.expireDevicesLocked).
func (e *evidence) expire(now time.Time) {
	e.kernel.trim(now, KernelTTL)
	e.faults.trim(now, FaultTTL)
}

// addFacts copies the evidence a classification reads into its facts.
func (e *evidence) addFacts(f *classify.OOMFacts) {
	f.Kernel = e.kernel.all()
}

// recent keeps the records of one source in the order they arrived, each with when it
// arrived.
type recent[R any] struct {
	recs []arrived[R]
}

type arrived[R any] struct {
	rec R
	at  time.Time
}

// add keeps a record, and at most bound of them (the newest).
func (r *recent[R]) add(rec R, now time.Time, bound int) {
	r.recs = append(r.recs, arrived[R]{rec: rec, at: now})
	if len(r.recs) > bound {
		r.recs = append([]arrived[R](nil), r.recs[len(r.recs)-bound:]...)
	}
}

// trim forgets the records that arrived more than ttl before now.
func (r *recent[R]) trim(now time.Time, ttl time.Duration) {
	i := 0
	for i < len(r.recs) && now.Sub(r.recs[i].at) > ttl {
		i++
	}
	if i > 0 {
		r.recs = append([]arrived[R](nil), r.recs[i:]...)
	}
}

// all returns a copy of the records.
func (r *recent[R]) all() []R {
	out := make([]R, len(r.recs))
	for i, a := range r.recs {
		out[i] = a.rec
	}
	return out
}

// LearnKill keeps a kernel OOM kill (read at now) and joins it to the node's containers
// it names (learnKillLocked). logger says what it taught.
func (l *Ledger) LearnKill(k kmsg.OOMKill, now time.Time, logger klog.Logger) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.evidence.kernel.add(k, now, KernelMax)
	l.learnKillLocked(logger, k)
}

// joinLocked joins the evidence read before to the containers, when Observe first learns
// a container's cgroup: kernel lines read before may name it. l.mu is held.
func (l *Ledger) joinLocked(logger klog.Logger) {
	for _, a := range l.evidence.kernel.recs {
		l.learnKillLocked(logger, a.rec)
	}
}

// learnKillLocked learns from a kernel kill that names one of the node's containers by
// its cgroup (task_memcg, or a memory.oom.group kill's cgroup) how the kernel's paths
// relate to the runtime's, for classify.TrustedPIDs and for matching paths that name
// only levels above the pod:
//
//   - the host prefix: the kernel's path of the container's cgroup is the prefix
//     followed by the runtime's path of it (cgroup.HostPrefix), "" on an ordinary node,
//     e.g. /system.slice/docker-<nodeID>.scope on kind under Docker. The first prefix
//     learned stays (a node does not move); a different one is logged once.
//   - a PID mismatch: the kill's task_memcg is exactly the container's cgroup, whose
//     last reading listed a single process (its init), and the kill's PID is not the
//     runtime's PID of that init: the runtime numbers PIDs in a namespace of its own.
//
// A kill of a container the ledger does not know (another node's, on a shared kernel)
// teaches nothing. l.mu is held.
func (l *Ledger) learnKillLocked(logger klog.Logger, k kmsg.OOMKill) {
	for _, p := range []string{k.TaskMemcg, k.GroupMemcg} {
		pp := cgroup.ParsePath(p)
		if pp.ContainerID == "" {
			continue
		}
		c := l.containers[pp.ContainerID]
		if c == nil || c.cgroup == "" {
			continue
		}
		prefix, ok := cgroup.HostPrefix(pp.Container, c.cgroup)
		if !ok {
			continue
		}
		switch {
		case !l.pids.PrefixKnown:
			l.pids.HostPrefix, l.pids.PrefixKnown = prefix, true
			logger.Info("Learned how the kernel prints this node's cgroup paths", "hostPrefix", prefix,
				"nested", prefix != "", "containerID", shortID(pp.ContainerID))
		case prefix != l.pids.HostPrefix && !l.prefixConflict:
			l.prefixConflict = true
			logger.Info("A kernel path names one of this node's containers under another host prefix; keeping the first",
				"hostPrefix", l.pids.HostPrefix, "seen", prefix, "containerID", shortID(pp.ContainerID))
		}
		if p == k.TaskMemcg && pp.Path == pp.Container && k.PID > 0 && c.runtimePID > 0 && k.PID != c.runtimePID &&
			c.procCount == 1 && !l.pids.PIDMismatch {
			l.pids.PIDMismatch = true
			logger.Info("The kernel killed the only process of a container under another PID than the runtime's: "+
				"the runtime's PIDs are not the kernel's; kernel lines that name only a PID are not attributed",
				"kernelPID", k.PID, "runtimePID", c.runtimePID, "containerID", shortID(pp.ContainerID))
		}
	}
}

// KernelStatus is a summary of the kernel's evidence (Kernel), for logs and tests: how
// many kills are kept, and what they taught about the node's PIDs and cgroup paths.
type KernelStatus struct {
	Kills int
	PIDs  classify.PIDFacts
}

// Kernel returns the summary of the kernel's evidence.
func (l *Ledger) Kernel() KernelStatus {
	l.mu.Lock()
	defer l.mu.Unlock()
	return KernelStatus{Kills: len(l.evidence.kernel.recs), PIDs: l.pids}
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}
