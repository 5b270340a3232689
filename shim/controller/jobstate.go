package controller

import (
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/coroner-dev/coroner/shim/backoff"
)

// jobState is what the controller remembers of one Job between its syncs, beside what the
// informers show. All of it lives in jobStates, by Job key (namespace/name).
//
// What is not here, and why:
//   - the expectations (expectations.go): a self-contained mirror of the built-in
//     controller's ControllerExpectations with its own tests and lock; the pod handlers
//     observe them on every pod event, and the decisions read them as a whole (satisfied,
//     pending deletions), so they gain nothing from sharing this lock;
//   - the last known JobRecord of each Job (jobRecords.stored, jobrecord.go): it belongs
//     to the JobRecord writer, which updates it from the write that runs beside the sync
//     (startRecordWrite), and nothing else reads it;
//   - the terminated pods counted by coroner_terminated_pods_tracking_finalizer_total
//     (jobStates.finishedPods): they are pods, by pod UID, and must be found again after
//     the pod lost every link to its Job (the garbage collector orphans it, a release
//     takes the controller reference and the label away, the Job is deleted) to be
//     counted "delete" exactly once; under a Job's key they could not be.
type jobState struct {
	// retries is the global backoff of the Job with UID retriesOf (a Job recreated under
	// the same name starts with none): what the last sync's plan left (jobsync.Plan.Retries).
	retries   backoff.Record
	retriesOf types.UID
	// statusWrittenOver is the resourceVersion that our last status write replaced: while
	// the Job lister still shows that version, the informer has not caught up with our
	// write and a sync would decide from a stale status, so it waits for the Job's update
	// event (the built-in controller's finishedJobExpectations, generalised). "": none.
	statusWrittenOver string
	// syncOnCatchUp: a sync was skipped for statusWrittenOver; the Job's update event that
	// shows another version syncs it at once (caughtUp).
	syncOnCatchUp bool
	// urgentUntil is, when not zero, until when the Job's events sync it at once rather
	// than batched (markUrgent).
	urgentUntil time.Time
	// memoryRefused are the indexes whose pod with grown memory the API server refused
	// (jobsync.Input.MemoryRefused), with the refusal.
	memoryRefused map[int]string
	// managed: the Job is managed and not finished (counted by coroner_managed_jobs).
	managed bool
	// deleted are the UIDs of the Jobs of this name whose delete event this process saw,
	// with when (jobGone): a Job deleted and recreated under its name keeps them.
	deleted map[types.UID]time.Time
}

func (s *jobState) empty() bool {
	return s.retriesOf == "" && s.statusWrittenOver == "" && !s.syncOnCatchUp && s.urgentUntil.IsZero() &&
		len(s.memoryRefused) == 0 && !s.managed && len(s.deleted) == 0
}

// deletedJobsKept is how long the UID of a deleted Job is remembered for jobGone: long
// enough for the garbage collector to delete its pods, short enough to bound the memory.
const deletedJobsKept = 10 * time.Minute

// jobStates owns the jobState of every Job, and the terminated pods counted with the
// tracking finalizer.
//
// Locking. One mutex guards all of it, held only inside these methods, never across an
// API call or a queue operation. It cannot be done without: the work queue runs one sync
// of a key at a time, but the event handlers (markUrgent, the gauge, deletions, a
// finished Job's backoff), the orphan and stray workers (jobGone) and the sync's own
// creations, which run in parallel (noteRefusedMemory), reach the same Job's state
// concurrently with its sync.
type jobStates struct {
	mu   sync.Mutex
	jobs map[string]*jobState
	// deletedCount is the number of UIDs in all the jobState.deleted: when it reaches
	// 1024 the ones older than deletedJobsKept go.
	deletedCount int
	// managedCount is the number of jobState.managed that are true.
	managedCount int
	// finishedPods are the UIDs of terminated pods of managed Jobs that were counted by
	// coroner_terminated_pods_tracking_finalizer_total{event="add"}, so that "delete" is
	// counted for exactly those (see jobState for why not by Job).
	finishedPods map[types.UID]struct{}
}

func newJobStates() *jobStates {
	return &jobStates{jobs: map[string]*jobState{}, finishedPods: map[types.UID]struct{}{}}
}

// change runs f on the state of key (created if need be) under the lock, and drops the
// state when f left it empty.
func (s *jobStates) change(key string, f func(*jobState)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.jobs[key]
	if st == nil {
		st = &jobState{}
	}
	f(st)
	if st.empty() {
		delete(s.jobs, key)
	} else {
		s.jobs[key] = st
	}
}

// read runs f on the state of key under the lock; a Job with none gets a zero state.
func (s *jobStates) read(key string, f func(*jobState)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := s.jobs[key]; st != nil {
		f(st)
		return
	}
	f(&jobState{})
}

// retries is the backoff of job; ok is false when none is kept.
func (s *jobStates) retries(job *batchv1.Job) (r backoff.Record, ok bool) {
	s.read(keyOf(job), func(st *jobState) {
		if st.retriesOf == job.UID && job.UID != "" {
			r, ok = st.retries, true
		}
	})
	return r, ok
}

// setRetries keeps r as the backoff of job; a zero r drops it.
func (s *jobStates) setRetries(job *batchv1.Job, r backoff.Record) {
	s.change(keyOf(job), func(st *jobState) {
		if r == (backoff.Record{}) {
			if st.retriesOf == job.UID {
				st.retries, st.retriesOf = backoff.Record{}, ""
			}
			return
		}
		st.retries, st.retriesOf = r, job.UID
	})
}

// statusWritten remembers that our status write replaced the version resourceVersion of
// the Job key.
func (s *jobStates) statusWritten(key, resourceVersion string) {
	s.change(key, func(st *jobState) { st.statusWrittenOver = resourceVersion })
}

// staleCache reports whether the Job lister still shows the version our last status
// write replaced, and then remembers that a sync waits for the informer (caughtUp); when
// it shows another one, the memory of the write is dropped.
func (s *jobStates) staleCache(key string, job *batchv1.Job) (stale bool) {
	s.change(key, func(st *jobState) {
		switch st.statusWrittenOver {
		case "":
		case job.ResourceVersion:
			stale = true
		default:
			st.statusWrittenOver = ""
		}
		st.syncOnCatchUp = stale
	})
	return stale
}

// caughtUp reports whether a sync of the Job key was skipped for a stale cache and the
// Job's version resourceVersion, which the informer shows now, is another than the one
// our status write replaced: that sync is due now. It reports it once.
func (s *jobStates) caughtUp(key, resourceVersion string) (due bool) {
	s.change(key, func(st *jobState) {
		if st.syncOnCatchUp && st.statusWrittenOver != resourceVersion {
			st.syncOnCatchUp, due = false, true
		}
	})
	return due
}

// markUrgent makes the Job key urgent until the time until.
func (s *jobStates) markUrgent(key string, until time.Time) {
	s.change(key, func(st *jobState) { st.urgentUntil = until })
}

func (s *jobStates) clearUrgent(key string) {
	s.change(key, func(st *jobState) { st.urgentUntil = time.Time{} })
}

// urgent reports whether the Job key is urgent at now; an urgency that ran out is dropped.
func (s *jobStates) urgent(key string, now time.Time) (urgent bool) {
	s.change(key, func(st *jobState) {
		if st.urgentUntil.IsZero() {
			return
		}
		if now.Before(st.urgentUntil) {
			urgent = true
			return
		}
		st.urgentUntil = time.Time{}
	})
	return urgent
}

// refuseMemory remembers that the pod of index ix (-1: not indexed) of the Job key was
// refused more memory with message msg, and reports whether that index was refused before.
func (s *jobStates) refuseMemory(key string, ix int, msg string) (seen bool) {
	s.change(key, func(st *jobState) {
		if st.memoryRefused == nil {
			st.memoryRefused = map[int]string{}
		}
		_, seen = st.memoryRefused[ix]
		st.memoryRefused[ix] = msg
	})
	return seen
}

// refusedMemory is a copy of the Job's refused indexes (nil when none).
func (s *jobStates) refusedMemory(key string) (out map[int]string) {
	s.read(key, func(st *jobState) {
		if len(st.memoryRefused) == 0 {
			return
		}
		out = make(map[int]string, len(st.memoryRefused))
		for k, v := range st.memoryRefused {
			out[k] = v
		}
	})
	return out
}

// jobGone drops what the syncs of the Job key remembered: it is no longer in the lister.
func (s *jobStates) jobGone(key string) {
	s.change(key, func(st *jobState) {
		st.memoryRefused = nil
		st.statusWrittenOver, st.syncOnCatchUp = "", false
	})
}

// jobDeleted remembers the UID of job, whose delete event came at now, as deleted
// (seenDeleted), for deletedJobsKept at least.
func (s *jobStates) jobDeleted(job *batchv1.Job, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.deletedCount >= 1024 {
		s.pruneDeleted(now)
	}
	key := keyOf(job)
	st := s.jobs[key]
	if st == nil {
		st = &jobState{}
		s.jobs[key] = st
	}
	if st.deleted == nil {
		st.deleted = map[types.UID]time.Time{}
	}
	if _, ok := st.deleted[job.UID]; !ok {
		s.deletedCount++
	}
	st.deleted[job.UID] = now
}

// forgetDeletedManaged forgets the backoff, the status write and the urgency of the
// managed Job job, which was deleted.
func (s *jobStates) forgetDeletedManaged(job *batchv1.Job) {
	s.change(keyOf(job), func(st *jobState) {
		if st.retriesOf == job.UID {
			st.retries, st.retriesOf = backoff.Record{}, ""
		}
		st.statusWrittenOver, st.syncOnCatchUp = "", false
		st.urgentUntil = time.Time{}
	})
}

// pruneDeleted forgets the deleted UIDs older than deletedJobsKept. Called with mu held.
func (s *jobStates) pruneDeleted(now time.Time) {
	for key, st := range s.jobs {
		for uid, at := range st.deleted {
			if now.Sub(at) > deletedJobsKept {
				delete(st.deleted, uid)
				s.deletedCount--
			}
		}
		if st.empty() {
			delete(s.jobs, key)
		}
	}
}

// seenDeleted reports whether this process saw the delete event of the Job ns/name with uid.
func (s *jobStates) seenDeleted(ns, name string, uid types.UID) (seen bool) {
	s.read(ns+"/"+name, func(st *jobState) { _, seen = st.deleted[uid] })
	return seen
}

// setManaged records whether the Job key counts as managed and unfinished, and returns
// how many do when that changed (changed false otherwise).
func (s *jobStates) setManaged(key string, managed bool) (count int, changed bool) {
	s.change(key, func(st *jobState) {
		if st.managed == managed {
			return
		}
		st.managed, changed = managed, true
		if managed {
			s.managedCount++
		} else {
			s.managedCount--
		}
		count = s.managedCount
	})
	return count, changed
}

// finishedPod reports whether the pod uid was counted "add".
func (s *jobStates) finishedPod(uid types.UID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.finishedPods[uid]
	return ok
}

// setFinishedPod records whether the pod uid is counted "add" (and not "delete" yet).
func (s *jobStates) setFinishedPod(uid types.UID, counted bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if counted {
		s.finishedPods[uid] = struct{}{}
	} else {
		delete(s.finishedPods, uid)
	}
}
