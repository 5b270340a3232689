package controller

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

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

// Node-failure recovery (Z1-Z4) of the pods of managed Jobs: a queue of pod keys fed by
// the pod, node and agent-Lease informers, synced by recoverPod, which carries out
// recovery.Decide's Decision: one status write (phase Failed and conditions, or the
// cleared DisruptionTarget), the Events, then the forced deletion, and a requeue at the
// Decision's deadline.

// nodeNameIndex indexes pods by spec.nodeName.
const nodeNameIndex = "coroner.dev/node-name"

func indexByNodeName(obj any) ([]string, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok || pod.Spec.NodeName == "" {
		return nil, nil
	}
	return []string{pod.Spec.NodeName}, nil
}

// setupRecovery builds the node and Lease informers and their handlers (New calls it).
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

// enqueueRecovery queues a pod whose change may call for a recovery: one recovery.Relevant
// says so of, or one bound to a node the cache does not know (an orphan, Z3, unless the
// cache lags: recoverPod asks the API server).
func (c *Controller) enqueueRecovery(pod *corev1.Pod) {
	if recovery.Relevant(pod) || c.nodeUnknown(pod) {
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
	objs, err := c.podIndexer.ByIndex(nodeNameIndex, node)
	if err != nil {
		return
	}
	for _, o := range objs {
		if pod, ok := o.(*corev1.Pod); ok {
			c.enqueueRecovery(pod)
		}
	}
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

// recoverPod decides about one pod of a managed Job and carries the decision out.
func (c *Controller) recoverPod(ctx context.Context, key string) error {
	pod, err := c.cachedPod(key)
	if pod == nil || err != nil {
		return err
	}
	ns, name := pod.Namespace, pod.Name
	job, _ := c.jobOf(pod)
	if job == nil {
		return nil // not a pod of a Job this controller manages
	}
	in := recovery.Input{Pod: pod, Now: c.clock.Now()}
	if node := pod.Spec.NodeName; node != "" {
		n, err := c.nodeLister.Get(node)
		switch {
		case err == nil:
			in.Node = n
			c.nodeFound(node)
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
		logger.Info("Recovered a pod from a node failure", "action", d.Action, "message", d.Message)
		c.recorder.Event(pod, corev1.EventTypeWarning, d.Reason, d.Message)
		c.recorder.Event(job, corev1.EventTypeWarning, d.Reason, d.Message)
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
	}
	if d.RequeueAfter > 0 {
		c.recoveryQueue.AddAfter(key, d.RequeueAfter)
	}
	return nil
}

// Listers of the recovery informers, for the fields of Controller.
type recoveryListers struct {
	nodeFactory, leaseFactory   informers.SharedInformerFactory
	nodeInformer, leaseInformer cache.SharedIndexInformer
	nodeLister                  corelisters.NodeLister
	leaseLister                 coordinationlisters.LeaseLister
}
