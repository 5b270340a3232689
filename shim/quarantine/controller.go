// Package quarantine is coroner-shim's quarantine of nodes that keep killing pods, a
// controller of its own beside the Job controller and node-failure recovery, on the same
// shared informers (shim/informers), run only by the leader:
//
//   - it counts every death of a managed Job's pod that conditions.NodeBlame blames on its
//     node, once per pod UID, in coroner_node_blamed_deaths_total{node,cause}, with or
//     without --quarantine;
//   - with --quarantine (Config.Enabled), it remembers those deaths by node (in memory),
//     and Decide (decide.go, pure) says which nodes to taint coroner.dev/quarantined=<cause>:NoSchedule,
//     which to spare because --quarantine-max nodes are quarantined, and which to lift
//     after --quarantine-for without a new death; sync carries that out, one JSON patch
//     per node guarded by its resourceVersion (write.go), then the Events and metrics.
//
// What it remembers is lost when the shim restarts, or when another replica takes over:
// a node tainted before starts its lift clock at the controller's start (conservative:
// it stays quarantined --quarantine-for at least from then); the failed pods not yet
// counted are listed again, with the time of death their status tells. When the taint is
// removed, by the controller or by hand (coronerctl quarantine lift), the node's history
// is forgotten, so that the deaths that led to the quarantine do not taint it again.
package quarantine

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/informers"
	"github.com/coroner-dev/coroner/shim/metrics"
	"github.com/coroner-dev/coroner/shim/queue"
)

// Config configures a Controller. Zero fields take the defaults.
type Config struct {
	// ManagedBy is the spec.managedBy of the Jobs whose pods' deaths count; default
	// conditions.ManagedBy.
	ManagedBy string
	// Enabled turns the quarantine on (--quarantine); off, only the deaths are counted.
	Enabled bool
	// Options are the quarantine's settings; zero fields take the Default* values.
	Options Options
	// Clock is the controller's clock; default clock.RealClock{}.
	Clock clock.WithTicker
	// Metrics receives the node-blame metrics; nil means a private registry.
	Metrics *metrics.Metrics
	// Recorder emits the Events on Nodes. Required when Enabled.
	Recorder record.EventRecorder
}

// syncKey is the queue's only key: the decision is over every node at once (the most
// quarantined at once is cluster-wide).
const syncKey = "nodes"

// seenFor is how long a pod UID whose death was counted is remembered, so that the
// pod's later updates (it stays in the cache until the Job controller counts it) and its
// deletion do not count it again.
const seenFor = 24 * time.Hour

// Controller quarantines nodes. Create it with New.
type Controller struct {
	client kubernetes.Interface
	cfg    Config
	inf    *informers.Informers
	logger klog.Logger
	queue  queue.Queue

	// mu guards what follows.
	mu sync.Mutex
	// started is when the workers started (the lift clock of a node tainted before).
	started time.Time
	// history are the deaths by node (Enabled only).
	history map[string]*History
	// seen are the UIDs of the pods whose death was counted, with when; prunedSeen is
	// when the old ones were last dropped.
	seen       map[types.UID]time.Time
	prunedSeen time.Time
}

// New builds a Controller on the shared informers inf and registers its event handlers;
// nothing runs until Run. ctx gives the logger of the event handlers.
func New(ctx context.Context, client kubernetes.Interface, inf *informers.Informers, cfg Config) *Controller {
	if cfg.ManagedBy == "" {
		cfg.ManagedBy = conditions.ManagedBy
	}
	o := &cfg.Options
	if o.Deaths <= 0 {
		o.Deaths = DefaultDeaths
	}
	if o.Window <= 0 {
		o.Window = DefaultWindow
	}
	if o.For <= 0 {
		o.For = DefaultFor
	}
	if o.Max.N <= 0 {
		o.Max, _ = ParseMax(DefaultMax)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.New(prometheus.NewRegistry())
	}
	if cfg.Enabled && cfg.Recorder == nil {
		panic("quarantine.New: Config.Recorder is nil")
	}
	c := &Controller{
		client:  client,
		cfg:     cfg,
		inf:     inf,
		logger:  klog.FromContext(ctx),
		queue:   queue.New("coroner_quarantine", cfg.Clock),
		history: map[string]*History{},
		seen:    map[types.UID]time.Time{},
	}
	c.addHandlers()
	return c
}

func (c *Controller) informers() []cache.SharedIndexInformer {
	return []cache.SharedIndexInformer{c.inf.Jobs, c.inf.Pods, c.inf.Nodes}
}

// HasSynced reports whether the informers the controller reads have synced.
func (c *Controller) HasSynced() bool { return informers.Synced(c.informers()...) }

// Run waits for the caches and, with the quarantine on, runs one worker until ctx is done
// (a write in flight finishes first); off, it only waits for ctx (the deaths are counted by
// the event handlers). It returns an error if the caches did not sync before ctx was done.
func (c *Controller) Run(ctx context.Context) error {
	defer utilruntime.HandleCrash()
	logger := klog.FromContext(ctx)
	o := c.cfg.Options
	logger.Info("Starting the node quarantine", "enabled", c.cfg.Enabled, "deaths", o.Deaths, "window", o.Window, "for", o.For, "max", o.Max.String())
	defer logger.Info("Shut down the node quarantine")
	synced := func() error {
		if !informers.WaitForCacheSync(ctx, c.informers()...) {
			return fmt.Errorf("the Job, Pod and Node caches of the node quarantine did not sync: %w", context.Cause(ctx))
		}
		c.mu.Lock()
		c.started = c.cfg.Clock.Now()
		c.mu.Unlock()
		c.queue.Add(syncKey)
		return nil
	}
	if !c.cfg.Enabled {
		defer c.queue.ShutDown()
		if err := synced(); err != nil {
			return err
		}
		<-ctx.Done()
		return nil
	}
	return queue.Serve(ctx, 1, synced, queue.Worker{Queue: c.queue, Handle: c.sync, What: "Quarantining nodes", Kind: "key"})
}

func (c *Controller) addHandlers() {
	if _, err := c.inf.Pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.observe,
		UpdateFunc: func(_, cur any) { c.observe(cur) },
		DeleteFunc: c.observe,
	}); err != nil {
		panic(fmt.Sprintf("adding the Pod event handler: %v", err))
	}
	if !c.cfg.Enabled {
		return
	}
	if _, err := c.inf.Nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { c.queue.Add(syncKey) },
		UpdateFunc: c.updateNode,
		DeleteFunc: c.deleteNode,
	}); err != nil {
		panic(fmt.Sprintf("adding the Node event handler: %v", err))
	}
}

// observe counts the death of a pod of a managed Job that blames its node, once per UID,
// and with the quarantine on records it and queues a decision.
func (c *Controller) observe(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	now := c.cfg.Clock.Now()
	node, d, ok := DeathOf(pod, now)
	if !ok || !informers.IsManagedBy(c.inf.CachedJobOf(pod), c.cfg.ManagedBy) {
		return
	}
	c.mu.Lock()
	if _, seen := c.seen[pod.UID]; seen {
		c.mu.Unlock()
		return
	}
	c.seen[pod.UID] = now
	if now.Sub(c.prunedSeen) > time.Hour {
		c.pruneSeen(now)
	}
	if c.cfg.Enabled {
		h := c.history[node]
		if h == nil {
			h = &History{}
			c.history[node] = h
		}
		h.Add(d)
	}
	c.mu.Unlock()
	c.cfg.Metrics.NodeBlamedDeaths.WithLabelValues(node, string(d.Class)).Inc()
	c.logger.V(2).Info("Pod death blamed on its node", "pod", d.Pod, "node", node, "cause", d.Class, "at", d.At)
	if c.cfg.Enabled {
		c.queue.Add(syncKey)
	}
}

// updateNode queues a decision when the node's quarantine taint changed, and forgets the
// node's history when the taint was removed (by the controller or by hand).
func (c *Controller) updateNode(old, cur any) {
	o, ok1 := old.(*corev1.Node)
	n, ok2 := cur.(*corev1.Node)
	if !ok1 || !ok2 {
		return
	}
	if Lifted(o, n) {
		c.forget(n.Name, false)
	}
	if (TaintOf(o) == nil) != (TaintOf(n) == nil) {
		c.queue.Add(syncKey)
	}
}

// deleteNode drops the node's history: a deleted node is neither quarantined nor lifted,
// and a node of the same name made later starts afresh.
func (c *Controller) deleteNode(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	if n, ok := obj.(*corev1.Node); ok {
		c.forget(n.Name, true)
		c.queue.Add(syncKey)
	}
}

// forget drops all the controller remembers of node: the deaths blamed on it so far,
// the time of the latest (a quarantine to come starts its clock at a later death) and
// whether it was spared. deleted says why, for the log.
func (c *Controller) forget(node string, deleted bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.history[node]; ok {
		c.logger.V(2).Info("Forgetting the deaths blamed on a node", "node", node, "deleted", deleted)
	}
	delete(c.history, node)
}

// sync decides over every node and carries the decision out: the writes one node at a
// time, each node's Event and metrics after its write succeeded. It asks to be run again
// when the next lift is due.
func (c *Controller) sync(ctx context.Context, _ string) error {
	now := c.cfg.Clock.Now()
	cached, err := c.inf.NodeLister.List(labelsEverything)
	if err != nil {
		return err
	}
	nodes := make([]Node, 0, len(cached))
	byName := make(map[string]*corev1.Node, len(cached))
	tainted := 0
	for _, n := range cached {
		nodes = append(nodes, NodeOf(n))
		byName[n.Name] = n
		if TaintOf(n) != nil {
			tainted++
		}
	}
	c.cfg.Metrics.NodesQuarantined.Set(float64(tainted))

	c.mu.Lock()
	c.prune(now)
	d := Decide(now, c.started, c.history, nodes, c.cfg.Options)
	c.mu.Unlock()

	var errs []error
	for _, a := range d.Actions {
		if err := c.carryOut(ctx, now, byName[a.Node], a); err != nil {
			errs = append(errs, err)
		}
	}
	if !d.Next.IsZero() {
		c.queue.AddAfter(syncKey, d.Next.Sub(now))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%d of %d quarantine actions failed: %w", len(errs), len(d.Actions), errs[0])
	}
	return nil
}

// prune drops the deaths out of the window, the histories left with nothing to say, and
// the counted UIDs older than seenFor. c.mu is held.
func (c *Controller) prune(now time.Time) {
	for node, h := range c.history {
		h.Prune(now, c.cfg.Options.Window)
		if len(h.Deaths) == 0 && !h.Last.Add(c.cfg.Options.For).After(now) {
			delete(c.history, node)
		}
	}
	c.pruneSeen(now)
}

// pruneSeen drops the counted UIDs older than seenFor. c.mu is held.
func (c *Controller) pruneSeen(now time.Time) {
	for uid, at := range c.seen {
		if now.Sub(at) > seenFor {
			delete(c.seen, uid)
		}
	}
	c.prunedSeen = now
}
