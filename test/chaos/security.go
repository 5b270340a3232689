package main

import (
	"context"
	"fmt"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/test/lab"
	"github.com/coroner-dev/coroner/test/wrappers"
)

// security: real requests with the agent's and the shim's ServiceAccount tokens (a
// TokenRequest bound to one of their pods, as their projected tokens are; the agent's
// carries its node's name), every write a dry run. The agent may stamp a pod of its own
// node (the control that shows the token works) and nothing else asked here; the shim may
// write the status of Jobs it manages, not of Jobs it does not manage, and may neither
// delete a bare pod that is not opted in to recovery nor create a pod that no Job controls;
// on Nodes it may set the taint coroner.dev/quarantined (NoSchedule) and nothing else: no
// cordon, no other taint, no NoExecute, no label, no deletion (nodes.go); the agent may not
// taint its node.
func security(ctx context.Context, e *env, o options) result {
	r := result{Name: "security"}
	ns, _, cleanup, err := e.namespace(ctx, "security")
	if err != nil {
		return r.fail(err)
	}
	defer func() { cleanup(len(r.Problems) > 0) }()
	const own, other = "lab-node-1", "lab-node-2"

	agent, err := podToken(ctx, e, "app.kubernetes.io/name=coroner-agent", own)
	if err != nil {
		return r.fail(err)
	}
	shim, err := podToken(ctx, e, "app.kubernetes.io/name=coroner-shim", "")
	if err != nil {
		return r.fail(err)
	}

	// Fixtures: a pod on each node, a Secret, a built-in Job and a coroner Job (suspended).
	for _, n := range []string{own, other} {
		p := wrappers.MakePod("on-"+n, ns).Obj()
		p.Spec.NodeName = n
		p.Spec.TerminationGracePeriodSeconds = ptr.To[int64](1)
		p.Spec.Containers[0].Command = []string{"sleep", "600"}
		if _, err := e.cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			return r.fail(err)
		}
	}
	if _, err := e.cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s"}, StringData: map[string]string{"k": "v"}}, metav1.CreateOptions{}); err != nil {
		return r.fail(err)
	}
	builtin := wrappers.MakeJob("builtin", ns).Suspend(true).Command("true").Obj()
	managed := wrappers.MakeJob("managed", ns).ManagedBy(conditions.ManagedBy).Suspend(true).Command("true").Obj()
	for _, j := range []*batchv1.Job{builtin, managed} {
		if _, err := e.cs.BatchV1().Jobs(ns).Create(ctx, j, metav1.CreateOptions{}); err != nil {
			return r.fail(err)
		}
	}

	dry := metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}}
	stamp := []byte(`{"status":{"conditions":[{"type":"DisruptionTarget","status":"True","reason":"TerminationByKubelet","message":"chaos: written with the agent's token"}]}}`)
	label := []byte(`{"metadata":{"labels":{"chaos":"x"}}}`)
	jobStatus := []byte(`{"status":{"failed":7}}`)
	jobSpec := []byte(`{"spec":{"parallelism":3}}`)
	type req struct {
		who, what string
		allowed   bool
		do        func(cs kubernetes.Interface) error
	}
	otherLease := "coroner-agent-" + other
	reqs := []req{
		{"agent", "patch pods/status of a pod on its own node (control)", true, func(cs kubernetes.Interface) error {
			_, err := cs.CoreV1().Pods(ns).Patch(ctx, "on-"+own, types.StrategicMergePatchType, stamp, dry, "status")
			return err
		}},
		{"agent", "patch pods/status of a pod on another node", false, func(cs kubernetes.Interface) error {
			_, err := cs.CoreV1().Pods(ns).Patch(ctx, "on-"+other, types.StrategicMergePatchType, stamp, dry, "status")
			return err
		}},
		{"agent", "patch a pod's labels (own node)", false, func(cs kubernetes.Interface) error {
			_, err := cs.CoreV1().Pods(ns).Patch(ctx, "on-"+own, types.StrategicMergePatchType, label, dry)
			return err
		}},
		{"agent", "delete a pod (own node)", false, func(cs kubernetes.Interface) error {
			return cs.CoreV1().Pods(ns).Delete(ctx, "on-"+own, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		}},
		{"agent", "evict a pod (own node)", false, func(cs kubernetes.Interface) error {
			return cs.CoreV1().Pods(ns).EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: "on-" + own, Namespace: ns}, DeleteOptions: &metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}})
		}},
		{"agent", "get a Secret", false, func(cs kubernetes.Interface) error {
			_, err := cs.CoreV1().Secrets(ns).Get(ctx, "s", metav1.GetOptions{})
			return err
		}},
		{"agent", "list Secrets of coroner-system", false, func(cs kubernetes.Interface) error {
			_, err := cs.CoreV1().Secrets(lab.ShimNamespace).List(ctx, metav1.ListOptions{})
			return err
		}},
		{"agent", "get a Job", false, func(cs kubernetes.Interface) error {
			_, err := cs.BatchV1().Jobs(ns).Get(ctx, "managed", metav1.GetOptions{})
			return err
		}},
		{"agent", "patch a Job's spec", false, func(cs kubernetes.Interface) error {
			_, err := cs.BatchV1().Jobs(ns).Patch(ctx, "managed", types.MergePatchType, jobSpec, dry)
			return err
		}},
		{"agent", "patch a Job's status", false, func(cs kubernetes.Interface) error {
			_, err := cs.BatchV1().Jobs(ns).Patch(ctx, "managed", types.MergePatchType, jobStatus, dry, "status")
			return err
		}},
		{"agent", "update another node's fencing Lease " + otherLease, false, func(cs kubernetes.Interface) error {
			l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: otherLease, Namespace: lab.ShimNamespace},
				Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("chaos")}}
			cur, err := e.cs.CoordinationV1().Leases(lab.ShimNamespace).Get(ctx, otherLease, metav1.GetOptions{})
			if err == nil {
				l = cur.DeepCopy()
				l.Spec.HolderIdentity = ptr.To("chaos")
				_, err = cs.CoordinationV1().Leases(lab.ShimNamespace).Update(ctx, l, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
				return err
			}
			_, err = cs.CoordinationV1().Leases(lab.ShimNamespace).Create(ctx, l, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		}},
		{"shim", "patch the status of a Job it manages (control)", true, func(cs kubernetes.Interface) error {
			_, err := cs.BatchV1().Jobs(ns).Patch(ctx, "managed", types.MergePatchType, jobStatus, dry, "status")
			return err
		}},
		{"shim", "patch the status of a Job it does not manage (no spec.managedBy)", false, func(cs kubernetes.Interface) error {
			_, err := cs.BatchV1().Jobs(ns).Patch(ctx, "builtin", types.MergePatchType, jobStatus, dry, "status")
			return err
		}},
		{"shim", "patch a Job's spec", false, func(cs kubernetes.Interface) error {
			_, err := cs.BatchV1().Jobs(ns).Patch(ctx, "builtin", types.MergePatchType, jobSpec, dry)
			return err
		}},
		{"shim", "delete a Job", false, func(cs kubernetes.Interface) error {
			return cs.BatchV1().Jobs(ns).Delete(ctx, "builtin", metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		}},
		{"shim", "get a Secret", false, func(cs kubernetes.Interface) error {
			_, err := cs.CoreV1().Secrets(ns).Get(ctx, "s", metav1.GetOptions{})
			return err
		}},
		// Its ClusterRole grants pods create and delete in every namespace; the admission
		// policy coroner-shim-own-jobs narrows them to Jobs' pods (and, for deletes, pods
		// opted in to recovery).
		{"shim", "delete a bare pod that is no Job's and not opted in", false, func(cs kubernetes.Interface) error {
			return cs.CoreV1().Pods(ns).Delete(ctx, "on-"+own, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		}},
		{"shim", "create a pod in kube-system", false, func(cs kubernetes.Interface) error {
			p := wrappers.MakePod("chaos-shim-made", "kube-system").Obj()
			_, err := cs.CoreV1().Pods("kube-system").Create(ctx, p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		}},
	}
	// Nodes: the shim may patch them (RBAC) for the quarantine taint only (the admission
	// policy coroner-shim-node-quarantine), the agent not at all. Each try is built from the
	// node as read just before it: its patch is guarded by the resourceVersion, and a
	// failed guard (Invalid, before admission) would pass for an allowed request.
	nodeTry := func(cs kubernetes.Interface, node string, i int) error {
		n, err := e.cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		tries, err := nodeTries(n, time.Now())
		if err != nil {
			return err
		}
		if tries[i].Delete {
			return cs.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		}
		_, err = cs.CoreV1().Nodes().Patch(ctx, node, tries[i].PatchType, tries[i].Body, dry)
		return err
	}
	tries, err := nodeTries(&corev1.Node{}, time.Now())
	if err != nil {
		return r.fail(err)
	}
	for i, tr := range tries {
		reqs = append(reqs, req{"shim", tr.What + " " + other, tr.Allowed, func(cs kubernetes.Interface) error { return nodeTry(cs, other, i) }})
	}
	reqs = append(reqs, req{"agent", tries[0].What + " " + own, false, func(cs kubernetes.Interface) error { return nodeTry(cs, own, 0) }})

	clients := map[string]kubernetes.Interface{"agent": agent, "shim": shim}
	n := 0
	for _, q := range reqs {
		n++
		err := q.do(clients[q.who])
		// Invalid (or Conflict) comes after authentication, authorization and admission:
		// the request was let through, only its value was refused.
		authorized := err == nil || apierrors.IsInvalid(err) || apierrors.IsConflict(err)
		switch {
		case q.allowed && !authorized:
			r.problem("%s: %s: refused (%v): the token does not work, the other checks mean nothing", q.who, q.what, err)
		case !q.allowed && authorized:
			r.problem("FINDING: %s may %s (%v)", q.who, q.what, errOrAllowed(err))
		case !q.allowed && !apierrors.IsForbidden(err):
			r.problem("%s: %s: want Forbidden, got %v", q.who, q.what, err)
		default:
			e.logf("security: %s: %s: %v", q.who, q.what, errOrAllowed(err))
		}
	}
	r.Faults = fmt.Sprintf("%d requests with the agent's and shim's tokens", n)
	return r
}

// podToken returns a client with a token of the ServiceAccount of a coroner pod (matching
// selector, on node if set), bound to that pod.
func podToken(ctx context.Context, e *env, selector, node string) (kubernetes.Interface, error) {
	opts := metav1.ListOptions{LabelSelector: selector}
	if node != "" {
		opts.FieldSelector = "spec.nodeName=" + node
	}
	pods, err := e.cs.CoreV1().Pods(lab.ShimNamespace).List(ctx, opts)
	if err != nil {
		return nil, err
	}
	var pod *corev1.Pod
	for i := range pods.Items {
		if pods.Items[i].DeletionTimestamp == nil {
			pod = &pods.Items[i]
			break
		}
	}
	if pod == nil {
		return nil, fmt.Errorf("no pod %s on %q", selector, node)
	}
	return lab.AsPod(ctx, e.cs, e.rest, pod)
}

func errOrAllowed(err error) string {
	if err == nil {
		return "allowed"
	}
	return err.Error()
}
