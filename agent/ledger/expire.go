package ledger

// Time to live: how long what the ledger holds is kept.

import (
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// ContainerTTL is how long a container is remembered once nothing more is to be done with
// it: long enough for a late OOM event, a relist after a runtime restart, and a watch far
// behind. The evidence's own TTLs are in evidence.go.
const ContainerTTL = 5 * time.Minute

// Expire forgets the containers done for longer than ContainerTTL, the runtime's states of
// pods that neither have a container still remembered nor are among cached (the UIDs of
// the pods the caller's cache holds, by metadata.uid and by the UID the runtime knows
// them by), the device evidence of pods that are neither, and the evidence past its TTL.
// A container whose device verdict is pending stays.
func (l *Ledger) Expire(now time.Time, cached []types.UID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for id, c := range l.containers {
		if !c.doneAt.IsZero() && now.Sub(c.doneAt) > ContainerTTL && c.device != devicePending {
			delete(l.containers, id)
		}
	}
	live := make(map[types.UID]bool, len(l.containers)+len(cached))
	for _, c := range l.containers {
		live[types.UID(c.ev.PodUID)] = true
	}
	for _, uid := range cached {
		live[uid] = true
	}
	for uid := range l.observed {
		if !live[uid] {
			delete(l.observed, uid)
		}
	}
	l.expireDevicesLocked(live)
	l.evidence.expire(now)
}
