package fence

// Fencing on the kubelet's heartbeat (Config.NodeLease, --fence-signal=node-lease).
//
// The kubelet renews its node's Lease in kube-node-lease every 10 s (a quarter of its
// 40 s lease): that renewal is the proof, every 10 s, that the node reaches the API
// server. The agent watches that one Lease (a field-selected watch: no write, one event
// per renewal) instead of renewing a Lease of its own, and fences when the latest renewTime
// it has seen is more than --fence-after old. The kubelet and the agent read one clock,
// the node's, so the agent fences at the renewTime + --fence-after the shim computes from
// the same Lease (conditions.NodeFenced); a renewal the agent missed (its own watch broke)
// only makes it fence earlier. A watch can also go quiet without failing (a connection
// dropped without a reset): when nothing newer than QuietAfter has been seen, the agent
// reads the Lease (a GET, which the API server's watch cache answers) every RenewPeriod,
// so at rest, with a renewal every 10 s, it never reads.
//
// The agent writes its own Lease (OnNodeLease: the fence-after under
// conditions.AnnotationFenceOnNodeLease, and its pod) once at the start, retried until it
// succeeds, and once after each fence, with conditions.AnnotationFencedAt, before the
// Fenced Event. A fence ends when a renewal of the node Lease newer than --fence-after is
// seen again.
//
// The start counts as the last renewal until the agent hears from the node Lease; the
// first renewTime it sees then replaces it, even an older one: that is the deadline the
// shim works with, so an agent that starts on a node whose kubelet has been silent for
// longer than --fence-after fences at once.

import (
	"context"
	"math/rand/v2"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/coroner-dev/coroner/conditions"
)

// QuietAfter is how old the latest renewal of the node Lease the agent has seen may be
// before it reads the Lease itself, every RenewPeriod, in case its watch went quiet: two
// of the kubelet's renewal periods (10 s).
const QuietAfter = 20 * time.Second

// watchNodeLease watches the kubelet's node Lease until ctx is done; each renewTime seen
// is passed to heardFrom. The reflector relists and rewatches, with its own back-off,
// whenever the API server cannot be reached.
func (f *Fencer) watchNodeLease(ctx context.Context) {
	leases := f.cfg.Client.CoordinationV1().Leases(conditions.NodeLeaseNamespace)
	byName := fields.OneTermEqualSelector("metadata.name", f.cfg.NodeName).String()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = byName
			return leases.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = byName
			return leases.Watch(ctx, o)
		},
	}
	seen := func(obj any) {
		if l, ok := obj.(*coordinationv1.Lease); ok && l.Name == f.cfg.NodeName {
			f.heardFrom(ctx, l)
		}
	}
	_, informer := cache.NewInformerWithOptions(cache.InformerOptions{
		// The client says whether it serves watch-list (a fake clientset does not).
		ListerWatcher: cache.ToListWatcherWithWatchListSemantics(lw, f.cfg.Client),
		ObjectType:    &coordinationv1.Lease{},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    seen,
			UpdateFunc: func(_, cur any) { seen(cur) },
		},
	})
	informer.RunWithContext(ctx)
}

// heardFrom takes in a read of the node Lease: its renewTime (at most now) becomes the last
// renewal when it is the first seen or newer than the last.
func (f *Fencer) heardFrom(ctx context.Context, l *coordinationv1.Lease) {
	if l.Spec.RenewTime == nil {
		return
	}
	renewed := l.Spec.RenewTime.Time
	now := f.clock.Now()
	if renewed.After(now) {
		renewed = now
	}
	f.mu.Lock()
	first := !f.heard
	if first || renewed.After(f.lastRenewal) {
		f.lastRenewal, f.heard, f.renewed = renewed, true, true
	}
	f.mu.Unlock()
	if first {
		logger := klog.FromContext(ctx)
		logger.Info("Heard from the kubelet's node Lease", "nodeLease", klog.KObj(l), "renewTime", renewed.UTC().Format(time.RFC3339Nano),
			"fencesAt", renewed.Add(f.cfg.FenceAfter).UTC().Format(time.RFC3339Nano))
		if d := l.Spec.LeaseDurationSeconds; d != nil && time.Duration(*d)*time.Second/2 > f.cfg.FenceAfter {
			logger.Info("WARNING: --fence-after is shorter than two of the kubelet's renewal periods (a quarter of its Lease's duration): a renewal late by one period fences the node",
				"leaseDurationSeconds", *d, "fenceAfter", f.cfg.FenceAfter)
		}
	}
}

// endFence ends the current fence (the node Lease is renewed again) and leaves it to
// recordLoop to record. f.mu is held.
func (f *Fencer) endFence(ctx context.Context, now time.Time) {
	ended := f.fence
	f.fence = nil
	f.cfg.Metrics.SetFenced(false)
	if f.ended == nil { // a fence not recorded yet keeps its place: it began first
		f.ended, f.endedAt = ended, f.lastRenewal
	} else {
		for id, p := range ended.stopped {
			f.ended.stopped[id] = p
		}
	}
	klog.FromContext(ctx).Info("The kubelet's node Lease is renewed again: the fence ends", "nodeLease", klog.KRef(conditions.NodeLeaseNamespace, f.cfg.NodeName),
		"lastRenewal", f.lastRenewal.UTC().Format(time.RFC3339Nano), "fencedAt", ended.since.UTC().Format(time.RFC3339Nano),
		"fencedFor", now.Sub(ended.since).Round(time.Millisecond), "stoppedContainers", len(ended.stopped))
}

// MaxRecordRetry caps the back-off between failed writes of the agent's own Lease in
// recordLoop.
const MaxRecordRetry = time.Minute

// recordLoop writes the agent's own Lease at the start and after each fence, and reads
// the node Lease when the watch has been quiet for QuietAfter, every RenewPeriod. A
// failed write is retried after FencedPeriod, doubling up to MaxRecordRetry, with jitter:
// nothing waits for it (the fence runs on the node Lease alone), and the agents of a whole
// cluster start at once when their DaemonSet is created, where retrying every second
// would keep a saturated API server saturated (bench-scale's 5,000 agents never got their
// writes through that way).
func (f *Fencer) recordLoop(ctx context.Context) {
	var lastRead, nextWrite time.Time
	var retry time.Duration
	for ctx.Err() == nil {
		now := f.clock.Now()
		f.mu.Lock()
		due := !f.announced || f.ended != nil
		quiet := now.Sub(f.lastRenewal) >= QuietAfter
		f.mu.Unlock()
		if due && !now.Before(nextWrite) {
			if err := f.record(ctx); err != nil {
				retry = min(max(2*retry, FencedPeriod), MaxRecordRetry)
				nextWrite = now.Add(retry/2 + rand.N(retry))
			} else {
				retry, nextWrite = 0, time.Time{}
			}
		}
		if quiet && now.Sub(lastRead) >= f.renewPeriod {
			lastRead = now
			f.readNodeLease(ctx)
		}
		period := f.renewPeriod
		f.mu.Lock()
		if !f.announced || f.ended != nil {
			period = FencedPeriod
		}
		f.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-f.clock.After(period):
		}
	}
}

// readNodeLease reads the node Lease once (bounded by the request timeout) and takes its
// renewTime in.
func (f *Fencer) readNodeLease(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, f.requestTimeout)
	defer cancel()
	l, err := f.cfg.Client.CoordinationV1().Leases(conditions.NodeLeaseNamespace).Get(rctx, f.cfg.NodeName, metav1.GetOptions{})
	switch {
	case err == nil:
		f.heardFrom(ctx, l)
	case apierrors.IsNotFound(err):
		klog.FromContext(ctx).V(1).Info("The kubelet's node Lease does not exist (yet)", "nodeLease", klog.KRef(conditions.NodeLeaseNamespace, f.cfg.NodeName))
	default:
		klog.FromContext(ctx).V(2).Info("Cannot read the kubelet's node Lease", "err", err)
	}
}

// record writes the agent's own Lease: at the start (announcing how it fences), or after a
// fence (with its fenced-at), which then gets its Fenced Event.
func (f *Fencer) record(ctx context.Context) error {
	now := f.clock.Now()
	f.mu.Lock()
	ended, endedAt := f.ended, f.endedAt
	f.mu.Unlock()
	err := f.writeFor(ctx, now, ended)
	if err != nil {
		if ctx.Err() == nil && !f.failing {
			klog.FromContext(ctx).Error(err, "Cannot write the agent's Lease; retrying, backing off up to MaxRecordRetry", "lease", klog.KRef(f.cfg.Namespace, f.leaseName))
		}
		f.failing = ctx.Err() == nil
		return err
	}
	f.failing = false
	var stopped map[string]types.NamespacedName
	f.mu.Lock()
	f.announced = true
	if ended != nil && f.ended == ended {
		f.ended = nil
		stopped = make(map[string]types.NamespacedName, len(ended.stopped))
		for id, p := range ended.stopped {
			stopped[id] = p
		}
	}
	f.mu.Unlock()
	if stopped != nil {
		f.report(ctx, ended, stopped, endedAt)
	}
	return nil
}
