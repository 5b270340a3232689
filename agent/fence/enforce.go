package fence

import (
	"context"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/cri"
)

// enforceLoop checks the fence every FencedPeriod, and stops containers while fenced.
func (f *Fencer) enforceLoop(ctx context.Context) {
	tick := f.clock.NewTicker(FencedPeriod)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C():
		}
		f.enforce(ctx)
	}
}

// enforce is one pass of the fence: it starts the fence when ShouldFence says so, and
// while fenced stops the running containers of the node's opted-in pods. It returns once
// the stops it made have ended.
func (f *Fencer) enforce(ctx context.Context) {
	logger := klog.FromContext(ctx)
	now := f.clock.Now()
	f.mu.Lock()
	if f.cfg.NodeLease && f.fence != nil && !ShouldFence(f.lastRenewal, now, f.cfg.FenceAfter) {
		f.endFence(ctx, now)
		f.mu.Unlock()
		return
	}
	if f.fence == nil {
		if !ShouldFence(f.lastRenewal, now, f.cfg.FenceAfter) {
			f.mu.Unlock()
			return
		}
		f.fence = &fenceRecord{since: now, lastRenewal: f.lastRenewal, fromStart: !f.renewed, stopped: map[string]types.NamespacedName{}}
		f.cfg.Metrics.SetFenced(true)
		msg := "FENCED: the Lease has not been renewed for longer than --fence-after; stopping the containers of opted-in pods until it is"
		switch {
		case f.cfg.NodeLease && !f.renewed:
			msg = "FENCED: no renewal of the kubelet's node Lease seen since the agent started, longer than --fence-after ago; stopping the containers of opted-in pods until one is"
		case f.cfg.NodeLease:
			msg = "FENCED: the kubelet's node Lease has not been renewed for longer than --fence-after (the node lost the API server, or its kubelet is down); stopping the containers of opted-in pods until it is"
		case !f.renewed:
			msg = "FENCED: the Lease has not been renewed since the agent started, longer than --fence-after ago; stopping the containers of opted-in pods until it is"
		}
		lease := klog.KRef(f.cfg.Namespace, f.leaseName)
		if f.cfg.NodeLease {
			lease = klog.KRef(conditions.NodeLeaseNamespace, f.cfg.NodeName)
		}
		logger.Info(msg, "lease", lease, "lastRenewal", f.lastRenewal.UTC().Format(time.RFC3339Nano),
			"sinceLastRenewal", now.Sub(f.lastRenewal).Round(time.Millisecond), "fenceAfter", f.cfg.FenceAfter)
	}
	fence := f.fence
	f.mu.Unlock()

	// The containers first: the sandbox of each running one is then in the second list.
	containers, err := f.cfg.Runtime.RunningContainers(ctx)
	if err != nil {
		logger.Error(err, "Fenced, but cannot list the containers; retrying", "retryIn", FencedPeriod)
		return
	}
	var sandboxes []cri.Sandbox
	if sl, ok := f.cfg.Runtime.(SandboxLister); ok {
		sandboxes, err = sl.Sandboxes(ctx)
		if err != nil {
			logger.Error(err, "Fenced, but cannot list the pod sandboxes; stopping the opted-in pods the pod cache knows, retrying the rest", "retryIn", FencedPeriod)
		}
	}
	targets := ToStop(f.cfg.NodeName, f.cfg.Pods(), sandboxes, containers, f.cfg.MaxStopTimeout)
	var wg sync.WaitGroup
	for _, t := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.stop(ctx, fence, t)
		}()
	}
	wg.Wait()
}

// stop stops one container and records it.
func (f *Fencer) stop(ctx context.Context, fence *fenceRecord, t Target) {
	logger := klog.FromContext(ctx)
	pod := klog.KRef(t.Pod.Namespace, t.Pod.Name)
	started := f.clock.Now()
	if err := f.cfg.Runtime.StopContainer(ctx, t.Container.ID, t.Timeout); err != nil {
		if ctx.Err() == nil {
			logger.Error(err, "Fenced, but cannot stop a container of an opted-in pod; retrying", "pod", pod,
				"container", t.Container.Name, "containerID", t.Container.ID, "retryIn", FencedPeriod)
		}
		return
	}
	f.cfg.Metrics.FenceStopped()
	f.mu.Lock()
	fence.stopped[t.Container.ID] = t.Pod
	f.mu.Unlock()
	logger.Info("Fenced: stopped a container of an opted-in pod", "pod", pod, "container", t.Container.Name,
		"containerID", t.Container.ID, "attempt", t.Container.Attempt, "optedInBy", t.OptedInBy, "timeout", t.Timeout,
		"took", f.clock.Since(started).Round(time.Millisecond))
}

// report logs the end of a fence and emits the Fenced Event on the Node.
func (f *Fencer) report(ctx context.Context, fence *fenceRecord, stopped map[string]types.NamespacedName, renewed time.Time) {
	logger := klog.FromContext(ctx)
	msg := Message(renewed.Sub(fence.lastRenewal), f.cfg.FenceAfter, fence.fromStart, stopped)
	if f.cfg.NodeLease {
		msg = NodeLeaseMessage(renewed.Sub(fence.lastRenewal), f.cfg.FenceAfter, fence.fromStart, stopped)
	}
	logger.Info("No longer fenced: the Lease is renewed again", "lease", klog.KRef(f.cfg.Namespace, f.leaseName),
		"fencedAt", fence.since.UTC().Format(time.RFC3339Nano), "fencedFor", renewed.Sub(fence.since).Round(time.Millisecond),
		"stoppedContainers", len(stopped), "message", msg)
	ref := &corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: f.cfg.NodeName}
	nctx, cancel := context.WithTimeout(ctx, f.requestTimeout)
	node, err := f.cfg.Client.CoreV1().Nodes().Get(nctx, f.cfg.NodeName, metav1.GetOptions{})
	cancel()
	if err == nil {
		ref.UID = node.UID
	} else {
		logger.V(2).Info("Cannot read the Node; the Fenced Event goes without its UID", "err", err)
	}
	f.cfg.Recorder.Event(ref, corev1.EventTypeWarning, conditions.EventReasonFenced, msg)
}
