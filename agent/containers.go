package agent

import (
	"context"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/coroner-dev/coroner/agent/cgroup"
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
	cgPath, podPath, first := a.table.see(ev, a.logger)
	if ev.Kind != cri.Started && ev.Kind != cri.OOM && ev.Kind != cri.Exited {
		return
	}
	m, pm := a.readCgroup(cgPath), a.readCgroup(podPath)
	r := reading{mem: m, pod: pm, pids: readPIDs(m)}
	switch ev.Kind {
	case cri.Started:
		// A container first seen running that had a process OOM-killed unseen is
		// classified as an OOM event of its own.
		if a.table.started(ev, now, r, first) {
			a.queue.Add(item{kind: itemOOM, id: ev.ContainerID})
		}
	case cri.OOM:
		if a.table.oomEvent(ev, now, r) {
			a.queue.Add(item{kind: itemOOM, id: ev.ContainerID})
		}
	case cri.Exited:
		a.table.exited(ev, r)
		a.queue.Add(item{kind: itemExit, id: ev.ContainerID})
	}
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
