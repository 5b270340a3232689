package stamper

// The per-pod queue of pending stamps: what is due, batching, retries with backoff, and
// what was written (so a stamp already on the pod is not written again).

import (
	"time"

	"github.com/coroner-dev/coroner/api/v1alpha1"
)

// work is one pod's write: its pending requests and its exit history.
type work struct {
	q       *podQueue
	reqs    []Request
	history []v1alpha1.Exit
}

// takeDue moves the due pods' pending requests out and marks them in flight.
func (s *Stamper) takeDue(now time.Time) []work {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []work
	for _, q := range s.pods {
		if q.writing > 0 || len(q.pending) == 0 || now.Before(q.due) || now.Before(q.retryAt) {
			continue
		}
		q.writing = len(q.pending)
		out = append(out, work{q: q, reqs: q.pending, history: append([]v1alpha1.Exit(nil), q.history...)})
		q.pending = nil
	}
	return out
}

// nextDue is the earliest time a pod not in flight may be written.
func (s *Stamper) nextDue() (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var next time.Time
	found := false
	for _, q := range s.pods {
		if q.writing > 0 || len(q.pending) == 0 {
			continue
		}
		t := q.due
		if q.retryAt.After(t) {
			t = q.retryAt
		}
		if !found || t.Before(next) {
			next, found = t, true
		}
	}
	return next, found
}

// requeue puts requests that were not written back, ahead of those added meanwhile, and
// ends the write. failed says whether to back off.
func (s *Stamper) requeue(w work, failed error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := w.q
	q.writing = 0
	if q.forgotten {
		return
	}
	now := s.cfg.Clock.Now()
	if failed != nil {
		q.failures++
		backoff := s.cfg.RetryBase << min(q.failures-1, 20)
		if backoff <= 0 || backoff > s.cfg.RetryMax {
			backoff = s.cfg.RetryMax
		}
		q.retryAt = now.Add(backoff)
	}
	if len(w.reqs) == 0 {
		return
	}
	rest := q.pending
	q.pending = nil
	for _, r := range w.reqs {
		if !q.hasPending(r) {
			q.pending = append(q.pending, r)
		}
	}
	for _, r := range rest {
		if !q.hasPending(r) {
			q.pending = append(q.pending, r)
		}
	}
	if failed == nil && q.due.After(now) {
		q.due = now
	}
}

// done ends a successful write.
func (s *Stamper) done(w work) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w.q.writing = 0
	w.q.failures = 0
	w.q.retryAt = time.Time{}
	if !w.q.forgotten && len(w.q.pending) == 0 && len(w.q.history) == 0 {
		delete(s.pods, w.q.ref.UID)
	}
}

// drop ends a write whose pod is gone.
func (s *Stamper) drop(w work) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w.q.writing = 0
	if s.pods[w.q.ref.UID] == w.q {
		delete(s.pods, w.q.ref.UID)
	}
}

// hasPending reports whether a request equal to r is pending.
func (q *podQueue) hasPending(r Request) bool {
	for _, p := range q.pending {
		if sameStamp(p, r) {
			return true
		}
	}
	return false
}

func sameStamp(a, b Request) bool {
	sa, sb := a.Stamp, b.Stamp
	if sa.Kind != sb.Kind || sa.Phase != sb.Phase || (sa.Condition == nil) != (sb.Condition == nil) {
		return false
	}
	if sa.Condition != nil && (sa.Condition.Type != sb.Condition.Type || sa.Condition.Status != sb.Condition.Status ||
		sa.Condition.Reason != sb.Condition.Reason || sa.Condition.Message != sb.Condition.Message) {
		return false
	}
	if (a.History == nil) != (b.History == nil) {
		return false
	}
	return a.History == nil || *a.History == *b.History
}

// remember records an exit for the annotation, keeping the latest max*2.
func (q *podQueue) remember(e v1alpha1.Exit, limit int) {
	for _, h := range q.history {
		if h == e {
			return
		}
	}
	q.history = append(q.history, e)
	if n := 2 * max(limit, 1); len(q.history) > n {
		q.history = q.history[len(q.history)-n:]
	}
}
