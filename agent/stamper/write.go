package stamper

// Writing a pod's due stamps: one patch of pods/status per pod, built from the pod as
// the API server has it, never over the kubelet's word.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/coroner-dev/coroner/agent/classify"
	"github.com/coroner-dev/coroner/agent/exithistory"
	"github.com/coroner-dev/coroner/agent/metrics"
	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/conditions"
)

// write writes one pod's requests.
func (s *Stamper) write(ctx context.Context, logger klog.Logger, w work) {
	ref := w.q.ref
	logger = logger.WithValues("pod", klog.KRef(ref.Namespace, ref.Name), "podUID", ref.UID)
	pod := s.cfg.Lookup(ref.UID)
	if pod == nil || pod.UID != ref.UID {
		logger.V(2).Info("Pod is gone; dropping its stamps", "stamps", len(w.reqs))
		for range w.reqs {
			s.cfg.Metrics.Dropped(metrics.DroppedPodGone)
		}
		s.drop(w)
		return
	}
	written, rest, err := s.apply(ctx, pod, w)
	end := s.cfg.Clock.Now()
	for _, r := range written {
		s.stamped(logger, pod, r, end)
	}
	switch {
	case errors.Is(err, conditions.ErrPodGone):
		logger.V(2).Info("Pod is gone; dropping its stamps", "stamps", len(rest))
		for range rest {
			s.cfg.Metrics.Dropped(metrics.DroppedPodGone)
		}
		s.drop(w)
	case err != nil:
		s.cfg.Metrics.WriteFailed()
		w.reqs = rest
		s.requeue(w, err)
		s.mu.Lock()
		retryIn := w.q.retryAt.Sub(end)
		s.mu.Unlock()
		logger.Error(err, "Writing the pod failed; retrying", "stamps", len(rest), "retryIn", retryIn)
	default:
		s.done(w)
	}
}

// apply makes the writes and returns the requests it wrote (changed the pod), those
// still to write (on error) and the error.
func (s *Stamper) apply(ctx context.Context, pod *corev1.Pod, w work) (written, rest []Request, err error) {
	now := func() metav1.Time { return metav1.NewTime(s.cfg.Clock.Now()) }

	// Merge: the first terminal phase, the first condition of each type, the history.
	var phase *Request
	type condReq struct {
		cond corev1.PodCondition
		reqs []Request
	}
	var conds []*condReq
	var hist []Request
	addCond := func(r Request) {
		for _, c := range conds {
			if c.cond.Type == r.Stamp.Condition.Type {
				return // a later condition of a type already stamped: merged away
			}
		}
		conds = append(conds, &condReq{cond: *r.Stamp.Condition, reqs: []Request{r}})
	}
	for _, r := range w.reqs {
		switch {
		case r.Stamp.Phase != "":
			if phase == nil { // a later phase is merged away
				rr := r
				phase = &rr
			}
		case r.Stamp.Condition != nil:
			addCond(r)
		}
		if r.History != nil {
			hist = append(hist, r)
		}
	}
	// Status: one patch with the phase and every condition, or the conditions alone.
	var phaseCond *corev1.PodCondition
	if phase != nil {
		phaseCond = phase.Stamp.Condition
	}
	others := conds
	if phaseCond != nil {
		others = nil
		for _, c := range conds {
			if c.cond.Type == phaseCond.Type {
				continue // the phase stamp carries its own
			}
			others = append(others, c)
		}
	}
	pending := func(from int) []Request {
		var out []Request
		for _, c := range others[from:] {
			out = append(out, c.reqs...)
		}
		return append(out, hist...)
	}

	if phase != nil && !conditions.IsTerminalPhase(pod.Status.Phase) {
		all := []corev1.PodCondition{}
		if phaseCond != nil {
			all = append(all, *phaseCond)
		}
		for _, c := range others {
			all = append(all, c.cond)
		}
		var changed bool
		var err error
		if len(phase.Stamp.Terminated) > 0 {
			// The runtime's exits go with the phase into the container statuses.
			var scheme string
			if s.cfg.RuntimeScheme != nil {
				scheme = s.cfg.RuntimeScheme()
			}
			changed, err = ensurePhaseWithExits(ctx, s.cfg.Patcher, pod, phase.Stamp.Phase, phase.Stamp.Terminated, scheme, now, all...)
		} else {
			changed, err = conditions.EnsurePodPhase(ctx, s.cfg.Patcher, pod, phase.Stamp.Phase, now, all...)
		}
		if err != nil {
			return nil, append([]Request{*phase}, pending(0)...), err
		}
		if changed {
			written = append(written, *phase)
			for _, c := range others {
				written = append(written, c.reqs...)
			}
			others = nil
		}
		// Not changed: the pod turned terminal meanwhile (the kubelet's word wins; its
		// condition comes with the next decision) or already had it all. The other
		// conditions go on their own below, which writes nothing when they are there.
	}
	// The conditions without a phase: one patch for all of them (a device verdict's
	// DisruptionTarget and coroner.dev/DeviceFailed land together).
	if len(others) > 0 {
		all := make([]corev1.PodCondition, 0, len(others))
		for _, c := range others {
			all = append(all, c.cond)
		}
		types, err := conditions.EnsurePodConditions(ctx, s.cfg.Patcher, pod, now, all...)
		if err != nil {
			return written, pending(0), err
		}
		for _, c := range others {
			if slices.Contains(types, c.cond.Type) {
				written = append(written, c.reqs...)
			}
		}
	}

	// Metadata: the exit history, recomputed.
	if len(hist) > 0 {
		cur := pod.Annotations[conditions.AnnotationExitHistory]
		value := cur
		for _, e := range w.history {
			if v, _, err := exithistory.Append(value, e, s.cfg.History); err == nil || errors.Is(err, v1alpha1.ErrMalformedExitHistory) {
				value = v
			}
		}
		if value != cur {
			changed, err := conditions.EnsurePodAnnotation(ctx, s.cfg.Patcher, pod, conditions.AnnotationExitHistory, value)
			if err != nil {
				return written, hist, err
			}
			if changed {
				written = append(written, hist...)
			}
		}
	}
	return written, nil, nil
}

// stamped records, logs and announces one written stamp.
func (s *Stamper) stamped(logger klog.Logger, pod *corev1.Pod, r Request, at time.Time) {
	st := r.Stamp
	var latency time.Duration
	if !r.EventTime.IsZero() {
		latency = at.Sub(r.EventTime)
		s.cfg.Metrics.Stamped(string(st.Kind), st.Reason, latency.Seconds())
	} else if s.cfg.Metrics != nil {
		s.cfg.Metrics.Stamps.WithLabelValues(string(st.Kind), st.Reason).Inc()
	}
	if r.DeviceSignal != "" && !r.EventTime.IsZero() {
		s.cfg.Metrics.DeviceStamped(r.DeviceSignal, latency.Seconds())
	}
	observed, observedOK, written, writtenOK := stages(r, at)
	if observedOK {
		s.cfg.Metrics.Observed(string(st.Kind), observed.Seconds())
	}
	if writtenOK {
		s.cfg.Metrics.Written(string(st.Kind), written.Seconds())
	}
	logger.Info("Stamped pod", "kind", st.Kind, "reason", st.Reason, "cause", conditions.CauseOfDeath(afterStamp(pod, st)).String(),
		"latency", latency, "observed", observed, "written", written, "message", st.Message)
	if s.cfg.Recorder == nil || st.Kind == classify.KindExitHistory || st.Kind == classify.KindDeviceFailure {
		return // a device failure's Event is its DeviceFailed stamp's, written with it
	}
	eventType := corev1.EventTypeWarning
	msg := st.Message
	if st.Condition != nil && st.Phase == "" {
		msg = fmt.Sprintf("%s=%s (%s): %s", st.Condition.Type, st.Condition.Status, st.Condition.Reason, st.Message)
	}
	if st.Kind == classify.KindTerminalPhase && st.Phase == corev1.PodSucceeded {
		eventType = corev1.EventTypeNormal
	}
	s.cfg.Recorder.Event(pod, eventType, conditions.EventReasonStamped, msg)
}

// stages splits a written stamp's detection latency at its ObservedTime: observed is
// EventTime to ObservedTime, written ObservedTime to at (the patch). A stage is not
// known (zero, false) when one of its times is zero or it is negative (clock skew
// between the runtime and the agent).
func stages(r Request, at time.Time) (observed time.Duration, observedOK bool, written time.Duration, writtenOK bool) {
	if r.ObservedTime.IsZero() {
		return 0, false, 0, false
	}
	if !r.EventTime.IsZero() {
		if d := r.ObservedTime.Sub(r.EventTime); d >= 0 {
			observed, observedOK = d, true
		}
	}
	if !at.IsZero() {
		if d := at.Sub(r.ObservedTime); d >= 0 {
			written, writtenOK = d, true
		}
	}
	return observed, observedOK, written, writtenOK
}

// countingPatcher counts the patches it passes on (metrics.PodWrites).
type countingPatcher struct {
	conditions.PodPatcher
	m *metrics.Metrics
}

func (c countingPatcher) PatchPod(ctx context.Context, namespace, name string, pt types.PatchType, data []byte, subresources ...string) (*corev1.Pod, error) {
	c.m.Wrote()
	return c.PodPatcher.PatchPod(ctx, namespace, name, pt, data, subresources...)
}

// afterStamp is pod (not modified) as the stamp leaves it: its condition set, its phase
// and the runtime's exits written. The log's cause of death renders from it
// (conditions.CauseOfDeath), as coroner-shim's Events and coronerctl explain render from
// the pod they read.
func afterStamp(pod *corev1.Pod, st classify.Stamp) *corev1.Pod {
	p := pod.DeepCopy()
	if st.Condition != nil {
		conditions.Set(&p.Status, *st.Condition, metav1.Now())
	}
	if st.Phase != "" {
		p.Status.Phase = st.Phase
		if len(st.Terminated) > 0 {
			p.Status.InitContainerStatuses, p.Status.ContainerStatuses, _ = classify.TerminatedStatuses(p, st.Terminated, "")
		}
	}
	return p
}
