package classify

// PIDFacts is what a node agent knows about whose numbering the PIDs it holds are in,
// for TrustedPIDs. The zero value is an agent that knows nothing: not in the init PID
// namespace, no host prefix learned, no contradiction seen.
type PIDFacts struct {
	// InitNamespace: the agent runs in the init PID namespace (hostPID; its
	// /proc/self/ns/pid is PROC_PID_INIT_INO, 0xEFFFFFFC), so the PIDs it reads from a
	// cgroup's cgroup.procs are the kernel's. Elsewhere cgroup.procs lists the
	// processes in the agent's own numbering, 0 for those it cannot see.
	InitNamespace bool
	// HostPrefix is the prefix the kernel prints before the runtime's cgroup paths
	// (cgroup.HostPrefix), learned from a kernel line that named one of the node's
	// containers by its cgroup; PrefixKnown says whether it was learned. A non-empty
	// prefix means the runtime sees its cgroups through a cgroup namespace of its
	// own: a nested node (kind, LXC), whose runtime is also in a PID namespace of its
	// own.
	HostPrefix  string
	PrefixKnown bool
	// PIDMismatch: a kernel line that named one of the node's containers by its
	// cgroup killed a PID other than the runtime's PID of that container while the
	// container had a single process, its init: the runtime's PIDs are not the
	// kernel's.
	PIDMismatch bool
}

// Nested reports whether the node is evidently nested: its kernel paths carry a host
// prefix, or its runtime's PIDs were seen not to be the kernel's.
func (p PIDFacts) Nested() bool {
	return (p.PrefixKnown && p.HostPrefix != "") || p.PIDMismatch
}

// TrustedPIDs returns the PIDs of a container that may match a kernel kill line naming
// only a PID ("Memory cgroup out of memory: Killed process <pid> (<comm>) ..." or "Out
// of memory: Killed process ...", all that is left of an OOM report when the kernel
// rate limits the report's header and summary, ten per five seconds). The kernel
// prints PIDs in the init PID namespace. A PID in any other numbering is a number that
// may be any process of the host, on a shared kernel another node's (kind runs every
// node on one kernel, and each node's /dev/kmsg shows all their kills), so a match on
// it would stamp a pod with another pod's death. Hence:
//
//   - On an evidently nested node (Nested) no PID is trusted: a PID-only line is never
//     attributed, and the container's memory cgroup counters (oom_kill, oom, failcnt;
//     ClassifyOOM's rules 2 to 4) are the evidence instead. Kernel lines that name a
//     cgroup are matched by it (container ID, pod UID, path with the host prefix).
//   - Otherwise the runtime's PID of the container's init process (cri.ContainerEvent.PID)
//     is trusted: on an ordinary node the runtime runs in the init PID namespace, so a
//     rate-limited report of an ordinary node is still attributed.
//   - The PIDs read from the container's cgroup.procs are trusted only when the agent
//     runs in the init PID namespace; without hostPID (the DaemonSet's default) they
//     are the agent's own numbering, or 0.
//
// Until a first full report of one of its containers shows the node nested, a nested
// node's runtime PIDs are trusted; ClassifyOOM still never lets a PID-only kill say
// where an OOM happened (it has no oom_memcg), only that one happened.
func TrustedPIDs(p PIDFacts, runtimePID int, cgroupPIDs []int) []int {
	if p.Nested() {
		return nil
	}
	var out []int
	if runtimePID > 0 {
		out = append(out, runtimePID)
	}
	if p.InitNamespace {
		for _, pid := range cgroupPIDs {
			if pid > 0 && !containsPID(out, pid) {
				out = append(out, pid)
			}
		}
	}
	return out
}
