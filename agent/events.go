package agent

// The runtime's events in: each container event is recorded in the ledger, with its
// cgroups read as early as possible, and what the ledger says is to be classified is
// queued (work.go).

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/coroner-dev/coroner/agent/cgroup"
	"github.com/coroner-dev/coroner/agent/ledger"
	"github.com/coroner-dev/coroner/cri"
)

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

// handleEvent records one container event and queues its classification:
//
//  1. the ledger takes the event's identity and says which cgroups are the container's
//     and its pod's (a Started, OOM or Exited event goes on);
//  2. they are read now, outside the ledger's lock: a container's cgroup goes away soon
//     after it exits;
//  3. the ledger records the reading and says what is to be classified: the exit, or OOM
//     events (containerd's, or a kill the container's cgroup counted before it was first
//     seen), which is queued.
func (a *Agent) handleEvent(ev cri.ContainerEvent) {
	if ev.ContainerID == "" || ev.PodUID == "" {
		return
	}
	now := a.clock.Now()
	seen := a.ledger.Observe(ev, a.logger)
	if !ledger.Reads(ev.Kind) {
		return
	}
	r := a.readCgroups(seen)
	if kind, ok := a.ledger.Record(ev, seen.First, now, r); ok {
		a.queue.Add(containerItem(kind, ev.ContainerID))
	}
}

// readCgroups reads the memory controllers of a container's and its pod's cgroups, and
// the container's cgroup.procs.
func (a *Agent) readCgroups(seen ledger.Seen) ledger.Reading {
	m, pm := a.readCgroup(seen.Cgroup), a.readCgroup(seen.PodCgroup)
	return ledger.Reading{Mem: m, Pod: pm, PIDs: readPIDs(m)}
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
