package agent

// Stamping a claimed verdict: what an exit's or OOM events' verdict means for the pod
// (classify.StampsForExit), counted, logged and turned into the stamper's requests.

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/coroner-dev/coroner/agent/classify"
	"github.com/coroner-dev/coroner/agent/ledger"
	"github.com/coroner-dev/coroner/agent/metrics"
	"github.com/coroner-dev/coroner/agent/stamper"
	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/cri"
)

// exitClassified counts a claimed exit's verdict, logs it and returns its stamps: the
// verdict's and the exit history's.
func (a *Agent) exitClassified(logger klog.Logger, pod *corev1.Pod, ref stamper.PodRef, v classify.Verdict,
	facts classify.OOMFacts, claim ledger.ExitClaim, now time.Time) []stamper.Request {
	a.metrics.Exit(string(v.Kind))
	if claim.CountUnknown {
		a.metrics.Unknown()
	}
	// An exit from before the agent started (the first relist replays them) is
	// classified like any other: the runtime's reason, and the kernel's kill line, read
	// from the oldest record of the ring buffer (Config.KernelCaughtUp), place it; its
	// cgroup is gone. It is not counted as an OOM kill nobody could place (ledger.FinishExit):
	// an earlier run of the agent may have counted it already.
	x := claim.Exit
	e := classify.Exit{Container: x.ContainerName, ContainerID: x.ContainerID, ExitCode: x.ExitCode, Reason: x.Reason,
		StartedAt: x.StartedAt, FinishedAt: x.FinishedAt, RestartCount: int32(x.Attempt)}
	at := nonZero(x.FinishedAt, x.ObservedAt)
	var reqs []stamper.Request
	for _, s := range classify.StampsForExit(pod, v, e, now, classify.ExitOptions{History: a.history}) {
		r := stamper.Request{Pod: ref, Stamp: s, EventTime: at, ObservedTime: x.ObservedAt}
		if s.Kind == classify.KindExitHistory {
			r.History = &v1alpha1.Exit{Container: e.Container, ExitCode: e.ExitCode, Reason: e.Reason,
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
		if claim.Replay && conditions.Find(&pod.Status, conditions.OOMKilled) != nil {
			// Stamped by an earlier run of the agent, which had the evidence.
			logger.V(2).Info("Container was OOM-killed before the agent started; an earlier run stamped it", "evidence", v.Evidence)
		} else {
			logger.Info("Container was OOM-killed but nothing says whose limit it was; stamping nothing", "evidence", v.Evidence, "replay", claim.Replay)
		}
	}
	return reqs
}

// oomClassified counts the verdict of claimed OOM events of a container that may still
// run, logs it and returns its stamp: coroner.dev/OOMKilled of a limit OOM, else none.
// ev is the container's last event when the item was taken.
func (a *Agent) oomClassified(logger klog.Logger, pod *corev1.Pod, ref stamper.PodRef, v classify.Verdict,
	ev cri.ContainerEvent, claim ledger.OOMClaim, now time.Time) []stamper.Request {
	if claim.CountUnknown {
		a.metrics.Unknown()
	}
	var reqs []stamper.Request
	if v.Kind == classify.LimitOOM {
		e := classify.Exit{Container: ev.ContainerName, ContainerID: ev.ContainerID, StartedAt: ev.StartedAt,
			FinishedAt: claim.Last, RestartCount: int32(ev.Attempt)}
		// When the runtime watcher had the first OOM event is known only when it is
		// the container's last event, read when the item was taken (an event after it,
		// the exit usually, replaces its time): else zero, and no stage latencies.
		var observed time.Time
		if ev.Kind == cri.OOM && ev.OOMAt.Equal(claim.First) {
			observed = ev.ObservedAt
		}
		for _, s := range classify.StampsForExit(pod, v, e, now, classify.ExitOptions{History: a.history}) {
			if s.Kind == classify.KindLimitOOM {
				reqs = append(reqs, stamper.Request{Pod: ref, Stamp: s, EventTime: claim.First, ObservedTime: observed})
			}
		}
	}
	logger.V(2).Info("OOM kill classified", "verdict", verdictName(v.Kind), "basis", v.Basis, "evidence", v.Evidence, "stamps", len(reqs))
	return reqs
}

func oomField(k classify.OOMKind) string {
	switch k {
	case classify.LimitOOM:
		return v1alpha1.ExitOOMLimit
	case classify.NodeOOM:
		return v1alpha1.ExitOOMNode
	case classify.UnknownOOM:
		return v1alpha1.ExitOOMUnknown
	}
	return ""
}

func verdictName(k classify.OOMKind) string {
	if k == classify.NotOOM {
		return metrics.VerdictNotOOM
	}
	return string(k)
}

func nonZero(t, fallback time.Time) time.Time {
	if t.IsZero() {
		return fallback
	}
	return t
}
