// Package recoverer is coroner-shim's node-failure recovery (Z1-Z4), a controller of its
// own beside the Job controller (shim/controller), on the same shared informers
// (shim/informers): a queue of pod keys fed by the pod, node and agent-Lease informers,
// handled by recoverPod, which carries out recovery.Decide's Decision: one status write
// (phase Failed and conditions, or the cleared DisruptionTarget), the Events, then the
// forced deletion, and a requeue at the Decision's deadline. The decision itself is the
// pure package shim/recovery.
//
// It is a package rather than a second type in shim/controller so that the compiler keeps
// the two apart: recovery reads the Job cache to tell the pods of managed Jobs, and
// nothing else of the Job controller (neither its queues, nor its expectations, nor the
// maps under its lock).
//
// Whose pods. Every case applies to the pods of managed Jobs (Config.ManagedBy). With
// RecoverAll (the default, --recover-pods=all) opted-in pods of anything else are
// recovered too, as Kueue's failure recovery does: a built-in Job's, a JobSet's (its pods
// are its Jobs' pods), a bare pod, a StatefulSet's; only the opt-in cases (Z1, Z2, deleting
// a terminal pod) apply to them, and only in informers.Informers.OtherPodsNamespace when
// that is set. The managed Jobs' pods are in the Pods informer, whole. The other pods are
// watched only where those cases can apply, on the nodes tainted unreachable: with
// RecoverAll, one informer of stripped pods per such node (informers.Informers.NodePods),
// which the recoverer starts and stops as the taint comes and goes (nodepods.go). Its
// handlers enqueue only opted-in pods.
package recoverer

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/informers"
	"github.com/coroner-dev/coroner/shim/metrics"
	"github.com/coroner-dev/coroner/shim/queue"
	"github.com/coroner-dev/coroner/shim/recovery"
)

// RecoverScope is Config.RecoverPods.
type RecoverScope string

// Values of RecoverScope.
const (
	// RecoverAll recovers every opted-in pod (Z1, Z2), whoever owns it, and every case
	// (Z1-Z4) for the pods of managed Jobs.
	RecoverAll RecoverScope = "all"
	// RecoverManaged recovers only the pods of managed Jobs.
	RecoverManaged RecoverScope = "managed"
)

// Config configures a Recoverer. Zero fields take the defaults. The namespaces it works
// with are the informers': the agents' Leases are read from AgentNamespace, and pods that
// are not of managed Jobs are recovered only in OtherPodsNamespace when that is set
// (informers.Config).
type Config struct {
	// ManagedBy is the spec.managedBy value of the Jobs whose pods every case applies to;
	// default conditions.ManagedBy.
	ManagedBy string
	// Recovery holds the times of the decisions (Z1-Z4); zero fields take the package
	// recovery's defaults.
	Recovery recovery.Config
	// RecoverPods says whose pods are recovered: RecoverAll (the default) every opted-in
	// pod, as Kueue does, RecoverManaged only the pods of managed Jobs.
	RecoverPods RecoverScope
	// Workers is the number of pods handled concurrently; default 1 (recoveries are few,
	// and each is a couple of writes).
	Workers int
	// Clock is the recoverer's clock; default clock.RealClock{}.
	Clock clock.WithTicker
	// Metrics receives coroner_pods_recovered_total; nil means a private registry.
	Metrics *metrics.Metrics
	// Recorder emits the Events on the recovered pods and their managed Jobs. Required:
	// the caller shares one with the Job controller (shim.NewControllers does).
	Recorder record.EventRecorder
}

// Recoverer carries out node-failure recovery. Create it with New.
type Recoverer struct {
	client kubernetes.Interface
	cfg    Config
	inf    *informers.Informers
	// logger is for the event handlers, which have no context of their own.
	logger  klog.Logger
	patcher conditions.PodPatcher
	// queue holds the keys (namespace/name) of pods to look at.
	queue queue.Queue

	// nodes are the informers of the pods of the nodes tainted unreachable (RecoverAll).
	nodes nodeWatches

	// mu guards nodesMissing and heartbeats, and nothing else.
	mu sync.Mutex
	// nodesMissing are the nodes the API server said do not exist, with when it first
	// said so (the orphans' quarantine, Z3).
	nodesMissing map[string]time.Time
	// heartbeats are the last reads of a node's kubelet Lease and agent pod, by node
	// (fenceEvidence).
	heartbeats map[string]heartbeat
}

// New builds a Recoverer on the shared informers inf and registers its event handlers on
// them; nothing runs until Run (the caller starts the informers). ctx gives the logger of
// the event handlers; nothing else of it is kept.
func New(ctx context.Context, client kubernetes.Interface, inf *informers.Informers, cfg Config) *Recoverer {
	if cfg.ManagedBy == "" {
		cfg.ManagedBy = conditions.ManagedBy
	}
	if cfg.RecoverPods == "" {
		cfg.RecoverPods = RecoverAll
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 1
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.New(prometheus.NewRegistry())
	}
	if cfg.Recorder == nil {
		panic("recoverer.New: Config.Recorder is nil")
	}
	r := &Recoverer{
		client:       client,
		cfg:          cfg,
		inf:          inf,
		logger:       klog.FromContext(ctx),
		patcher:      conditions.NewPodPatcher(client, conditions.ShimComponent),
		queue:        queue.New("coroner_recovery_pod", cfg.Clock),
		nodesMissing: map[string]time.Time{},
		heartbeats:   map[string]heartbeat{},
		nodes:        nodeWatches{byNode: map[string]*nodeWatch{}, podNode: map[string]string{}},
	}
	r.addHandlers()
	return r
}

// informers are the shared informers the recoverer reads, to wait for: not the informers
// of the nodes' pods, which come and go with the taints (a node's opted-in pods are
// enqueued as its informer lists them).
func (r *Recoverer) informers() []cache.SharedIndexInformer {
	return []cache.SharedIndexInformer{r.inf.Jobs, r.inf.Pods, r.inf.Nodes, r.inf.Leases}
}

// HasSynced reports whether the informers the recoverer reads have synced.
func (r *Recoverer) HasSynced() bool { return informers.Synced(r.informers()...) }

// Run starts the informers of the pods of the nodes tainted unreachable (RecoverAll), waits
// for the shared caches it reads to sync (the caller starts those informers), and runs the
// workers until ctx is done. Then it shuts its queue down and waits for every worker to
// finish the pod it is on: a recovery in flight carries on with a context that ctx's
// cancellation does not reach, so that its status write and forced deletion are not cut
// in half. Last it stops the informers of the nodes' pods and waits for them. It returns
// an error if the caches did not sync before ctx was done. Call it once.
func (r *Recoverer) Run(ctx context.Context) error {
	defer utilruntime.HandleCrash()
	logger := klog.FromContext(ctx)
	logger.Info("Starting node-failure recovery", "recoverPods", r.cfg.RecoverPods, "agentNamespace", r.inf.AgentNamespace, "workers", r.cfg.Workers)
	defer logger.Info("Shut down node-failure recovery")
	// Starts the informers of the nodes' pods now, stops them once the workers are done.
	defer r.runNodeWatches(ctx)()
	return queue.Serve(ctx, r.cfg.Workers, func() error {
		if !informers.WaitForCacheSync(ctx, r.informers()...) {
			return fmt.Errorf("the Job, Pod, Node and Lease caches of node-failure recovery did not sync: %w", context.Cause(ctx))
		}
		return nil
	}, queue.Worker{Queue: r.queue, Handle: r.recoverPod, What: "Recovering a pod from a node failure", Kind: "pod"})
}

// addHandlers registers the event handlers on the informers.
func (r *Recoverer) addHandlers() {
	if _, err := r.inf.Pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    r.addPod,
		UpdateFunc: r.updatePod,
	}); err != nil {
		panic(fmt.Sprintf("adding the Pod event handler: %v", err))
	}
	if _, err := r.inf.Nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    r.addNode,
		UpdateFunc: r.updateNode,
		DeleteFunc: r.deleteNode,
	}); err != nil {
		panic(fmt.Sprintf("adding the Node event handler: %v", err))
	}
	if _, err := r.inf.Leases.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    r.leaseChanged,
		UpdateFunc: func(_, cur any) { r.leaseChanged(cur) },
		DeleteFunc: r.leaseChanged,
	}); err != nil {
		panic(fmt.Sprintf("adding the Lease event handler: %v", err))
	}
}

// Event handlers.

func (r *Recoverer) addPod(obj any) {
	if pod, ok := obj.(*corev1.Pod); ok {
		r.enqueueJobPod(pod)
	}
}

func (r *Recoverer) updatePod(old, cur any) {
	o, ok1 := old.(*corev1.Pod)
	p, ok2 := cur.(*corev1.Pod)
	if ok1 && ok2 && o.ResourceVersion != p.ResourceVersion { // not a resync
		r.enqueueJobPod(p)
	}
}

// addNode starts the informer of the node's pods when the node is tainted unreachable
// (the initial list of nodes comes as Adds). Its pods are enqueued as that informer lists
// them; the managed Jobs' pods were enqueued by their own Adds.
func (r *Recoverer) addNode(obj any) {
	if n, ok := obj.(*corev1.Node); ok {
		r.watchNodePods(n.Name, n)
	}
}

// updateNode starts or stops the informer of the node's pods as the node is tainted
// unreachable or not (at every update: it costs a map lookup), and looks at the node's pods
// again when its taints changed.
func (r *Recoverer) updateNode(old, cur any) {
	o, ok1 := old.(*corev1.Node)
	n, ok2 := cur.(*corev1.Node)
	if !ok1 || !ok2 {
		return
	}
	r.watchNodePods(n.Name, n)
	if !equalTaints(o.Spec.Taints, n.Spec.Taints) {
		r.forgetHeartbeat(n.Name)
		r.enqueueNodePods(n.Name)
	}
}

func (r *Recoverer) deleteNode(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	if n, ok := obj.(*corev1.Node); ok {
		r.forgetHeartbeat(n.Name)
		r.watchNodePods(n.Name, nil)
		r.enqueueNodePods(n.Name)
	}
}

// leaseChanged handles an agent Lease (coroner-agent-<node>): its node's pods are looked
// at again.
func (r *Recoverer) leaseChanged(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	if l, ok := obj.(metav1.Object); ok && strings.HasPrefix(l.GetName(), conditions.AgentLeasePrefix) {
		r.enqueueNodePods(strings.TrimPrefix(l.GetName(), conditions.AgentLeasePrefix))
	}
}

// equalTaints compares taints by key and effect, the only parts recovery reads.
func equalTaints(a, b []corev1.Taint) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Key != b[i].Key || a[i].Effect != b[i].Effect {
			return false
		}
	}
	return true
}

// enqueueJobPod queues a pod of the Pods informer (a managed Job's) whose change may call for a
// recovery: one recovery.Relevant says so of, or one bound to a node the cache does not know
// (an orphan, Z3, unless the cache lags: recoverPod asks the API server). Whether it is of
// a managed Job is for recoverPod to see: the Job may not be in the lister yet.
func (r *Recoverer) enqueueJobPod(pod *corev1.Pod) {
	if recovery.Relevant(pod, false) || r.nodeUnknown(pod) {
		r.queue.Add(cache.MetaObjectToName(pod).String())
	}
}

// nodeUnknown reports whether the pod is bound to a node the node cache does not hold.
func (r *Recoverer) nodeUnknown(pod *corev1.Pod) bool {
	if pod.Spec.NodeName == "" || conditions.IsTerminalPhase(pod.Status.Phase) || !r.inf.Nodes.HasSynced() {
		return false
	}
	_, err := r.inf.NodeLister.Get(pod.Spec.NodeName)
	return apierrors.IsNotFound(err)
}

// enqueueNodePods queues the relevant pods bound to the node: the managed Jobs' and, when
// it is watched (tainted unreachable, RecoverAll), the other pods.
func (r *Recoverer) enqueueNodePods(node string) {
	if objs, err := r.inf.Pods.GetIndexer().ByIndex(informers.NodeNameIndex, node); err == nil {
		for _, o := range objs {
			if pod, ok := o.(*corev1.Pod); ok {
				r.enqueueJobPod(pod)
			}
		}
	}
	for _, pod := range r.nodePods(node) {
		r.enqueueOtherPod(pod)
	}
}
