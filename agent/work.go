package agent

// The work: a worker takes an item from the queue and runs it. A container's item goes
// from the ledger (its state) to its pod (podwait.go), to its classification
// (agent/classify, on a snapshot taken from the ledger), to its claim in the ledger and
// its stamps (stamps.go); a pod's item is the pod-level decision (podsync.go).

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/coroner-dev/coroner/agent/classify"
	"github.com/coroner-dev/coroner/agent/ledger"
	"github.com/coroner-dev/coroner/agent/stamper"
)

// processNext handles one work item; false once the queue is shut down.
func (a *Agent) processNext(ctx context.Context) bool {
	it, shutdown := a.queue.Get()
	if shutdown {
		return false
	}
	a.busy.Add(1)
	defer a.busy.Add(-1)
	defer a.queue.Done(it)
	switch it.kind {
	case itemPod:
		a.syncPod(types.UID(it.id))
	case itemDevice:
		a.processDevice(ctx, it.id)
	case itemDevicePod:
		a.processDevicePod(types.UID(it.id))
	default:
		a.processContainer(ctx, it)
	}
	return true
}

// processContainer classifies a container's exit (itemExit) or an OOM kill in it that it
// may survive (itemOOM), and hands the stamps to the stamper, in this order:
//
//  1. the ledger says whether the item still has work (Pending), and who the container is;
//  2. its pod is found (podFor), or the item waits or is dropped;
//  3. the kernel log's backlog is read (or the item waits for it);
//  4. a snapshot of the container's state is taken from the ledger and classified
//     (classify.ClassifyOOM) without a lock;
//  5. the item waits once for late evidence (KernelWait), or the ledger claims it
//     (FinishExit, FinishOOM) and says what to count;
//  6. the verdict's stamps (stamps.go) go to the stamper, and an exit queues its pod's
//     decision (podsync.go) and, for a pod holding devices, its device verdict
//     (devices.go).
//
// An OOM kill of a container that keeps running is stamped only when its verdict is a
// limit OOM (coroner.dev/OOMKilled: the workload went over its own limit, whether its
// main process died or a child did); a node OOM is stamped at the container's exit, if
// it exits, since a DisruptionTarget on a pod that goes on running would claim a
// disruption that is not happening. The exit history (A5) records exits only.
func (a *Agent) processContainer(ctx context.Context, it item) {
	kind := it.ledgerItem()
	ev, ok := a.ledger.Pending(it.id, kind)
	if !ok {
		return
	}
	logger := a.logger.WithValues("pod", klog.KRef(ev.PodNamespace, ev.PodName), "container", ev.ContainerName, "containerID", shortID(ev.ContainerID))

	pod := a.podFor(ctx, logger, ev, it)
	if pod == nil {
		return
	}

	now := a.clock.Now()
	if !a.draining.Load() && a.waitKernelBacklog(now) {
		// The kernel log's backlog is being read: it may hold this container's kill,
		// logged before the agent started.
		a.queue.AddAfter(it, 50*time.Millisecond)
		return
	}
	snap, ok := a.ledger.Snapshot(it.id, kind)
	if !ok {
		return
	}
	v := classify.ClassifyOOM(snap.Facts)
	if waitForEvidence(v, snap.Facts, it.kind, a.cfg.Kernel != nil) && !snap.KernelWaited && !a.draining.Load() {
		// The kernel's report is the best evidence; its reader may be a moment behind.
		a.ledger.KernelWait(it.id, kind)
		a.queue.AddAfter(it, a.cfg.KernelWait)
		return
	}
	ref := stamper.PodRef{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID}

	var reqs []stamper.Request
	var claim ledger.ExitClaim
	switch it.kind {
	case itemExit:
		var ok bool
		claim, ok = a.ledger.FinishExit(it.id, now, a.started, v.Kind == classify.UnknownOOM)
		if !ok {
			return
		}
		reqs = a.exitClassified(logger, pod, ref, v, snap.Facts, claim, now)
	case itemOOM:
		claim, ok := a.ledger.FinishOOM(it.id, v.Kind == classify.UnknownOOM)
		if !ok {
			// The exit was classified meanwhile, with these OOM events as evidence.
			return
		}
		reqs = a.oomClassified(logger, pod, ref, v, ev, claim, now)
	}
	a.stamper.Add(reqs...)
	if it.kind == itemExit {
		a.queue.Add(podItem(pod.UID))
		a.startDevice(pod, claim.Exit)
	}
}

// KernelBacklogWait bounds the wait for the kernel log's backlog at the start (see
// Config.KernelCaughtUp).
const KernelBacklogWait = 5 * time.Second

// waitKernelBacklog reports whether a classification should wait for the kernel log's
// backlog: it has not been consumed yet, and the start was less than
// KernelBacklogWait ago.
func (a *Agent) waitKernelBacklog(now time.Time) bool {
	return !a.kernelReady.Load() && now.Sub(a.started) < KernelBacklogWait
}

// waitForEvidence reports whether a verdict may still change with evidence that can come
// late: the kernel's report of an OOM kill (its reader may be a moment behind; only with
// a kernel log), or any evidence of an OOM kill for a SIGKILLed exit.
func waitForEvidence(v classify.Verdict, f classify.OOMFacts, kind itemKind, kernelLog bool) bool {
	if v.Kind != classify.NotOOM && kernelLog && !kernelSeen(f) {
		return true
	}
	// A SIGKILL with no evidence of an OOM kill yet may still be one whose evidence
	// trails the exit: containerd's TaskOOM event comes on a stream of its own, and the
	// runtime can report the exit before its OOM notice (bench-beside on kind: 1 limit OOM
	// of 400 classified NotOOM at its exit, never stamped).
	return v.Kind == classify.NotOOM && kind == itemExit && f.ExitCode == 137
}

// kernelSeen reports whether a kernel OOM kill of the container has been read: one
// that ClassifyOOM takes for the container's.
func kernelSeen(f classify.OOMFacts) bool {
	return len(classify.MatchKills(f)) > 0
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}
