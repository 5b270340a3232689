package controller

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	coordinationlisters "k8s.io/client-go/listers/coordination/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/recovery"
)

// Node-failure recovery (Z1-Z4): a queue of pod keys fed by the pod, node and agent-Lease
// informers, synced by recoverPod, which carries out recovery.Decide's Decision: one status
// write (phase Failed and conditions, or the cleared DisruptionTarget), the Events, then the
// forced deletion, and a requeue at the Decision's deadline.
//
// Whose pods. Every case applies to the pods of managed Jobs. With RecoverAll (the default,
// --recover-pods=all) opted-in pods of anything else are recovered too, as Kueue's failure
// recovery does: a built-in Job's, a JobSet's (its pods are its Jobs' pods), a bare pod, a
// StatefulSet's; only the opt-in cases (Z1, Z2, deleting a terminal pod) apply to them.
//
// Which informers. The annotation that opts a pod in cannot be selected on, so recovering
// every opted-in pod means watching every pod. The pods of every Job, managed or not,
// carry the batch.kubernetes.io/controller-uid label and are in the Job controller's pod
// informer already, as whole objects (the Job sync needs them). The other pods, selected with
// "!batch.kubernetes.io/controller-uid", go to a second informer whose transform keeps only
// what recovery reads (stripForRecovery): for a pod that is not opted in, its name,
// namespace, UID and resourceVersion; for an opted-in pod also the opt-in annotations,
// deletionTimestamp and grace period, nodeName, phase and conditions. So no pod is cached
// twice, and the pods of Deployments, DaemonSets and the like cost a stub each rather than
// the whole object: 1.4 KB against 9.6 KB for a typical Deployment pod, 2.2 KB when opted in
// (TestStripForRecoveryMemory; the empty corev1.Pod struct is most of the stub). The
// handlers of that informer enqueue only opted-in pods for recovery, and only with
// RecoverAll. The informer exists with RecoverManaged too, for the Job sync: a pod of a Job
// whose labels were changed so that it lost controller-uid is there (with its labels, owner
// references and finalizers), for its Job to release it (claim.go).

// nodeNameIndex indexes pods by spec.nodeName.
const nodeNameIndex = "coroner.dev/node-name"

func indexByNodeName(obj any) ([]string, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok || pod.Spec.NodeName == "" {
		return nil, nil
	}
	return []string{pod.Spec.NodeName}, nil
}

// setupRecovery builds the node and Lease informers, the informer of the pods that are not
// Jobs' pods, and their handlers (New calls it).
func (c *Controller) setupRecovery() {
	c.nodeFactory = informers.NewSharedInformerFactory(c.client, 0)
	c.leaseFactory = informers.NewSharedInformerFactoryWithOptions(c.client, 0, informers.WithNamespace(c.cfg.AgentNamespace))
	nodes := c.nodeFactory.Core().V1().Nodes()
	leases := c.leaseFactory.Coordination().V1().Leases()
	c.nodeInformer, c.nodeLister = nodes.Informer(), nodes.Lister()
	c.leaseInformer, c.leaseLister = leases.Informer(), leases.Lister()
	if err := c.podInformer.AddIndexers(cache.Indexers{nodeNameIndex: indexByNodeName}); err != nil {
		panic(fmt.Sprintf("adding the pod node index: %v", err))
	}
	// The other pods' informer exists with either scope: besides recovery, it is where the
	// Job sync finds a pod of one of its Jobs that lost its controller-uid label, to release
	// it (claim.go).
	c.otherPodFactory = informers.NewSharedInformerFactoryWithOptions(c.client, 0,
		informers.WithNamespace(c.cfg.RecoveryNamespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = "!" + batchv1.ControllerUidLabel }),
		informers.WithTransform(stripForRecovery))
	others := c.otherPodFactory.Core().V1().Pods()
	c.otherPodInformer, c.otherPodLister = others.Informer(), others.Lister()
	if err := c.otherPodInformer.AddIndexers(cache.Indexers{nodeNameIndex: indexByNodeName, controllerUIDIndex: indexByControllerUID}); err != nil {
		panic(fmt.Sprintf("adding the pod node index: %v", err))
	}
	c.otherPodIndexer = c.otherPodInformer.GetIndexer()
	otherPodChanged := func(obj any) {
		pod, ok := obj.(*corev1.Pod)
		if !ok {
			return
		}
		if c.cfg.RecoverPods == RecoverAll && recovery.Relevant(pod, true) {
			c.recoveryQueue.Add(cache.MetaObjectToName(pod).String())
		}
		if jobControllerRef(pod) != nil {
			// A Job's pod without the controller-uid label: its Job releases it.
			if job, _ := c.jobOf(pod); job != nil {
				c.enqueueBatched(keyOf(job))
			}
		}
	}
	if _, err := c.otherPodInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    otherPodChanged,
		UpdateFunc: func(_, cur any) { otherPodChanged(cur) },
	}); err != nil {
		panic(fmt.Sprintf("adding the Pod event handler: %v", err))
	}
	if _, err := c.nodeInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(old, cur any) {
			o, ok1 := old.(*corev1.Node)
			n, ok2 := cur.(*corev1.Node)
			if ok1 && ok2 && !equalTaints(o.Spec.Taints, n.Spec.Taints) {
				c.enqueueNodePods(n.Name)
			}
		},
		DeleteFunc: func(obj any) {
			if n, ok := obj.(*corev1.Node); ok {
				c.enqueueNodePods(n.Name)
			} else if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				if n, ok := t.Obj.(*corev1.Node); ok {
					c.enqueueNodePods(n.Name)
				}
			}
		},
	}); err != nil {
		panic(fmt.Sprintf("adding the Node event handler: %v", err))
	}
	leaseChanged := func(obj any) {
		l, ok := obj.(metav1.Object)
		if t, isTomb := obj.(cache.DeletedFinalStateUnknown); isTomb {
			l, ok = t.Obj.(metav1.Object)
		}
		if ok && strings.HasPrefix(l.GetName(), conditions.AgentLeasePrefix) {
			c.enqueueNodePods(strings.TrimPrefix(l.GetName(), conditions.AgentLeasePrefix))
		}
	}
	if _, err := c.leaseInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    leaseChanged,
		UpdateFunc: func(_, cur any) { leaseChanged(cur) },
		DeleteFunc: leaseChanged,
	}); err != nil {
		panic(fmt.Sprintf("adding the Lease event handler: %v", err))
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

// stripForRecovery is the transform of the informer of pods that are not Jobs' pods: it
// keeps what recovery.Decide, recovery.Relevant and the status writer read of an opted-in
// pod, and only the identity of any other (the informer still has to know the pod, to see
// it opted in later or gone). It is idempotent, as a transform must be.
func stripForRecovery(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	out := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
		Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion,
	}}
	if ref := jobControllerRef(p); ref != nil {
		// A Job's pod that lost its controller-uid label: what the Job's sync needs to
		// release it (claim.go). Rare: the pods of Jobs carry that label.
		out.OwnerReferences = []metav1.OwnerReference{*ref}
		out.Labels = p.Labels
		out.Finalizers = p.Finalizers
		out.DeletionTimestamp = p.DeletionTimestamp
	}
	if !conditions.OptedInToForcefulDeletion(p.Annotations) {
		return out, nil
	}
	out.Annotations = map[string]string{}
	for _, k := range conditions.SafeToForcefullyDeleteAnnotations {
		if v, ok := p.Annotations[k]; ok {
			out.Annotations[k] = v
		}
	}
	out.DeletionTimestamp = p.DeletionTimestamp
	out.DeletionGracePeriodSeconds = p.DeletionGracePeriodSeconds
	out.Spec.NodeName = p.Spec.NodeName
	out.Status.Phase = p.Status.Phase
	out.Status.Conditions = p.Status.Conditions
	return out, nil
}

// enqueueRecovery queues a pod of the Jobs' pod informer whose change may call for a
// recovery: one recovery.Relevant says so of, or one bound to a node the cache does not know
// (an orphan, Z3, unless the cache lags: recoverPod asks the API server). Whether it is of
// a managed Job is for recoverPod to see: the Job may not be in the lister yet.
func (c *Controller) enqueueRecovery(pod *corev1.Pod) {
	if recovery.Relevant(pod, false) || c.nodeUnknown(pod) {
		c.recoveryQueue.Add(cache.MetaObjectToName(pod).String())
	}
}

// nodeUnknown reports whether the pod is bound to a node the node cache does not hold.
func (c *Controller) nodeUnknown(pod *corev1.Pod) bool {
	if pod.Spec.NodeName == "" || conditions.IsTerminalPhase(pod.Status.Phase) || !c.nodeInformer.HasSynced() {
		return false
	}
	_, err := c.nodeLister.Get(pod.Spec.NodeName)
	return apierrors.IsNotFound(err)
}

// enqueueNodePods queues the relevant pods bound to the node.
func (c *Controller) enqueueNodePods(node string) {
	if objs, err := c.podIndexer.ByIndex(nodeNameIndex, node); err == nil {
		for _, o := range objs {
			if pod, ok := o.(*corev1.Pod); ok {
				c.enqueueRecovery(pod)
			}
		}
	}
	if c.cfg.RecoverPods != RecoverAll {
		return
	}
	if objs, err := c.otherPodIndexer.ByIndex(nodeNameIndex, node); err == nil {
		for _, o := range objs {
			if pod, ok := o.(*corev1.Pod); ok && recovery.Relevant(pod, true) {
				c.recoveryQueue.Add(cache.MetaObjectToName(pod).String())
			}
		}
	}
}

// recoveryPod returns the pod of a recovery queue key from the Jobs' pod cache, else from
// the cache of the other pods (other is true then: the pod is a stub, never taken for a
// managed Job's); nil without error when it is in neither.
func (c *Controller) recoveryPod(key string) (pod *corev1.Pod, other bool, err error) {
	pod, err = c.cachedPod(key)
	if pod != nil || err != nil {
		return pod, false, err
	}
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil, false, nil
	}
	pod, err = c.otherPodLister.Pods(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil, false, nil
	}
	return pod, true, err
}

// recoversOthers reports whether the pod, not of a managed Job, is to be recovered: with
// RecoverAll, within RecoveryNamespace, opted in.
func (c *Controller) recoversOthers(pod *corev1.Pod) bool {
	return c.cfg.RecoverPods == RecoverAll &&
		(c.cfg.RecoveryNamespace == "" || pod.Namespace == c.cfg.RecoveryNamespace) &&
		conditions.OptedInToForcefulDeletion(pod.Annotations)
}

// nodeMissingFor records that the API server said the node does not exist, and returns
// for how long that has been so as far as this process knows.
func (c *Controller) nodeMissingFor(node string, now time.Time) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	since, ok := c.nodesMissing[node]
	if !ok {
		c.nodesMissing[node] = now
		return 0
	}
	return now.Sub(since)
}

// nodeFound forgets that the node was missing.
func (c *Controller) nodeFound(node string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.nodesMissing, node)
}

// recoverPod decides about one pod and carries the decision out: a pod of a managed Job,
// or an opted-in pod of anything else (recoversOthers).
func (c *Controller) recoverPod(ctx context.Context, key string) error {
	pod, other, err := c.recoveryPod(key)
	if pod == nil || err != nil {
		return err
	}
	ns, name := pod.Namespace, pod.Name
	var job *batchv1.Job
	if !other {
		job, _ = c.jobOf(pod)
	}
	if job == nil && !c.recoversOthers(pod) {
		return nil
	}
	in := recovery.Input{Pod: pod, Now: c.clock.Now(), OptedInOnly: job == nil}
	if node := pod.Spec.NodeName; node != "" {
		n, err := c.nodeLister.Get(node)
		switch {
		case err == nil:
			in.Node = n
			c.nodeFound(node)
		case apierrors.IsNotFound(err) && in.OptedInOnly:
			// Orphans (Z3) of others are pod GC's: no need to ask the API server.
		case apierrors.IsNotFound(err):
			// The cache may lag behind a node that was just made: ask the API server.
			n, err := c.client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
				in.NodeGone, in.NodeMissingFor = true, c.nodeMissingFor(node, in.Now)
			case err != nil:
				return err
			default:
				in.Node = n
				c.nodeFound(node)
			}
		default:
			return err
		}
		if l, err := c.leaseLister.Leases(c.cfg.AgentNamespace).Get(conditions.AgentLeaseName(node)); err == nil {
			in.Lease = l
		}
	}

	d := c.cfg.Recovery.Decide(in)
	logger := c.logger.WithValues("pod", key, "node", pod.Spec.NodeName)
	now := func() metav1.Time { return metav1.NewTime(c.clock.Now()) }
	switch d.Action {
	case recovery.ForceTerminate, recovery.FailOrphan:
		if _, err := conditions.EnsurePodPhase(ctx, c.patcher, pod, corev1.PodFailed, now, d.Conditions...); err != nil {
			if errors.Is(err, conditions.ErrPodGone) {
				return nil
			}
			return err
		}
		logger.Info("Recovered a pod from a node failure", "action", d.Action, "message", d.Message, "managedJob", job != nil)
		c.recorder.Event(pod, corev1.EventTypeWarning, d.Reason, d.Message)
		if job != nil {
			c.recorder.Event(job, corev1.EventTypeWarning, d.Reason, d.Message)
		}
		c.metrics.PodsRecovered.WithLabelValues(string(d.Action), d.Conditions[0].Reason).Inc()
	case recovery.ClearDisruption:
		if _, err := conditions.EnsurePodCondition(ctx, c.patcher, pod, d.Conditions[0], now); err != nil {
			if errors.Is(err, conditions.ErrPodGone) {
				return nil
			}
			return err
		}
		logger.Info("Cleared a stale DisruptionTarget", "message", d.Message)
		c.recorder.Event(pod, corev1.EventTypeNormal, d.Reason, d.Message)
		c.metrics.PodsRecovered.WithLabelValues(string(d.Action), d.Reason).Inc()
	}
	if d.Delete {
		err := c.client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{
			GracePeriodSeconds: ptr.To[int64](0),
			Preconditions:      &metav1.Preconditions{UID: &pod.UID},
		})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("force-deleting pod %s: %w", key, err)
		}
		if err == nil && d.Action == recovery.DeleteTerminal {
			// The deletion is the write: its Events come after it.
			logger.Info("Force-deleted a terminal pod left on an unreachable node", "message", d.Message, "managedJob", job != nil)
			c.recorder.Event(pod, corev1.EventTypeWarning, d.Reason, d.Message)
			if job != nil {
				c.recorder.Event(job, corev1.EventTypeWarning, d.Reason, d.Message)
			}
			c.metrics.PodsRecovered.WithLabelValues(string(d.Action), conditions.ReasonNodeUnreachable).Inc()
		}
	}
	if d.RequeueAfter > 0 {
		c.recoveryQueue.AddAfter(key, d.RequeueAfter)
	}
	return nil
}

// Listers of the recovery informers, for the fields of Controller. The otherPod ones are
// of the pods that are not Jobs' pods, stripped.
type recoveryListers struct {
	nodeFactory, leaseFactory   informers.SharedInformerFactory
	nodeInformer, leaseInformer cache.SharedIndexInformer
	nodeLister                  corelisters.NodeLister
	leaseLister                 coordinationlisters.LeaseLister
	otherPodFactory             informers.SharedInformerFactory
	otherPodInformer            cache.SharedIndexInformer
	otherPodIndexer             cache.Indexer
	otherPodLister              corelisters.PodLister
}

// synced returns the recovery informers' HasSynced, for the cache sync wait.
func (r *recoveryListers) synced() []cache.InformerSynced {
	return []cache.InformerSynced{r.nodeInformer.HasSynced, r.leaseInformer.HasSynced, r.otherPodInformer.HasSynced}
}

// factories returns the recovery informer factories, to start and shut down.
func (r *recoveryListers) factories() []informers.SharedInformerFactory {
	return []informers.SharedInformerFactory{r.nodeFactory, r.leaseFactory, r.otherPodFactory}
}
