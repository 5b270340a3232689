// Package nodeblame decides, for one completion index of a Job (or a whole NonIndexed
// Job), which nodes its next pod avoids and what its disruption budget did with each
// failure the Job's podFailurePolicy Ignores (docs/choices.md, "When a node keeps killing
// pods"): Judge reads the pods, Avoid writes the avoidance into a new pod's affinity.
//
// The memory is on the pods, as the built-in controller keeps its per-index failure
// counts: every pod coroner-shim creates carries what its index (its Job) had learnt
// before it (api/v1alpha1.AnnotationAvoidedNodes, AnnotationDisruptionsCharged), and a
// failed pod carries what its budget did (AnnotationBudgetVerdict, set with the removal of
// its tracking finalizer), so that a decision once taken is never taken again differently
// and survives the failed pod's deletion once a later pod carries it on.
//
// The package is pure: pods in, a Story out.
package nodeblame

import (
	"cmp"
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/backoff"
)

// Story is what Judge found for a group of pods (one index, or a NonIndexed Job).
type Story struct {
	// Avoided are the nodes that killed a pod of the group, oldest first, at most
	// v1alpha1.MaxAvoidedNodes: the nodes the group's next pod avoids.
	Avoided v1alpha1.AvoidedNodes
	// Charged are the failures charged to the budget, carried on and new.
	Charged v1alpha1.Charged
	// Verdicts are, by pod UID, the budget's verdict on each failed pod whose failure an
	// Ignore rule matched and whose class the budget bounds.
	Verdicts map[string]v1alpha1.BudgetVerdict
	// New are the UIDs of the failed pods whose verdict is not on the pod yet (Judge took
	// it now, or found it carried on by a later pod): the controller writes them on the
	// pods as their finalizers go.
	New map[string]bool
	// Damaged are the errors of annotations that did not parse (what parsed is used).
	Damaged []error
}

// Judge tells the story of a group of pods: pods are the group's pods, in any phase;
// budget is the Job's disruption budget (nil: none); ignored reports whether the Job's
// podFailurePolicy Ignores a failed pod's failure (before any budget).
//
// Verdicts already taken stay (the pod's AnnotationBudgetVerdict, or its id carried in a
// pod's AnnotationDisruptionsCharged). The failed pods without one are judged in the order
// they finished (then by name): each is charged while its class's budget (or the default
// one) has room, and spent after.
func Judge(pods []*corev1.Pod, budget v1alpha1.DisruptionBudget, ignored func(*corev1.Pod) bool) Story {
	st := Story{Charged: v1alpha1.Charged{}, Verdicts: map[string]v1alpha1.BudgetVerdict{}, New: map[string]bool{}}

	// What the newest pod carries: the nodes in the order they were blamed.
	var newest *corev1.Pod
	for _, p := range pods {
		if _, ok := p.Annotations[v1alpha1.AnnotationAvoidedNodes]; ok && (newest == nil || newer(p, newest)) {
			newest = p
		}
		if v, ok := p.Annotations[v1alpha1.AnnotationDisruptionsCharged]; ok {
			c, err := v1alpha1.ParseCharged(v)
			st.Charged.Merge(c)
			st.damaged(p, err)
		}
	}
	if newest != nil {
		a, err := v1alpha1.ParseAvoidedNodes(newest.Annotations[v1alpha1.AnnotationAvoidedNodes])
		st.Avoided = a
		st.damaged(newest, err)
	}

	failed := slices.Clone(pods)
	failed = slices.DeleteFunc(failed, func(p *corev1.Pod) bool {
		_, _, blamed := conditions.NodeBlame(p)
		return p.Status.Phase != corev1.PodFailed && !blamed
	})
	slices.SortStableFunc(failed, func(a, b *corev1.Pod) int {
		return cmp.Or(backoff.FinishTime(a).Compare(backoff.FinishTime(b)), cmp.Compare(a.Name, b.Name))
	})
	for _, p := range failed {
		if node, class, ok := conditions.NodeBlame(p); ok && !carried(st.Avoided, newest, p, node) {
			st.Avoided = st.Avoided.Add(node, class)
		}
	}

	if budget == nil {
		return st
	}
	// Verdicts taken: on the pod, or carried on.
	var open []*corev1.Pod
	for _, p := range failed {
		if p.Status.Phase != corev1.PodFailed || !ignored(p) {
			continue
		}
		id := v1alpha1.ChargedID(string(p.UID))
		if v, ok := p.Annotations[v1alpha1.AnnotationBudgetVerdict]; ok {
			verdict, err := v1alpha1.ParseBudgetVerdict(v)
			if err == nil {
				st.Verdicts[string(p.UID)] = verdict
				if verdict.Charged {
					st.Charged.Add(verdict.Class, id)
				}
				continue
			}
			st.damaged(p, err)
		}
		if class, ok := chargedTo(st.Charged, id); ok {
			st.Verdicts[string(p.UID)] = v1alpha1.BudgetVerdict{Charged: true, Class: class}
			st.New[string(p.UID)] = true
			continue
		}
		open = append(open, p)
	}
	for _, p := range open {
		n, of, bounded := budget.Limit(conditions.DisruptionClassOf(p))
		if !bounded {
			continue
		}
		v := v1alpha1.BudgetVerdict{Class: of}
		if len(st.Charged[of]) < n {
			v.Charged = true
			st.Charged.Add(of, v1alpha1.ChargedID(string(p.UID)))
		}
		st.Verdicts[string(p.UID)] = v
		st.New[string(p.UID)] = true
	}
	return st
}

// Spent reports whether the budget was spent for p (its failure counts though an Ignore
// rule matched it), and the verdict.
func (st Story) Spent(p *corev1.Pod) (v1alpha1.BudgetVerdict, bool) {
	v, ok := st.Verdicts[string(p.UID)]
	return v, ok && !v.Charged
}

func (st *Story) damaged(p *corev1.Pod, err error) {
	if err != nil {
		st.Damaged = append(st.Damaged, err)
	}
}

// carried reports whether the blame of failed pod p on node is already in the list the
// newest pod carries: the newest pod was made after p finished and the node is listed.
func carried(a v1alpha1.AvoidedNodes, newest, p *corev1.Pod, node string) bool {
	if newest == nil || newest.CreationTimestamp.Time.Before(backoff.FinishTime(p)) {
		return false
	}
	return slices.ContainsFunc(a, func(x v1alpha1.AvoidedNode) bool { return x.Node == node })
}

// chargedTo is the class id is charged to.
func chargedTo(c v1alpha1.Charged, id string) (conditions.DisruptionClass, bool) {
	for _, class := range conditions.DisruptionClasses {
		if slices.Contains(c[class], id) {
			return class, true
		}
	}
	return "", false
}

// newer orders pods by creation, then name (creation times are to the second).
func newer(a, b *corev1.Pod) bool {
	if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
		return c > 0
	}
	return a.Name > b.Name
}
