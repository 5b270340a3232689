package fence

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// renewLoop renews every renew period, or every FencedPeriod while fenced.
func (f *Fencer) renewLoop(ctx context.Context) {
	for ctx.Err() == nil {
		start := f.clock.Now()
		_ = f.renew(ctx)
		period := f.renewPeriod
		if f.Fenced() {
			period = min(period, FencedPeriod)
		}
		if wait := period - f.clock.Since(start); wait > 0 {
			select {
			case <-ctx.Done():
			case <-f.clock.After(wait):
			}
		}
	}
}

// renew makes one renewal attempt. When it succeeds while fenced, with the fence's
// fenced-at written, the fence ends and the Fenced Event is emitted.
func (f *Fencer) renew(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	now := f.clock.Now()
	f.mu.Lock()
	fence := f.fence
	f.mu.Unlock()
	err := f.writeFor(ctx, now, fence)
	if err != nil {
		if ctx.Err() != nil {
			return err
		}
		f.mu.Lock()
		last, renewed := f.lastRenewal, f.renewed
		f.mu.Unlock()
		since := now.Sub(last)
		if !f.failing {
			msg := "Cannot renew the fencing Lease; the node is fenced if this lasts"
			if !renewed {
				msg = "Cannot renew the fencing Lease, and it has not been renewed since the start; the node is fenced if this lasts"
			}
			logger.Error(err, msg, "lease", klog.KRef(f.cfg.Namespace, f.leaseName),
				"sinceLastRenewal", since.Round(time.Millisecond), "fenceAfter", f.cfg.FenceAfter,
				"fencesAt", last.Add(f.cfg.FenceAfter).UTC().Format(time.RFC3339Nano))
		} else {
			logger.V(2).Info("Cannot renew the fencing Lease", "err", err, "sinceLastRenewal", since.Round(time.Millisecond))
		}
		f.failing = true
		return err
	}
	if f.failing {
		logger.Info("The fencing Lease is renewed again", "lease", klog.KRef(f.cfg.Namespace, f.leaseName))
		f.failing = false
	}

	f.mu.Lock()
	if now.After(f.lastRenewal) {
		f.lastRenewal = now
	}
	f.renewed = true
	// Only a write that carried this fence's fenced-at ends it: one that started before
	// the fence did not record it.
	var ended *fenceRecord
	var stopped map[string]types.NamespacedName
	if fence != nil && f.fence == fence {
		ended, f.fence = fence, nil
		stopped = make(map[string]types.NamespacedName, len(fence.stopped))
		for id, p := range fence.stopped {
			stopped[id] = p
		}
		f.cfg.Metrics.SetFenced(false)
	}
	f.mu.Unlock()
	if ended != nil {
		f.report(ctx, ended, stopped, now)
	}
	return nil
}

// writeLease writes the Lease for a renewal at now: an Update of the Lease as last
// written, reading (or creating) it first when unknown, and once more after a conflict.
func (f *Fencer) writeLease(ctx context.Context, now, fencedAt time.Time) error {
	leases := f.cfg.Client.CoordinationV1().Leases(f.cfg.Namespace)
	var err error
	for range 2 {
		cur := f.lease
		if cur == nil {
			cur, err = leases.Get(ctx, f.leaseName, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				var created *coordinationv1.Lease
				created, err = leases.Create(ctx, f.desired(nil, now, fencedAt), metav1.CreateOptions{})
				if err == nil {
					klog.FromContext(ctx).V(1).Info("Created the fencing Lease", "lease", klog.KObj(created))
					f.lease = created
					return nil
				}
				if apierrors.IsAlreadyExists(err) {
					continue
				}
				return fmt.Errorf("creating Lease %s/%s: %w", f.cfg.Namespace, f.leaseName, err)
			}
			if err != nil {
				return fmt.Errorf("reading Lease %s/%s: %w", f.cfg.Namespace, f.leaseName, err)
			}
		}
		var updated *coordinationv1.Lease
		updated, err = leases.Update(ctx, f.desired(cur, now, fencedAt), metav1.UpdateOptions{})
		if err == nil {
			f.lease = updated
			return nil
		}
		f.lease = nil
		if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			break
		}
	}
	return fmt.Errorf("updating Lease %s/%s: %w", f.cfg.Namespace, f.leaseName, err)
}

// writeFor writes the agent's Lease at now, with fence's start as its fenced-at (none when
// fence is nil), bounded by the request timeout.
func (f *Fencer) writeFor(ctx context.Context, now time.Time, fence *fenceRecord) error {
	var fencedAt time.Time
	if fence != nil {
		fencedAt = fence.since
	}
	rctx, cancel := context.WithTimeout(ctx, f.requestTimeout)
	defer cancel()
	return f.writeLease(rctx, now, fencedAt)
}

// desired is the agent's Lease as written at now (DesiredLease, and OnNodeLease with
// Config.NodeLease).
func (f *Fencer) desired(cur *coordinationv1.Lease, now, fencedAt time.Time) *coordinationv1.Lease {
	l := DesiredLease(cur, f.cfg.Namespace, f.cfg.NodeName, f.cfg.FenceAfter, now, fencedAt)
	if f.cfg.NodeLease {
		OnNodeLease(l, f.cfg.FenceAfter, f.cfg.Pod)
	}
	return l
}
