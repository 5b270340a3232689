package agent

// The kernel's OOM kills and NVIDIA Xid reports in: the kernel log reader's feed into the
// ledger (its evidence; Xids through gpus.go), and the mark that its backlog has been read
// (kernelReady), which classifications wait for (work.go, devices.go).

import (
	"context"

	"github.com/coroner-dev/coroner/agent/kmsg"
)

// consumeKernel keeps the kernel's OOM kills and Xid reports until ctx is done. (An OOM kill whose line
// has not been read yet when it is classified waits for it once: see Config.KernelWait.)
// When Config.KernelCaughtUp is closed, the kills already buffered (the rest of the
// backlog) are taken at once, then the agent is kernelReady.
func (a *Agent) consumeKernel(ctx context.Context) {
	caughtUp := a.cfg.KernelCaughtUp
	xids := a.cfg.Xids
	var backlog, backlogXids int
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
				case x, ok := <-xids:
					if !ok {
						xids = nil
						continue
					}
					a.addXid(x)
					backlogXids++
				default:
					drained = true
				}
			}
			a.setKernelReady()
			a.logger.Info("Read the kernel log's backlog", "oomKills", backlog, "xids", backlogXids)
		case k, ok := <-a.cfg.Kernel:
			if !ok {
				return
			}
			a.addKill(k)
			if caughtUp != nil {
				backlog++
			}
		case x, ok := <-xids:
			if !ok {
				xids = nil
				continue
			}
			a.addXid(x)
			if caughtUp != nil {
				backlogXids++
			}
		}
	}
}

func (a *Agent) addKill(k kmsg.OOMKill) {
	a.ledger.LearnKill(k, a.clock.Now(), a.logger)
	a.logger.V(2).Info("Kernel OOM kill", "pid", k.PID, "task", k.Task, "scope", k.Scope.String(),
		"oomMemcg", k.OOMMemcg, "taskMemcg", k.TaskMemcg, "time", k.Time)
}

func (a *Agent) setKernelReady() { a.kernelReady.Store(true) }
