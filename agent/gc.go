package agent

// Forgetting, once a minute: what the ledger keeps of containers that are gone and of
// old evidence (ledger.Expire), and the pods known gone (podcache.go).

import (
	"context"
	"time"
)

// collectGarbage forgets finished containers and old tombstones, once a minute.
func (a *Agent) collectGarbage(ctx context.Context) {
	tick := a.clock.NewTicker(time.Minute)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C():
		}
		a.gc(a.clock.Now())
	}
}

// gc forgets what the ledger keeps of containers that are gone, its old evidence, and old
// tombstones. The runtime's states of a pod are kept while the pod is cached: the ledger
// gets the UIDs the cache finds pods by (podByUID).
func (a *Agent) gc(now time.Time) {
	a.ledger.Expire(now, a.cachedUIDs())
	a.expireGone(now)
}
