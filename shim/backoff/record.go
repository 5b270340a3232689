package backoff

import (
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Record is the global backoff state of one Job (S4), kept in memory by the
// controller between syncs, like upstream's backoffRecord. The zero Record
// means no failure since the last success.
type Record struct {
	// Failures is the number of pod failures that finished after the last
	// success.
	Failures int
	// LastFailure is the FinishTime of the latest of those failures; it is
	// zero when Failures is 0.
	LastFailure time.Time
}

// Fold returns the record after the controller saw the pods in succeeded and
// failed finish, in any order and each pod once (the built-in controller
// passes those it has not yet counted in the Job status). Which failed pods
// count is the caller's choice; Fold does not look at pod failure policies.
// Note that the built-in controller (v1.36) passes every newly failed pod,
// including those a pod failure policy Ignores and, unless
// podReplacementPolicy is Failed, pods being deleted: Ignore spares the
// backoffLimit, not the delay. coroner-shim passes the same pods less those lost
// with their node (Delaying). Nil entries are skipped.
//
//   - With no new success, the new failures add to Failures, and LastFailure
//     becomes the latest FinishTime among the old and the new failures.
//   - With a new success, the previous failures are forgotten, even those
//     that finished after it: the record does not keep their times, so it
//     cannot tell, and upstream forgets them too. Only the new failures that
//     finished strictly after the latest new success are counted, and
//     LastFailure is the latest of them.
//
// Upstream differs in one way: with no new success it sets LastFailure to
// the latest of the new failures even when an earlier batch had a later
// one, so a late-reported old failure could shorten the wait. Fold never
// moves LastFailure backwards.
func (r Record) Fold(succeeded, failed []*corev1.Pod) Record {
	var lastSuccess time.Time
	sawSuccess := false
	for _, p := range succeeded {
		if p == nil {
			continue
		}
		if t := FinishTime(p); !sawSuccess || t.After(lastSuccess) {
			lastSuccess = t
		}
		sawSuccess = true
	}
	out := r
	if sawSuccess {
		out = Record{}
	}
	for _, p := range failed {
		if p == nil {
			continue
		}
		t := FinishTime(p)
		if sawSuccess && !t.After(lastSuccess) {
			continue
		}
		out.Failures++
		if t.After(out.LastFailure) {
			out.LastFailure = t
		}
	}
	return out
}

// Remaining returns how much longer the Job waits at now before creating a
// pod, under policy p.
func (r Record) Remaining(now time.Time, p Policy) time.Duration {
	return p.Remaining(now, r.LastFailure, r.Failures)
}
