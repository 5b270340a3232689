package classify

// The kernel's reports of OOM kills, matched to a container (by PID, cgroup path and
// time) and placed inside or above its pod.

import (
	"fmt"
	"strings"
	"time"

	"github.com/coroner-dev/coroner/agent/cgroup"
	"github.com/coroner-dev/coroner/agent/kmsg"
)

// relevantKills returns the kernel kills of this container's processes:
//
//   - a kill that names a cgroup (task_memcg, or the cgroup of a
//     memory.oom.group kill) is the container's when that cgroup is the
//     container's cgroup or below it (the runtime's path, with the host
//     prefix when known), or holds the container's ID; it is never matched
//     by PID, since the cgroup it names says whose it is (on a shared kernel,
//     kind's, another node's container may have a PID that is one of ours in
//     another numbering). When the container's cgroup and ID are both
//     unknown, it is matched by PID as below;
//   - any other kill is the container's when its PID is one of PIDs (the
//     trusted ones, see TrustedPIDs) and it happened during the container's
//     life (give or take kernelSlack, when the times are known);
//   - a kill whose oom_memcg cannot be an ancestor of the container's cgroup
//     (another pod's cgroup, or with a known host prefix a cgroup that is
//     not above the container's) is not the container's, however matched.
func relevantKills(f OOMFacts) []kmsg.OOMKill {
	identity := f.ContainerCgroup != "" || f.ContainerID != ""
	mine := func(p string) bool {
		if p == "" {
			return false
		}
		if f.ContainerCgroup != "" && (cgroup.Within(p, f.ContainerCgroup) ||
			f.PrefixKnown && cgroup.Within(p, cgroup.WithPrefix(f.KernelPrefix, f.ContainerCgroup))) {
			return true
		}
		id, ok := cgroup.ContainerIDFromPath(p)
		return ok && f.ContainerID != "" && sameContainerID(id, f.ContainerID)
	}
	var out []kmsg.OOMKill
	for _, k := range f.Kernel {
		var ok bool
		switch {
		case (k.TaskMemcg != "" || k.GroupMemcg != "") && identity:
			ok = mine(k.TaskMemcg) || mine(k.GroupMemcg)
		default:
			ok = k.PID != 0 && containsPID(f.PIDs, k.PID) && during(k.Time, f)
		}
		if ok && !impossibleKiller(k, f) {
			out = append(out, k)
		}
	}
	return out
}

// impossibleKiller reports a kill whose oom_memcg cannot have killed a process
// of this container: the OOM killer of a memory cgroup kills only in that
// cgroup's subtree, so its oom_memcg is the container's cgroup or an ancestor.
// A pod cgroup of another pod, or, with the host prefix known and the
// container's cgroup known, a cgroup that is not an ancestor of the kernel's
// path of the container's cgroup, is impossible.
func impossibleKiller(k kmsg.OOMKill, f OOMFacts) bool {
	if k.OOMMemcg == "" {
		return false
	}
	p := cgroup.ParsePath(k.OOMMemcg)
	podUID := firstNonEmpty(f.PodUID, cgroup.ParsePath(f.PodCgroup).PodUID, cgroup.ParsePath(f.ContainerCgroup).PodUID)
	if p.PodUID != "" && podUID != "" && !cgroup.SameUID(p.PodUID, podUID) {
		return true
	}
	if len(p.ContainerID) == 64 && f.ContainerID != "" && !sameContainerID(p.ContainerID, f.ContainerID) {
		return true
	}
	if f.PrefixKnown && f.ContainerCgroup != "" {
		return !cgroup.Within(cgroup.WithPrefix(f.KernelPrefix, f.ContainerCgroup), k.OOMMemcg)
	}
	return false
}

// MatchKills returns the kernel kills ClassifyOOM takes for the container's
// (see relevantKills): the agent waits for one before classifying.
func MatchKills(f OOMFacts) []kmsg.OOMKill { return relevantKills(f) }

// sameContainerID compares full or abbreviated (at least 12 digits)
// container IDs.
func sameContainerID(a, b string) bool {
	if a == b {
		return a != ""
	}
	if len(a) > len(b) {
		a, b = b, a
	}
	return len(a) >= 12 && strings.HasPrefix(b, a)
}

func containsPID(pids []int, pid int) bool {
	for _, p := range pids {
		if p == pid {
			return true
		}
	}
	return false
}

func during(t time.Time, f OOMFacts) bool {
	if t.IsZero() {
		return true
	}
	if !f.StartedAt.IsZero() && t.Before(f.StartedAt.Add(-kernelSlack)) {
		return false
	}
	if !f.FinishedAt.IsZero() && t.After(f.FinishedAt.Add(kernelSlack)) {
		return false
	}
	return true
}

type place int

const (
	unplaced place = iota
	inPod
	abovePod
	otherPod
)

// placeOf says where a kill's OOM happened relative to the pod. A kill of
// one of the container's processes can only come from the container's own
// cgroup or an ancestor of it, so an oom_memcg that names a pod names this
// pod (inPod, at the pod or a container), and one that names no pod is above
// the pod (abovePod). A pod cgroup of another pod (otherPod) means the facts
// contradict each other, and the kill is not used.
func placeOf(k kmsg.OOMKill, f OOMFacts, podUID string) place {
	switch {
	case k.Scope == kmsg.ScopeGlobal:
		return abovePod
	case k.OOMMemcg == "":
		return unplaced
	}
	p := cgroup.ParsePath(k.OOMMemcg)
	switch {
	case p.PodUID != "" && (podUID == "" || cgroup.SameUID(p.PodUID, podUID)):
		return inPod
	case p.PodUID != "":
		return otherPod
	case f.PodCgroup != "" && (cgroup.Within(k.OOMMemcg, f.PodCgroup) ||
		f.PrefixKnown && cgroup.Within(k.OOMMemcg, cgroup.WithPrefix(f.KernelPrefix, f.PodCgroup))):
		return inPod // a layout without pod<uid> elements
	}
	return abovePod
}

// decisiveKill picks the kill that places the OOM: among the kills that
// place it, the kill of one of PIDs, else the last. conflict reports kills
// that place it differently.
func decisiveKill(kills []kmsg.OOMKill, f OOMFacts, podUID string) (k kmsg.OOMKill, conflict, ok bool) {
	var placed []kmsg.OOMKill
	for _, k := range kills {
		if pl := placeOf(k, f, podUID); pl == inPod || pl == abovePod {
			placed = append(placed, k)
		}
	}
	if len(placed) == 0 {
		return kmsg.OOMKill{}, false, false
	}
	k = placed[len(placed)-1]
	for _, c := range placed {
		if containsPID(f.PIDs, c.PID) {
			k = c
		}
	}
	for _, c := range placed {
		if placeOf(c, f, podUID) != placeOf(k, f, podUID) {
			conflict = true
		}
	}
	return k, conflict, true
}

func describeKill(k kmsg.OOMKill) string {
	var b strings.Builder
	fmt.Fprintf(&b, "kernel %s OOM kill of pid %d (%s)", k.Scope, k.PID, k.Task)
	if k.Constraint != "" {
		b.WriteString(" " + k.Constraint)
	}
	if k.OOMMemcg != "" {
		b.WriteString(" oom_memcg=" + k.OOMMemcg)
	}
	return b.String()
}
