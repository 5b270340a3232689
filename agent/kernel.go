package agent

// The kernel's OOM kills: the kernel log reader's feed, kept in the container table to be
// matched to containers, and what they teach about the node's cgroup paths and PIDs.

import (
	"context"
	"time"

	"k8s.io/klog/v2"

	"github.com/coroner-dev/coroner/agent/cgroup"
	"github.com/coroner-dev/coroner/agent/kmsg"
)

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
	a.table.addKill(k, a.clock.Now(), a.logger)
	a.logger.V(2).Info("Kernel OOM kill", "pid", k.PID, "task", k.Task, "scope", k.Scope.String(),
		"oomMemcg", k.OOMMemcg, "taskMemcg", k.TaskMemcg, "time", k.Time)
}

func (a *Agent) setKernelReady() { a.kernelReady.Store(true) }

// waitKernelBacklog reports whether a classification should wait for the kernel log's
// backlog: it has not been consumed yet, and the start was less than
// KernelBacklogWait ago.
func (a *Agent) waitKernelBacklog(now time.Time) bool {
	return !a.kernelReady.Load() && now.Sub(a.started) < KernelBacklogWait
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
// teaches nothing. t.mu is held.
func (t *containerTable) learnLocked(logger klog.Logger, k kmsg.OOMKill) {
	for _, p := range []string{k.TaskMemcg, k.GroupMemcg} {
		pp := cgroup.ParsePath(p)
		if pp.ContainerID == "" {
			continue
		}
		c := t.containers[pp.ContainerID]
		if c == nil || c.cgroup == "" {
			continue
		}
		prefix, ok := cgroup.HostPrefix(pp.Container, c.cgroup)
		if !ok {
			continue
		}
		switch {
		case !t.pids.PrefixKnown:
			t.pids.HostPrefix, t.pids.PrefixKnown = prefix, true
			logger.Info("Learned how the kernel prints this node's cgroup paths", "hostPrefix", prefix,
				"nested", prefix != "", "containerID", shortID(pp.ContainerID))
		case prefix != t.pids.HostPrefix && !t.prefixConflict:
			t.prefixConflict = true
			logger.Info("A kernel path names one of this node's containers under another host prefix; keeping the first",
				"hostPrefix", t.pids.HostPrefix, "seen", prefix, "containerID", shortID(pp.ContainerID))
		}
		if p == k.TaskMemcg && pp.Path == pp.Container && k.PID > 0 && c.runtimePID > 0 && k.PID != c.runtimePID &&
			c.procCount == 1 && !t.pids.PIDMismatch {
			t.pids.PIDMismatch = true
			logger.Info("The kernel killed the only process of a container under another PID than the runtime's: "+
				"the runtime's PIDs are not the kernel's; kernel lines that name only a PID are not attributed",
				"kernelPID", k.PID, "runtimePID", c.runtimePID, "containerID", shortID(pp.ContainerID))
		}
	}
}
