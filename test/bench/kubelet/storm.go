package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/test/bench/measure"
)

// record is one bench pod as the bench saw it. The times are this machine's; finishedAt
// is the node's runtime's (the VM guest's clock is corrected by its measured offset when
// the latencies are computed).
type record struct {
	name string
	kind kind
	node string

	created time.Time
	// From the watch: when coroner's stamp and the kubelet's terminated status first
	// showed, and the container the kubelet reported.
	stampAt, kubeletAt time.Time
	containerID        string
	wrong, failed      string

	// From the runtime: the container's finishedAt, or why it could not be read.
	finishedAt  time.Time
	finishedErr string
	querying    bool
	tries       int

	timedOut, deleting bool
}

// done reports whether the bench has all it waits for of the pod.
func (r *record) done() bool {
	if r.failed != "" || r.timedOut {
		return true
	}
	finished := !r.finishedAt.IsZero() || r.finishedErr != ""
	return (!r.stampAt.IsZero() || r.wrong != "") && !r.kubeletAt.IsZero() && finished
}

// tracker holds every bench pod's record; the watch fills them.
type tracker struct {
	mu   sync.Mutex
	pods map[string]*record
}

func newTracker() *tracker { return &tracker{pods: map[string]*record{}} }

func (t *tracker) add(r *record) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.pods[r.name] = r
}

// observe records what a watch event of a bench pod shows, received at at.
func (t *tracker) observe(p *corev1.Pod, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.pods[p.Name]
	if r == nil {
		return // created but not recorded yet: the next event will do
	}
	v := viewOf(p, r.kind)
	if v.stamped && r.stampAt.IsZero() {
		r.stampAt = at
	}
	if v.wrong != "" && r.wrong == "" {
		r.wrong = v.wrong
	}
	if v.terminated != nil && r.kubeletAt.IsZero() {
		r.kubeletAt = at
		r.containerID = strings.TrimPrefix(v.terminated.ContainerID, "containerd://")
	}
	if v.failed != "" && r.failed == "" && r.stampAt.IsZero() {
		r.failed = v.failed
	}
}

// watchPods follows the bench's pods from resourceVersion rv until ctx ends, with a
// watch that resumes where it broke.
func watchPods(ctx context.Context, cs kubernetes.Interface, ns, rv string, t *tracker) error {
	return measure.WatchPods(ctx, cs, ns, benchLabel, rv, t.observe)
}

// nodePlan is what runs on one node.
type nodePlan struct {
	node        string
	vm          bool
	exits, ooms int
	rate        float64
	maxLive     int
	runFor      time.Duration
	podTimeout  time.Duration
}

// nodeRun makes a node's pods at the plan's pace, reads their containers' finish times
// from the node's runtime, and deletes each pod once the bench has all it waits for.
type nodeRun struct {
	plan      nodePlan
	namespace string
	cs        kubernetes.Interface
	cri       runtimeapi.RuntimeServiceClient
	tracker   *tracker
	spec      podSpec // the template: name and kind set per pod

	mu      sync.Mutex
	records []*record
	// createErrors counts failed creations (retried at the next tick).
	createErrors int
	started      time.Time
	ended        time.Time
}

// kinds interleaves exits and OOM pods evenly.
func kinds(exits, ooms int) []kind {
	total := exits + ooms
	out := make([]kind, total)
	for i := range total {
		out[i] = kindExit
		if ooms > 0 && (i+1)*ooms/total > i*ooms/total {
			out[i] = kindOOM
		}
	}
	return out
}

// run makes the node's pods and waits until each is done; it returns when every pod is
// done and deleted (or ctx ends).
func (n *nodeRun) run(ctx context.Context) {
	plan := kinds(n.plan.exits, n.plan.ooms)
	interval := time.Duration(float64(time.Second) / n.plan.rate)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	n.started = time.Now()
	next, i := n.started, 0
	var deletes sync.WaitGroup
	defer deletes.Wait()
	for {
		now := time.Now()
		if i < len(plan) && !now.Before(next) && n.live() < n.plan.maxLive {
			if n.create(ctx, i, plan[i]) {
				i++
				next = next.Add(interval)
				if now.Sub(next) > interval {
					next = now // held back by -max-live: no catching up in a burst
				}
			}
		}
		if n.advance(ctx, now, &deletes) && i == len(plan) {
			n.ended = time.Now()
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (n *nodeRun) create(ctx context.Context, i int, k kind) bool {
	s := n.spec
	s.kind = k
	s.name = fmt.Sprintf("%s-%s-%03d", k, strings.TrimPrefix(n.plan.node, "lab-"), i)
	r := &record{name: s.name, kind: k, node: n.plan.node, created: time.Now()}
	n.tracker.add(r)
	_, err := n.cs.CoreV1().Pods(n.namespace).Create(ctx, newPod(s), metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		err = nil // a retry of a creation whose answer was lost
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if err != nil {
		n.createErrors++
		return false
	}
	n.records = append(n.records, r)
	return true
}

// live counts the node's pods not deleted yet.
func (n *nodeRun) live() int {
	n.tracker.mu.Lock()
	defer n.tracker.mu.Unlock()
	c := 0
	for _, r := range n.records {
		if !r.deleting {
			c++
		}
	}
	return c
}

// advance reads finish times, times pods out and deletes the done ones; it reports
// whether every pod made so far is done and deleted.
func (n *nodeRun) advance(ctx context.Context, now time.Time, deletes *sync.WaitGroup) bool {
	n.mu.Lock()
	recs := n.records
	n.mu.Unlock()
	n.tracker.mu.Lock()
	defer n.tracker.mu.Unlock()
	all := true
	for _, r := range recs {
		if r.containerID != "" && r.finishedAt.IsZero() && r.finishedErr == "" && !r.querying {
			r.querying = true
			go n.queryFinished(ctx, r)
		}
		if !r.done() && now.Sub(r.created) > n.plan.podTimeout {
			r.timedOut = true
		}
		if r.done() && !r.deleting {
			r.deleting = true
			deletes.Go(func() {
				_ = n.cs.CoreV1().Pods(n.namespace).Delete(context.WithoutCancel(ctx), r.name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
			})
		}
		all = all && r.deleting
	}
	return all
}

// queryFinished asks the node's runtime when r's container finished, to the nanosecond
// (the pod's status has seconds): at once, while the kubelet keeps the exited container.
func (n *nodeRun) queryFinished(ctx context.Context, r *record) {
	n.tracker.mu.Lock()
	id := r.containerID
	n.tracker.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	st, err := n.cri.ContainerStatus(cctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
	n.tracker.mu.Lock()
	defer n.tracker.mu.Unlock()
	r.querying = false
	r.tries++
	switch {
	case err == nil && st.GetStatus().GetFinishedAt() > 0:
		r.finishedAt = time.Unix(0, st.GetStatus().GetFinishedAt())
	case r.tries >= 5:
		if err == nil {
			err = fmt.Errorf("state %s, no finishedAt", st.GetStatus().GetState())
		}
		r.finishedErr = err.Error()
	}
}
