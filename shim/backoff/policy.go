package backoff

import (
	"math"
	"time"
)

// Policy is an exponential backoff: after n consecutive failures the next
// pod waits Base * 2^(n-1), at most Max.
type Policy struct {
	// Base is the delay after the first failure; 0 or less turns backoff off.
	Base time.Duration
	// Max caps the delay; 0 or less means no cap.
	Max time.Duration
}

// Default is the built-in Job controller's policy (DefaultJobPodFailureBackOff
// and MaxJobPodFailureBackOff): 10s, 20s, 40s, ... up to 10 minutes.
var Default = Policy{Base: 10 * time.Second, Max: 10 * time.Minute}

// Delay returns the wait after failures consecutive failures: 0 for none,
// Base for one, doubling with each further failure and capped at Max. It does
// not overflow for any count: without a cap it stops at the largest
// time.Duration. A Base above Max is capped too (upstream would return Base
// after one failure).
func (p Policy) Delay(failures int) time.Duration {
	if failures <= 0 || p.Base <= 0 {
		return 0
	}
	d := p.Base
	for i := 1; i < failures; i++ {
		if p.Max > 0 && d >= p.Max {
			break
		}
		if d > math.MaxInt64/2 {
			d = math.MaxInt64
			break
		}
		d *= 2
	}
	if p.Max > 0 && d > p.Max {
		d = p.Max
	}
	return d
}

// Remaining returns how much longer to wait at now before re-creating a pod
// after failures consecutive failures, the last of which finished at
// lastFailure: Delay(failures) minus the time since lastFailure, and never
// negative.
//
// A lastFailure after now (a node clock ahead of the controller's) counts as
// now, so the wait never exceeds Delay(failures); upstream would wait for the
// skew on top.
func (p Policy) Remaining(now, lastFailure time.Time, failures int) time.Duration {
	d := p.Delay(failures)
	if d == 0 {
		return 0
	}
	elapsed := max(now.Sub(lastFailure), 0)
	return max(d-elapsed, 0)
}

// MinRequeue is the shortest delay after which the controller re-syncs a Job
// that waits for a backoff to end, as upstream's SyncJobBatchPeriod.
const MinRequeue = time.Second

// RequeueDelay is the delay to re-sync a Job after, given the remaining
// backoff: remaining, but at least MinRequeue.
//
// The floor lives here, apart from Remaining, on purpose: Remaining and the
// other functions of this package return exact times and decide whether a
// pod may be created now (0 means yes), while the floor only throttles the
// work queue, like upstream's enqueueSyncJobWithDelay, which applies it to
// every delayed re-sync. The controller passes every re-queue delay through
// RequeueDelay and never uses it to decide on pod creation.
func RequeueDelay(remaining time.Duration) time.Duration {
	return max(remaining, MinRequeue)
}
