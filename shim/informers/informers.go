// Package informers builds coroner-shim's shared informers, once, for both of its
// controllers: the Job controller (shim/controller) and node-failure recovery
// (shim/recoverer). It holds what is cached and how: the selectors, the transforms that
// keep the caches small, and the indexes the controllers look pods up by. Each controller
// registers its own event handlers on the informers it reads; the caller builds the
// controllers, then starts the informers (Start), and shuts them down (Shutdown) once
// every controller has stopped.
//
// The informers:
//
//   - Jobs: every Job (spec.managedBy cannot be selected on).
//   - Pods: the managed Jobs' pods, which carry the label coroner.dev/managed
//     (conditions.ManagedPodLabel), less those the shim counted and labelled
//     coroner.dev/counted (a finished pod leaves the cache with its tracking finalizer:
//     JobPodSelector), stripped by StripJobPod to what the Job sync reads, indexed by the
//     UID of their controlling Job (ControllerUIDIndex), by the value of their
//     batch.kubernetes.io/controller-uid label when they have no controller
//     (OrphanUIDIndex) and by node (NodeNameIndex). The pods of other Jobs (the built-in
//     controller's, Kueue's, a second shim's) are not watched at all.
//   - Nodes: every Node.
//   - Leases: the Leases of Config.AgentNamespace, where coroner-agent's fencing Leases are.
//
// And, built on demand by NodePods, an informer of one node's pods (every pod bound to it,
// stripped by StripForRecovery, in Config.OtherPodsNamespace): node-failure recovery runs
// one for each node tainted unreachable, where the opted-in pods of other controllers may
// need it (shim/recoverer). A pod's opt-in is an annotation, which a watch cannot select on,
// so the alternative would be watching every pod of the cluster all the time.
//
// The Job and pod caches do not keep managedFields, which nothing here reads
// (kube-controller-manager drops them too): they are about a third of a pod's memory. A
// status Update of a Job without them leaves the stored managedFields as they are. Nothing
// writes a pod from the cache whole: pods are patched (finalizers, owner references,
// conditions) or deleted, so what StripJobPod drops is never written back.
package informers

import (
	"context"
	"fmt"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	kinformers "k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	batchlisters "k8s.io/client-go/listers/batch/v1"
	coordinationlisters "k8s.io/client-go/listers/coordination/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/coroner-dev/coroner/conditions"
)

// DefaultAgentNamespace is the default of Config.AgentNamespace.
const DefaultAgentNamespace = "coroner-system"

// JobPodSelector selects the pods of Pods: the managed Jobs' pods (conditions.ManagedPodLabel)
// but those the shim has counted and labelled to leave the cache (conditions.CountedLabel,
// jobsync.LeavesCache). A pod that loses the managed label (someone removed it, or all of
// the pod's labels) leaves the cache too, with a delete event whose object is its last
// state before the change: the Job controller tells that from a deletion (the pod still has
// the tracking finalizer and no deletionTimestamp) and looks at the pod again.
const JobPodSelector = conditions.ManagedPodLabel + ",!" + conditions.CountedLabel

// Names of the pod indexes.
const (
	// ControllerUIDIndex indexes pods (of Pods) by the UID of their
	// controller when it is a batch/v1 Job.
	ControllerUIDIndex = "coroner.dev/controller-uid"
	// OrphanUIDIndex indexes the pods of Pods that have no controller reference by the
	// value of their batch.kubernetes.io/controller-uid label: the orphans a Job's
	// generated selector matches.
	OrphanUIDIndex = "coroner.dev/orphan-controller-uid"
	// NodeNameIndex indexes pods (of Pods) by spec.nodeName.
	NodeNameIndex = "coroner.dev/node-name"
)

// Config configures the informers. Zero fields take the defaults.
type Config struct {
	// AgentNamespace is where coroner-agent's fencing Leases are; default
	// DefaultAgentNamespace.
	AgentNamespace string
	// OtherPodsNamespace limits the informers of a node's pods (NodePods) to one
	// namespace, and with it node-failure recovery of pods that are not of managed Jobs
	// (shim/recoverer); "" (the shim's) is every namespace. Tests that run controllers side
	// by side on one API server set it.
	OtherPodsNamespace string
}

// Informers are the shared informers and their listers. Build them with New; the fields
// are set by New and read only afterwards.
type Informers struct {
	// AgentNamespace and OtherPodsNamespace are Config's, with the defaults applied.
	AgentNamespace, OtherPodsNamespace string

	Jobs      cache.SharedIndexInformer
	JobLister batchlisters.JobLister
	// Pods are the Jobs' pods, stripped (StripJobPod).
	Pods       cache.SharedIndexInformer
	PodLister  corelisters.PodLister
	Nodes      cache.SharedIndexInformer
	NodeLister corelisters.NodeLister
	// Leases are the Leases of AgentNamespace.
	Leases      cache.SharedIndexInformer
	LeaseLister coordinationlisters.LeaseLister

	client    kubernetes.Interface
	factories []kinformers.SharedInformerFactory
}

// New builds the informers for client, with their transforms and indexes. Nothing runs
// until Start.
func New(client kubernetes.Interface, cfg Config) *Informers {
	if cfg.AgentNamespace == "" {
		cfg.AgentNamespace = DefaultAgentNamespace
	}
	jobFactory := kinformers.NewSharedInformerFactoryWithOptions(client, 0,
		kinformers.WithTransform(stripManagedFields))
	podFactory := kinformers.NewSharedInformerFactoryWithOptions(client, 0,
		kinformers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = JobPodSelector }),
		kinformers.WithTransform(StripJobPod))
	nodeFactory := kinformers.NewSharedInformerFactory(client, 0)
	leaseFactory := kinformers.NewSharedInformerFactoryWithOptions(client, 0, kinformers.WithNamespace(cfg.AgentNamespace))

	jobs := jobFactory.Batch().V1().Jobs()
	pods := podFactory.Core().V1().Pods()
	nodes := nodeFactory.Core().V1().Nodes()
	leases := leaseFactory.Coordination().V1().Leases()
	i := &Informers{
		AgentNamespace:     cfg.AgentNamespace,
		OtherPodsNamespace: cfg.OtherPodsNamespace,
		Jobs:               jobs.Informer(), JobLister: jobs.Lister(),
		Pods: pods.Informer(), PodLister: pods.Lister(),
		Nodes: nodes.Informer(), NodeLister: nodes.Lister(),
		Leases: leases.Informer(), LeaseLister: leases.Lister(),
		client:    client,
		factories: []kinformers.SharedInformerFactory{jobFactory, podFactory, nodeFactory, leaseFactory},
	}
	// AddIndexers only fails once an informer has started, which these have not.
	if err := i.Pods.AddIndexers(cache.Indexers{
		ControllerUIDIndex: indexByControllerUID,
		OrphanUIDIndex:     indexOrphanByUIDLabel,
		NodeNameIndex:      indexByNodeName,
	}); err != nil {
		panic(fmt.Sprintf("adding the pod indexes: %v", err))
	}
	return i
}

// NodePods returns a new informer of the pods bound to node (a field selector on
// spec.nodeName, which the API server serves from its watch cache by index, as it does a
// kubelet's), in OtherPodsNamespace, stripped by StripForRecovery. The caller registers its
// handlers, runs it (Run) and stops it; it is not started by Start.
func (i *Informers) NodePods(node string) cache.SharedIndexInformer {
	sel := fields.OneTermEqualSelector("spec.nodeName", node).String()
	pods := i.client.CoreV1().Pods(i.OtherPodsNamespace)
	inf := cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = sel
			return pods.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = sel
			return pods.Watch(ctx, o)
		},
	}, i.client), &corev1.Pod{}, 0, cache.Indexers{})
	if err := inf.SetTransform(StripForRecovery); err != nil {
		panic(fmt.Sprintf("setting the transform of node %s's pod informer: %v", node, err))
	}
	return inf
}

// Start starts every informer; they stop when stop is closed. Register the event handlers
// first (the controllers' constructors do), so that no handler misses the initial list.
func (i *Informers) Start(stop <-chan struct{}) {
	for _, f := range i.factories {
		f.Start(stop)
	}
}

// Shutdown waits for the informers started by Start to stop (their stop channel must be
// closed). Call it once, after every controller reading them has stopped.
func (i *Informers) Shutdown() {
	for _, f := range i.factories {
		f.Shutdown()
	}
}

// Synced reports whether every one of the informers has synced (a controller's
// HasSynced, for /readyz).
func Synced(informers ...cache.SharedIndexInformer) bool {
	for _, i := range informers {
		if !i.HasSynced() {
			return false
		}
	}
	return true
}

// WaitForCacheSync waits until the given informers have synced; false when ctx was done
// first.
func WaitForCacheSync(ctx context.Context, informers ...cache.SharedIndexInformer) bool {
	synced := make([]cache.InformerSynced, len(informers))
	for n, s := range informers {
		synced[n] = s.HasSynced
	}
	return cache.WaitForNamedCacheSyncWithContext(ctx, synced...)
}

// PodByKey returns the pod of a queue key (namespace/name) from lister; nil without error
// when the key is malformed or the cache does not hold the pod.
func PodByKey(lister corelisters.PodLister, key string) (*corev1.Pod, error) {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil, nil
	}
	pod, err := lister.Pods(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	return pod, err
}

// CachedJobOf returns the Job controlling pod from the Job cache: nil when the pod's
// controller is not a batch/v1 Job, or the cache holds no Job of that name and UID.
func (i *Informers) CachedJobOf(pod *corev1.Pod) *batchv1.Job {
	ref := JobControllerRef(pod)
	if ref == nil {
		return nil
	}
	job, err := i.JobLister.Jobs(pod.Namespace).Get(ref.Name)
	if err != nil || job.UID != ref.UID {
		return nil
	}
	return job
}

// JobControllerRef returns the pod's controller reference when it is a batch/v1 Job.
func JobControllerRef(pod *corev1.Pod) *metav1.OwnerReference {
	ref := metav1.GetControllerOf(pod)
	if ref == nil || ref.Kind != "Job" || ref.APIVersion != batchv1.SchemeGroupVersion.String() {
		return nil
	}
	return ref
}

// IsManagedBy reports whether job's spec.managedBy is managedBy (S1).
func IsManagedBy(job *batchv1.Job, managedBy string) bool {
	return job != nil && job.Spec.ManagedBy != nil && *job.Spec.ManagedBy == managedBy
}

// indexByControllerUID: the UID of the pod's controller when it is a batch/v1 Job.
func indexByControllerUID(obj any) ([]string, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return nil, nil
	}
	ref := JobControllerRef(pod)
	if ref == nil {
		return nil, nil
	}
	return []string{string(ref.UID)}, nil
}

// indexOrphanByUIDLabel: the batch.kubernetes.io/controller-uid label of a pod without a
// controller reference.
func indexOrphanByUIDLabel(obj any) ([]string, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok || metav1.GetControllerOf(pod) != nil {
		return nil, nil
	}
	if uid := pod.Labels[batchv1.ControllerUidLabel]; uid != "" {
		return []string{uid}, nil
	}
	return nil, nil
}

// indexByNodeName: the pod's spec.nodeName.
func indexByNodeName(obj any) ([]string, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok || pod.Spec.NodeName == "" {
		return nil, nil
	}
	return []string{pod.Spec.NodeName}, nil
}
