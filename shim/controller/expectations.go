package controller

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/utils/clock"
)

// ExpectationsTTL is how long pod creations and deletions issued for a Job may stay
// unobserved before the controller stops waiting for them (the built-in controller's
// ExpectationsTimeout): a lost watch event must not stall a Job forever.
const ExpectationsTTL = 5 * time.Minute

// expectations remembers, per Job key, the writes the controller issued and has not yet
// seen in its informers, like the built-in controller's ControllerExpectations and
// uidTrackingExpectations together:
//
//   - pending pod creations (a count) and deletions (the pods' UIDs), expiring after
//     ExpectationsTTL: while any is pending, the pod lister may be behind and
//     jobsync.Sync must neither create nor delete;
//   - the pods whose tracking finalizer removal is in flight (UIDs, no expiry: each is
//     cleared by the pod's update or delete event, or by the failed patch);
//   - the pods that left the pod cache without being deleted (strays.go), by UID, expiring
//     after ExpectationsTTL too: while one is being looked at, the Job must not replace it.
//
// Deletions are tracked by UID rather than counted (as the ReplicaSet controller does)
// so that observing one deletion twice, as its deletionTimestamp and then as its
// removal, or a pod deleted by someone else, cannot cover for a deletion still pending.
// expect replaces the previous expectations of a Job: a sync only creates or deletes once
// they are satisfied or expired.
type expectations struct {
	clock clock.PassiveClock
	ttl   time.Duration

	mu    sync.Mutex
	byKey map[string]*jobExpectations
}

type jobExpectations struct {
	creations  int
	deletions  sets.Set[types.UID]
	at         time.Time // when creations and deletions were set
	finalizers sets.Set[types.UID]
	// strays maps the UIDs of the Job's pods that left the cache unexpectedly to when.
	strays map[types.UID]time.Time
}

func newExpectations(c clock.PassiveClock) *expectations {
	return &expectations{clock: c, ttl: ExpectationsTTL, byKey: map[string]*jobExpectations{}}
}

func (e *expectations) get(key string) *jobExpectations {
	je := e.byKey[key]
	if je == nil {
		je = &jobExpectations{}
		e.byKey[key] = je
	}
	return je
}

// expect records that creations pods are about to be created and the pods deletions
// deleted for the Job key, replacing what was expected before.
func (e *expectations) expect(key string, creations int, deletions []types.UID) {
	e.mu.Lock()
	defer e.mu.Unlock()
	je := e.get(key)
	je.creations, je.deletions, je.at = creations, sets.New(deletions...), e.clock.Now()
}

// creationObserved lowers the pending creations of key by one: the informer showed a new
// pod, or a creation failed and no pod will show up.
func (e *expectations) creationObserved(key string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if je := e.byKey[key]; je != nil && je.creations > 0 {
		je.creations--
	}
}

// deletionObserved marks the deletion of pod uid as seen for key (idempotent): the
// informer showed it being deleted or gone, or the delete failed.
func (e *expectations) deletionObserved(key string, uid types.UID) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if je := e.byKey[key]; je != nil {
		je.deletions.Delete(uid)
	}
}

// pendingDeletions returns the UIDs of the pods whose deletion was issued for key and
// not yet observed, unless the TTL has passed (never nil).
func (e *expectations) pendingDeletions(key string) sets.Set[types.UID] {
	e.mu.Lock()
	defer e.mu.Unlock()
	je := e.byKey[key]
	if je == nil || je.deletions.Len() == 0 || e.clock.Since(je.at) > e.ttl {
		return sets.New[types.UID]()
	}
	return je.deletions.Clone()
}

// satisfied reports whether no creation or deletion issued for key is still pending, or
// the pending ones have waited longer than the TTL. A key never seen is satisfied.
func (e *expectations) satisfied(key string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	je := e.byKey[key]
	if je == nil {
		return true
	}
	for _, at := range je.strays {
		if e.clock.Since(at) <= e.ttl {
			return false
		}
	}
	if je.creations <= 0 && je.deletions.Len() == 0 {
		return true
	}
	return e.clock.Since(je.at) > e.ttl
}

// strayed records that the pod uid of key left the pod cache without being deleted and
// is being looked at (strays.go): until strayResolved, or the TTL, key is not satisfied.
func (e *expectations) strayed(key string, uid types.UID) {
	e.mu.Lock()
	defer e.mu.Unlock()
	je := e.get(key)
	if je.strays == nil {
		je.strays = map[types.UID]time.Time{}
	}
	je.strays[uid] = e.clock.Now()
}

// strayResolved forgets the stray pod uid of key (idempotent): it is back in the cache,
// released, or gone.
func (e *expectations) strayResolved(key string, uid types.UID) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if je := e.byKey[key]; je != nil {
		delete(je.strays, uid)
	}
}

// expectFinalizersRemoved records that the tracking finalizer removal of uids is about to
// be issued for key.
func (e *expectations) expectFinalizersRemoved(key string, uids []types.UID) {
	if len(uids) == 0 {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	je := e.get(key)
	if je.finalizers == nil {
		je.finalizers = sets.New[types.UID]()
	}
	je.finalizers.Insert(uids...)
}

// finalizerRemovalObserved forgets uid for key (idempotent): the informer showed the pod
// without the finalizer, or gone, or the removal failed. It reports whether uid was the
// last removal in flight for key: the pods the last sync recorded as uncounted can now be
// counted.
func (e *expectations) finalizerRemovalObserved(key string, uid types.UID) (last bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	je := e.byKey[key]
	if je == nil || !je.finalizers.Has(uid) {
		return false
	}
	je.finalizers.Delete(uid)
	return je.finalizers.Len() == 0
}

// finalizersBeingRemoved returns a copy of the UIDs whose finalizer removal is in flight
// for key (never nil).
// removingFinalizer reports whether the tracking finalizer removal of uid is in flight for
// key.
func (e *expectations) removingFinalizer(key string, uid types.UID) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	je := e.byKey[key]
	return je != nil && je.finalizers.Has(uid)
}

func (e *expectations) finalizersBeingRemoved(key string) sets.Set[types.UID] {
	e.mu.Lock()
	defer e.mu.Unlock()
	if je := e.byKey[key]; je != nil && je.finalizers != nil {
		return je.finalizers.Clone()
	}
	return sets.New[types.UID]()
}

// forget drops everything recorded for key (the Job is gone).
func (e *expectations) forget(key string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.byKey, key)
}
