package agent

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/coroner-dev/coroner/agent/classify"
	"github.com/coroner-dev/coroner/agent/exithistory"
	"github.com/coroner-dev/coroner/agent/metrics"
	"github.com/coroner-dev/coroner/agent/stamper"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/cri"
)

// apiCheckTimeout bounds the GET that asks whether a pod missing from the cache exists.
const apiCheckTimeout = 10 * time.Second

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
	default:
		a.processContainer(ctx, it)
	}
	return true
}

// processContainer classifies a container's exit (itemExit) or an OOM kill in it that it
// may survive (itemOOM), and hands the stamps to the stamper. Once the item's pod is
// found (podFor) and the kernel log's backlog read, it takes a snapshot of the
// container's state from the table, classifies it without a lock, and either waits once
// for late evidence or claims the item (finishExit, finishOOM) and requests its stamps.
//
// An OOM kill of a container that keeps running is stamped only when its verdict is a
// limit OOM (coroner.dev/OOMKilled: the workload went over its own limit, whether its
// main process died or a child did); a node OOM is stamped at the container's exit, if
// it exits, since a DisruptionTarget on a pod that goes on running would claim a
// disruption that is not happening. The exit history (A5) records exits only.
func (a *Agent) processContainer(ctx context.Context, it item) {
	ev, ok := a.table.pending(it.id, it.kind)
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
	snap, ok := a.table.snapshot(it.id, it.kind)
	if !ok {
		return
	}
	v := classify.ClassifyOOM(snap.facts)
	if waitForEvidence(v, snap.facts, it.kind, a.cfg.Kernel != nil) && !snap.kernelWaited && !a.draining.Load() {
		// The kernel's report is the best evidence; its reader may be a moment behind.
		a.table.kernelWait(it.id, it.kind)
		a.queue.AddAfter(it, a.cfg.KernelWait)
		return
	}
	ref := stamper.PodRef{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID}

	var reqs []stamper.Request
	switch it.kind {
	case itemExit:
		claim, ok := a.table.finishExit(it.id, now, a.started, v.Kind == classify.UnknownOOM)
		if !ok {
			return
		}
		reqs = a.exitClassified(logger, pod, ref, v, snap.facts, claim, now)
	case itemOOM:
		claim, ok := a.table.finishOOM(it.id, v.Kind == classify.UnknownOOM)
		if !ok {
			// The exit was classified meanwhile, with these OOM events as evidence.
			return
		}
		reqs = a.oomClassified(logger, pod, ref, v, ev, claim, now)
	}
	a.stamper.Add(reqs...)
	if it.kind == itemExit {
		a.queue.Add(item{kind: itemPod, id: string(pod.UID)})
	}
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

// exitClassified counts a claimed exit's verdict, logs it and returns its stamps: the
// verdict's and the exit history's.
func (a *Agent) exitClassified(logger klog.Logger, pod *corev1.Pod, ref stamper.PodRef, v classify.Verdict,
	facts classify.OOMFacts, claim exitClaim, now time.Time) []stamper.Request {
	a.metrics.Exit(string(v.Kind))
	if claim.countUnknown {
		a.metrics.Unknown()
	}
	// An exit from before the agent started (the first relist replays them) is
	// classified like any other: the runtime's reason, and the kernel's kill line, read
	// from the oldest record of the ring buffer (Config.KernelCaughtUp), place it; its
	// cgroup is gone. It is not counted as an OOM kill nobody could place (finishExit):
	// an earlier run of the agent may have counted it already.
	x := claim.exit
	e := classify.Exit{Container: x.ContainerName, ContainerID: x.ContainerID, ExitCode: x.ExitCode, Reason: x.Reason,
		StartedAt: x.StartedAt, FinishedAt: x.FinishedAt, RestartCount: int32(x.Attempt)}
	at := nonZero(x.FinishedAt, x.ObservedAt)
	var reqs []stamper.Request
	for _, s := range classify.StampsForExit(pod, v, e, now, classify.ExitOptions{History: a.history}) {
		r := stamper.Request{Pod: ref, Stamp: s, EventTime: at, ObservedTime: x.ObservedAt}
		if s.Kind == classify.KindExitHistory {
			r.History = &exithistory.Entry{Container: e.Container, ExitCode: e.ExitCode, Reason: e.Reason,
				FinishedAt: e.FinishedAt, RestartCount: e.RestartCount, OOM: oomField(v.Kind)}
		}
		reqs = append(reqs, r)
	}
	logger.V(2).Info("Container exit classified", "exitCode", x.ExitCode, "reason", x.Reason, "verdict", verdictName(v.Kind),
		"basis", v.Basis, "evidence", v.Evidence, "stamps", len(reqs), "source", x.Source)
	if v.Kind == classify.NotOOM && x.ExitCode == 137 && facts.MemoryLimit > 0 && facts.PeakUsage*100 >= facts.MemoryLimit*99 {
		// Killed at its limit, and yet no evidence of an OOM kill came: say so, since
		// such an exit is stamped nothing and a pod failure policy that waits for
		// coroner.dev/OOMKilled counts it as an ordinary failure.
		logger.Info("Container was SIGKILLed with its memory at its limit, but no evidence of an OOM kill came (no runtime reason, no containerd OOM event, no kill counter, no kernel report); stamping nothing",
			"limit", facts.MemoryLimit, "peak", facts.PeakUsage, "waited", a.cfg.KernelWait)
	}
	if v.Kind == classify.UnknownOOM {
		if claim.replay && conditions.Find(&pod.Status, conditions.OOMKilled) != nil {
			// Stamped by an earlier run of the agent, which had the evidence.
			logger.V(2).Info("Container was OOM-killed before the agent started; an earlier run stamped it", "evidence", v.Evidence)
		} else {
			logger.Info("Container was OOM-killed but nothing says whose limit it was; stamping nothing", "evidence", v.Evidence, "replay", claim.replay)
		}
	}
	return reqs
}

// oomClassified counts the verdict of claimed OOM events of a container that may still
// run, logs it and returns its stamp: coroner.dev/OOMKilled of a limit OOM, else none.
// ev is the container's last event when the item was taken.
func (a *Agent) oomClassified(logger klog.Logger, pod *corev1.Pod, ref stamper.PodRef, v classify.Verdict,
	ev cri.ContainerEvent, claim oomClaim, now time.Time) []stamper.Request {
	if claim.countUnknown {
		a.metrics.Unknown()
	}
	var reqs []stamper.Request
	if v.Kind == classify.LimitOOM {
		e := classify.Exit{Container: ev.ContainerName, ContainerID: ev.ContainerID, StartedAt: ev.StartedAt,
			FinishedAt: claim.last, RestartCount: int32(ev.Attempt)}
		// When the runtime watcher had the first OOM event is known only when it is
		// the container's last event, read when the item was taken (an event after it,
		// the exit usually, replaces its time): else zero, and no stage latencies.
		var observed time.Time
		if ev.Kind == cri.OOM && ev.OOMAt.Equal(claim.first) {
			observed = ev.ObservedAt
		}
		for _, s := range classify.StampsForExit(pod, v, e, now, classify.ExitOptions{History: a.history}) {
			if s.Kind == classify.KindLimitOOM {
				reqs = append(reqs, stamper.Request{Pod: ref, Stamp: s, EventTime: claim.first, ObservedTime: observed})
			}
		}
	}
	logger.V(2).Info("OOM kill classified", "verdict", verdictName(v.Kind), "basis", v.Basis, "evidence", v.Evidence, "stamps", len(reqs))
	return reqs
}

// podFor returns the container's pod from the cache. When it is not there, it decides
// between a pod not in the cache yet (retry shortly), a pod deleted or bound to another
// node (drop, counted), and a pod the cache is far behind on (retry, up to PodWaitMax).
// It returns nil when the item was re-queued or dropped. ev is the container's last
// event.
func (a *Agent) podFor(ctx context.Context, logger klog.Logger, ev cri.ContainerEvent, it item) *corev1.Pod {
	uid := types.UID(ev.PodUID)
	if pod := a.podByUID(uid); pod != nil {
		return pod
	}
	now := a.clock.Now()
	if reason, gone := a.goneReason(uid); gone {
		a.drop(logger, it, reason, now)
		return nil
	}
	first, checked := a.table.awaitPod(it.id, it.kind, now)

	waited := now.Sub(first)
	switch {
	case waited > a.cfg.PodWaitMax:
		a.drop(logger, it, metrics.DroppedNotInCache, now)
		return nil
	case waited < a.cfg.PodCacheWait:
		// Not in the cache yet: the pod's watch event is usually a moment away.
		a.queue.AddAfter(it, min(max(waited/2, 50*time.Millisecond), 500*time.Millisecond))
		return nil
	case checked:
		a.queue.AddAfter(it, time.Second)
		return nil
	}
	reason, err := a.checkPod(ctx, ev)
	if err != nil {
		logger.Error(err, "Cannot tell whether the container's pod exists; retrying")
		a.queue.AddAfter(it, time.Second)
		return nil
	}
	if reason != "" {
		a.mu.Lock()
		a.gone[uid] = goneRecord{reason: reason, at: now}
		a.mu.Unlock()
		a.drop(logger, it, reason, now)
		return nil
	}
	a.table.podConfirmed(it.id)
	logger.V(2).Info("The pod exists on this node but is not in the cache yet; waiting", "waited", waited)
	a.queue.AddAfter(it, time.Second)
	return nil
}

// goneReason returns why the events of a pod known not to be this node's to write are
// dropped.
func (a *Agent) goneReason(uid types.UID) (string, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	g, ok := a.gone[uid]
	return g.reason, ok
}

// checkPod asks the API server about a container's pod: "" when it exists on this node,
// else the reason to drop its events.
func (a *Agent) checkPod(ctx context.Context, ev cri.ContainerEvent) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, apiCheckTimeout)
	defer cancel()
	pod, err := a.cfg.Client.CoreV1().Pods(ev.PodNamespace).Get(ctx, ev.PodName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return metrics.DroppedPodGone, nil
	case err != nil:
		return "", err
	case string(runtimeUID(pod)) != ev.PodUID && string(pod.UID) != ev.PodUID:
		// Re-created under the same name (a static pod's mirror pod says its node
		// UID in an annotation).
		return metrics.DroppedPodGone, nil
	case pod.Spec.NodeName != a.cfg.NodeName:
		return metrics.DroppedOtherNode, nil
	}
	return "", nil
}

// drop gives up on an item, counted by reason; the runtime's states of a pod that is
// gone or not this node's are forgotten.
func (a *Agent) drop(logger klog.Logger, it item, reason string, now time.Time) {
	a.table.drop(it.id, it.kind, now, reason != metrics.DroppedNotInCache)
	a.metrics.Dropped(reason)
	logger.V(2).Info("Leaving the container's event alone", "event", it.kind.String(), "reason", reason)
}

// kernelSeen reports whether a kernel OOM kill of the container has been read: one
// that ClassifyOOM takes for the container's.
func kernelSeen(f classify.OOMFacts) bool {
	return len(classify.MatchKills(f)) > 0
}

// syncPod makes the pod-level decision (A3, A4) and schedules the next one.
func (a *Agent) syncPod(uid types.UID) {
	pod := a.podByUID(uid)
	if pod == nil {
		return
	}
	now := a.clock.Now()
	// The runtime's states are kept by the UID the runtime knows the pod by (a static
	// pod's config hash, when uid is its mirror pod's).
	uids := []types.UID{runtimeUID(pod)}
	if runtimeUID(pod) != pod.UID {
		uids = append(uids, pod.UID)
	}
	observed := a.table.observedStates(uids...)
	d := classify.StampsForPod(pod, observed, now, a.cfg.PhaseGrace)
	if !d.RecheckAt.IsZero() {
		a.queue.AddAfter(item{kind: itemPod, id: string(uid)}, max(d.RecheckAt.Sub(now), 0))
	}
	logger := a.logger.WithValues("pod", klog.KObj(pod))
	if len(d.Stamps) == 0 {
		logger.V(4).Info("No pod-level stamp due", "why", d.Why, "recheckAt", d.RecheckAt)
		return
	}
	ref := stamper.PodRef{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID}
	a.mu.Lock()
	reasonSeen := a.reasonSeen[uid]
	a.mu.Unlock()
	var reqs []stamper.Request
	for _, s := range d.Stamps {
		r := stamper.Request{Pod: ref, Stamp: s}
		if s.Phase != "" {
			// The latency counts from when the pod was both deleted and stopped: the
			// grace is part of it.
			r.EventTime = stoppedAt(pod, observed)
		} else {
			r.EventTime = nonZero(reasonSeen, now)
		}
		reqs = append(reqs, r)
	}
	logger.V(2).Info("Pod-level stamp due", "stamps", len(reqs), "kind", d.Stamps[0].Kind, "reason", d.Stamps[0].Reason)
	a.stamper.Add(reqs...)
}

// stoppedAt is when a pod became both stopped (its last container exit) and, when it is
// being deleted, deleted: the reference time of a terminal phase decision.
func stoppedAt(pod *corev1.Pod, observed []classify.ContainerState) time.Time {
	var t time.Time
	for _, s := range append(classify.ContainerStatesFromPod(pod), observed...) {
		if s.FinishedAt.After(t) {
			t = s.FinishedAt
		}
	}
	if dt := pod.DeletionTimestamp; dt != nil {
		ds := dt.Time
		if pod.DeletionGracePeriodSeconds != nil {
			ds = ds.Add(-time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second)
		}
		if ds.After(t) {
			t = ds
		}
	}
	return t
}

func oomField(k classify.OOMKind) string {
	switch k {
	case classify.LimitOOM:
		return exithistory.OOMLimit
	case classify.NodeOOM:
		return exithistory.OOMNode
	case classify.UnknownOOM:
		return exithistory.OOMUnknown
	}
	return ""
}

func verdictName(k classify.OOMKind) string {
	if k == classify.NotOOM {
		return metrics.VerdictNotOOM
	}
	return string(k)
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}
