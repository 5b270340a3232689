package recoverer

import (
	"context"
	"fmt"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/recovery"
)

// The pods of the nodes tainted unreachable.
//
// With RecoverAll the opted-in pods of other controllers are recovered, but only on a node
// tainted node.kubernetes.io/unreachable: every case that applies to them (Z1, Z2, the
// deletion of a terminal pod) requires the taint (recovery.Decide). So only those nodes'
// pods are watched, with one informer per node (informers.Informers.NodePods), started
// when the Node informer shows the taint (the initial list included) and stopped when the
// taint goes or the node is deleted. An outage of a rack or a zone taints a few hundred
// nodes at once: as many watches, which the API server serves from its watch cache by its
// index on spec.nodeName. Nothing of this runs with RecoverManaged.
//
// Node events come before Run too: the informers are started beside Run, and the initial
// list of nodes is delivered as Adds. Until Run, a node's informer is only recorded; Run
// starts the recorded ones and, while it runs, each new one at once, each with its own
// context, a child of Run's; when Run returns, all are stopped and waited for, and a node
// event after that starts nothing. So no informer runs outside Run, and none outlives it.
//
// A pod of a node informer that carries conditions.ManagedPodLabel is a managed Job's,
// handled through the Pods informer: it is neither enqueued from here nor looked up here.

// nodeWatch is the informer of one node's pods.
type nodeWatch struct {
	node string
	inf  cache.SharedIndexInformer
	// stop stops the informer; nil until it is started.
	stop context.CancelFunc
	// keys are the pods (namespace/name) this watch put in nodeWatches.podNode. Not derived
	// from the informer's store when the watch stops: the store runs ahead of the handlers,
	// so a pod deleted from it may still be in podNode.
	keys map[string]struct{}
}

// nodeWatches are the informers of the pods of the nodes tainted unreachable.
type nodeWatches struct {
	// mu guards the fields below (not wg).
	mu sync.Mutex
	// run is the context the informers run with: nil before Run, done once it returned.
	run context.Context
	// stopRun cancels run.
	stopRun context.CancelFunc
	// stopped says Run has returned: no informer starts any more.
	stopped bool
	// byNode are the watches by node name.
	byNode map[string]*nodeWatch
	// podNode is the node of each pod (namespace/name) of the watches, the managed Jobs'
	// pods left out: the lookup of recoverPod in O(1).
	podNode map[string]string
	// wg counts the informers' goroutines.
	wg sync.WaitGroup
}

// WatchedNodes returns the nodes whose pods are watched, sorted: those tainted unreachable
// (the informers of those seen before Run start with Run). It is empty with RecoverManaged
// and once Run has returned.
func (r *Recoverer) WatchedNodes() []string {
	w := &r.nodes
	w.mu.Lock()
	defer w.mu.Unlock()
	nodes := make([]string, 0, len(w.byNode))
	for n := range w.byNode {
		nodes = append(nodes, n)
	}
	slices.Sort(nodes)
	return nodes
}

// watchNodePods starts or stops the informer of the node's pods as the node is tainted
// unreachable or not (nil: the node is deleted).
func (r *Recoverer) watchNodePods(node string, n *corev1.Node) {
	if r.cfg.RecoverPods != RecoverAll {
		return
	}
	if n != nil && tainted(n, corev1.TaintNodeUnreachable) {
		r.startNodeWatch(node)
	} else {
		r.stopNodeWatch(node)
	}
}

// startNodeWatch records an informer of the node's pods, unless there is one, and starts
// it if Run runs.
func (r *Recoverer) startNodeWatch(node string) {
	w := &r.nodes
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.byNode[node] != nil || w.stopped {
		return
	}
	nw := &nodeWatch{node: node, inf: r.inf.NodePods(node), keys: map[string]struct{}{}}
	// The informer is new and not started: registering cannot fail.
	if _, err := nw.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { r.nodePodChanged(nw, obj) },
		UpdateFunc: func(_, cur any) { r.nodePodChanged(nw, cur) },
		DeleteFunc: func(obj any) { r.nodePodDeleted(nw, obj) },
	}); err != nil {
		panic(fmt.Sprintf("adding the event handler of node %s's pods: %v", node, err))
	}
	w.byNode[node] = nw
	r.logger.Info("Watching the pods of a node tainted unreachable", "node", node)
	if w.run != nil {
		w.start(nw)
	}
}

// start runs the watch's informer until its own stop or Run's end (w.mu held, w.run set).
func (w *nodeWatches) start(nw *nodeWatch) {
	ctx, stop := context.WithCancel(w.run)
	nw.stop = stop
	w.wg.Go(func() { nw.inf.RunWithContext(ctx) })
}

// stopNodeWatch stops the informer of the node's pods, if there is one, and forgets its
// pods.
func (r *Recoverer) stopNodeWatch(node string) {
	w := &r.nodes
	w.mu.Lock()
	defer w.mu.Unlock()
	nw := w.byNode[node]
	if nw == nil {
		return
	}
	delete(w.byNode, node)
	if nw.stop != nil {
		nw.stop()
	}
	for k := range nw.keys {
		if w.podNode[k] == node {
			delete(w.podNode, k)
		}
	}
	r.logger.Info("Stopped watching the pods of a node", "node", node)
}

// runNodeWatches starts the recorded informers; from now on each new one starts at once.
// It returns the function that stops them all and waits for them, for when Run returns.
func (r *Recoverer) runNodeWatches(ctx context.Context) (stopAll func()) {
	w := &r.nodes
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.run == nil && !w.stopped {
		w.run, w.stopRun = context.WithCancel(ctx)
		for _, nw := range w.byNode {
			w.start(nw)
		}
	}
	return func() {
		w.mu.Lock()
		w.stopped = true
		if w.stopRun != nil {
			w.stopRun()
		}
		clear(w.byNode)
		clear(w.podNode)
		w.mu.Unlock()
		// No informer starts once stopped is set: nothing adds to wg during the wait.
		w.wg.Wait()
	}
}

// nodePodChanged handles a pod of nw's informer that was added or updated: it is recorded
// for recoverPod's lookup and, with RecoverAll, enqueued when opted in and relevant; a
// managed Job's pod is forgotten instead (it is in Pods).
func (r *Recoverer) nodePodChanged(nw *nodeWatch, obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	key := cache.MetaObjectToName(pod).String()
	if managedPod(pod) {
		r.forgetNodePod(nw, key)
		return
	}
	w := &r.nodes
	w.mu.Lock()
	current := w.byNode[nw.node] == nw
	if current {
		w.podNode[key] = nw.node
		nw.keys[key] = struct{}{}
	}
	w.mu.Unlock()
	if current {
		r.enqueueOtherPod(pod)
	}
}

// nodePodDeleted handles a pod gone from nw's informer.
func (r *Recoverer) nodePodDeleted(nw *nodeWatch, obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		r.forgetNodePod(nw, t.Key)
		return
	}
	if pod, ok := obj.(*corev1.Pod); ok {
		r.forgetNodePod(nw, cache.MetaObjectToName(pod).String())
	}
}

// forgetNodePod drops the pod from nw's record, and from the lookup when it is there as
// nw's.
func (r *Recoverer) forgetNodePod(nw *nodeWatch, key string) {
	w := &r.nodes
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.byNode[nw.node] != nw { // a watch stopped: stopNodeWatch forgot its pods
		return
	}
	delete(nw.keys, key)
	if w.podNode[key] == nw.node {
		delete(w.podNode, key)
	}
}

// nodePod returns the pod of a queue key from the informer of its node's pods; nil when no
// such informer holds it, or it is a managed Job's pod.
func (r *Recoverer) nodePod(key string) *corev1.Pod {
	w := &r.nodes
	w.mu.Lock()
	nw := w.byNode[w.podNode[key]]
	w.mu.Unlock()
	if nw == nil {
		return nil
	}
	obj, ok, err := nw.inf.GetStore().GetByKey(key)
	if !ok || err != nil {
		return nil
	}
	if pod, ok := obj.(*corev1.Pod); ok && !managedPod(pod) {
		return pod
	}
	return nil
}

// nodePods returns the pods of the informer of the node's pods, the managed Jobs' left
// out; nil when there is no such informer.
func (r *Recoverer) nodePods(node string) []*corev1.Pod {
	w := &r.nodes
	w.mu.Lock()
	nw := w.byNode[node]
	w.mu.Unlock()
	if nw == nil {
		return nil
	}
	var pods []*corev1.Pod
	for _, o := range nw.inf.GetStore().List() {
		if pod, ok := o.(*corev1.Pod); ok && !managedPod(pod) {
			pods = append(pods, pod)
		}
	}
	return pods
}

// enqueueOtherPod queues a pod that is not of a managed Job (a stub of a node informer)
// when recovery may concern it: with RecoverAll, opted in and relevant.
func (r *Recoverer) enqueueOtherPod(pod *corev1.Pod) {
	if r.cfg.RecoverPods == RecoverAll && recovery.Relevant(pod, true) {
		r.queue.Add(cache.MetaObjectToName(pod).String())
	}
}

// managedPod reports whether the pod carries conditions.ManagedPodLabel: a managed Job's
// pod, which the Pods informer holds.
func managedPod(pod *corev1.Pod) bool {
	_, ok := pod.Labels[conditions.ManagedPodLabel]
	return ok
}
