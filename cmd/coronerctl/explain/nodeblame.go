package explain

// The node-blame story of a Job (issue 38): which nodes a replacement avoids and why (the
// deaths that blamed them, conditions.NodeBlame), the Job's avoidance, and what its
// disruption budget has spent, per index for an Indexed Job and for the whole Job
// otherwise, as coroner-shim counts them. It is read from the Job's annotations
// (coroner.dev/avoid-failed-nodes, coroner.dev/disruption-budget), from what the shim
// wrote on the pods (coroner.dev/avoided-nodes and coroner.dev/disruptions-charged on a
// replacement, coroner.dev/disruption-budget-verdict on a failed pod) and from the
// JobRecord entries of the pods that are gone (their node and cause). A Job without
// any of these annotations has no such story, and its report is what it always was.

import (
	"fmt"
	"slices"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/policy"
)

// nodeNameField is the field a required avoidance excludes nodes by (matchFields);
// kubernetes.io/hostname is read too, for terms written that way.
const nodeNameField = "metadata.name"

// nodeBlameOn reports whether the Job has a node-blame story: either Job annotation, or a
// pod coroner-shim marked (it may run with --avoid-failed-nodes on by default).
func nodeBlameOn(job *batchv1.Job, pods []*corev1.Pod) bool {
	for _, k := range []string{v1alpha1.AnnotationAvoidFailedNodes, v1alpha1.AnnotationDisruptionBudget} {
		if _, ok := job.Annotations[k]; ok {
			return true
		}
	}
	for _, p := range pods {
		for _, k := range []string{v1alpha1.AnnotationAvoidedNodes, v1alpha1.AnnotationDisruptionsCharged, v1alpha1.AnnotationBudgetVerdict} {
			if _, ok := p.Annotations[k]; ok {
				return true
			}
		}
	}
	return false
}

// jobAvoidance is the Job's coroner.dev/avoid-failed-nodes, "" when it has none (or it
// does not parse: NodeBlameReport.Problems says so).
func jobAvoidance(job *batchv1.Job) v1alpha1.Avoidance {
	if job == nil {
		return ""
	}
	a, err := v1alpha1.AvoidanceOf(job.Annotations, "")
	if err != nil {
		return ""
	}
	return a
}

// jobBudget is the Job's disruption budget, nil when it has none or it does not parse.
func jobBudget(job *batchv1.Job) v1alpha1.DisruptionBudget {
	if job == nil {
		return nil
	}
	b, _ := v1alpha1.DisruptionBudgetOf(job.Annotations)
	return b
}

// avoidedBy are the nodes p carries in coroner.dev/avoided-nodes (what parses of them).
func avoidedBy(p *corev1.Pod) v1alpha1.AvoidedNodes {
	a, _ := v1alpha1.ParseAvoidedNodes(p.Annotations[v1alpha1.AnnotationAvoidedNodes])
	return a
}

// podAvoidance is how p's own affinity keeps it off nodes: required when a required node
// selector term excludes one of them (matchFields metadata.name NotIn, or
// kubernetes.io/hostname NotIn), preferred when only a preferred term does; else the
// Job's avoidance (coroner-shim's --avoid-failed-nodes when the Job has none: "").
// The pod's spec is what the scheduler reads, so it wins over the Job's annotation.
func podAvoidance(job *batchv1.Job, p *corev1.Pod, nodes []string) v1alpha1.Avoidance {
	excludes := func(t corev1.NodeSelectorTerm) bool {
		for _, reqs := range [][]corev1.NodeSelectorRequirement{t.MatchFields, t.MatchExpressions} {
			for _, r := range reqs {
				if r.Operator != corev1.NodeSelectorOpNotIn || (r.Key != nodeNameField && r.Key != corev1.LabelHostname) {
					continue
				}
				for _, n := range nodes {
					if slices.Contains(r.Values, n) {
						return true
					}
				}
			}
		}
		return false
	}
	if a := p.Spec.Affinity; a != nil && a.NodeAffinity != nil {
		if req := a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution; req != nil && slices.ContainsFunc(req.NodeSelectorTerms, excludes) {
			return v1alpha1.AvoidRequired
		}
		for _, t := range a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution {
			if excludes(t.Preference) {
				return v1alpha1.AvoidPreferred
			}
		}
	}
	return jobAvoidance(job)
}

// avoidanceText is the avoidance as the report says it.
func avoidanceText(a v1alpha1.Avoidance) string {
	switch a {
	case "":
		return "not set (coroner-shim's --avoid-failed-nodes decides)"
	case v1alpha1.AvoidNone:
		return "none (the nodes are remembered, not avoided)"
	}
	return string(a)
}

// unschedulable says plainly that a pending pod that avoids nodes cannot be scheduled:
// "cannot be scheduled: it avoids nodes a, b (avoid-failed-nodes: required); scheduler:
// 0/3 nodes are available: ...". ok is false for any other pod, and for one whose
// avoidance is none (it avoids nothing).
func unschedulable(job *batchv1.Job, p *corev1.Pod) (string, bool) {
	if p.Status.Phase != corev1.PodPending || p.Spec.NodeName != "" || p.DeletionTimestamp != nil {
		return "", false
	}
	c := conditions.Find(&p.Status, corev1.PodScheduled)
	if c == nil || c.Status != corev1.ConditionFalse || c.Reason != corev1.PodReasonUnschedulable {
		return "", false
	}
	nodes := avoidedBy(p).Nodes()
	if len(nodes) == 0 {
		return "", false
	}
	scheduler := oneLine(c.Message)
	if scheduler == "" {
		scheduler = "(no message)"
	}
	switch a := podAvoidance(job, p, nodes); a {
	case v1alpha1.AvoidRequired:
		return fmt.Sprintf("cannot be scheduled: it avoids nodes %s (avoid-failed-nodes: required); scheduler: %s", strings.Join(nodes, ", "), scheduler), true
	case v1alpha1.AvoidPreferred:
		return fmt.Sprintf("cannot be scheduled; it prefers to avoid nodes %s (avoid-failed-nodes: preferred, which never keeps a pod from a node it fits, so the cause is elsewhere); scheduler: %s",
			strings.Join(nodes, ", "), scheduler), true
	case "":
		return fmt.Sprintf("cannot be scheduled: it may avoid nodes %s (the Job has no avoid-failed-nodes: coroner-shim's --avoid-failed-nodes decides); scheduler: %s", strings.Join(nodes, ", "), scheduler), true
	}
	return "", false
}

// budgetVerdict is p's coroner.dev/disruption-budget-verdict; ok is false without one (or
// when it does not parse).
func budgetVerdict(p *corev1.Pod) (v1alpha1.BudgetVerdict, bool) {
	s, has := p.Annotations[v1alpha1.AnnotationBudgetVerdict]
	if !has {
		return v1alpha1.BudgetVerdict{}, false
	}
	v, err := v1alpha1.ParseBudgetVerdict(s)
	return v, err == nil
}

// budgetSpentOn reports whether coroner-shim counted failed pod p because its disruption
// budget was spent (the Ignore rule that matched it did not spare it).
func budgetSpentOn(p *corev1.Pod) bool {
	v, ok := budgetVerdict(p)
	return ok && !v.Charged
}

// countsAsFailure is whether the shim counts failed pod p: the rule that matches it
// counts, or its disruption budget was spent.
func countsAsFailure(job *batchv1.Job, p *corev1.Pod) bool {
	return policy.Match(job.Spec.PodFailurePolicy, p).CountsAsFailure() || budgetSpentOn(p)
}

// budgetAction is what a failed pod that an Ignore rule matched did to the Job once its
// disruption budget is taken into account; ok is false when no budget applies (the
// action is then actionText's). counted is actionText's action for the pod as if no rule
// had matched.
func budgetAction(job *batchv1.Job, p *corev1.Pod, res policy.Result, counted string) (string, bool) {
	v, hasVerdict := budgetVerdict(p)
	budget := jobBudget(job)
	if !hasVerdict && (res.Action != batchv1.PodFailurePolicyActionIgnore || budget == nil || ptrValue(job.Spec.ManagedBy) != conditions.ManagedBy) {
		return "", false
	}
	class := v.Class
	if !hasVerdict {
		var limited bool
		if _, class, limited = budget.Limit(conditions.DisruptionClassOf(p)); !limited {
			return "", false
		}
	}
	limit, _, limited := budget.Limit(class)
	of := fmt.Sprintf("its %s budget", class)
	if limited {
		of = fmt.Sprintf("its %s budget (%d)", class, limit)
	}
	// What was charged before the pod was made rides on the pod itself.
	charged, _ := v1alpha1.ParseCharged(p.Annotations[v1alpha1.AnnotationDisruptionsCharged])
	before := len(charged[class])
	// "counted: failure 2 of index 0, ..." or "counted towards backoffLimit 6 (...)".
	if rest, ok := strings.CutPrefix(counted, "counted: "); ok {
		counted = rest
	} else if rest, ok := strings.CutPrefix(counted, "counted "); ok {
		counted = "it counts " + rest
	}
	switch {
	case hasVerdict && !v.Charged:
		return fmt.Sprintf("counted: %s was spent; %s", of, counted), true
	case hasVerdict && limited:
		return fmt.Sprintf("not counted; the pod is replaced; charged to its %s budget (%d/%d)", class, before+1, limit), true
	case hasVerdict:
		return fmt.Sprintf("not counted; the pod is replaced; charged to its %s budget", class), true
	case before >= limit:
		return fmt.Sprintf("counted: %s is spent (%d charged before this pod; coroner-shim has not marked it yet); %s", of, before, counted), true
	}
	return fmt.Sprintf("not counted; the pod is replaced; to be charged to its %s budget (%d/%d; coroner-shim has not marked it yet)", class, before+1, limit), true
}

// blameLine is the detail line of a failed pod whose death blames its node: "node node-a
// is blamed (node-oom): its replacement avoids it (avoid-failed-nodes: required)".
func blameLine(job *batchv1.Job, p *corev1.Pod) (Line, bool) {
	node, class, ok := conditions.NodeBlame(p)
	if !ok {
		return Line{}, false
	}
	text := fmt.Sprintf("node %s is blamed (%s)", node, class)
	switch a := jobAvoidance(job); a {
	case v1alpha1.AvoidPreferred, v1alpha1.AvoidRequired:
		text += fmt.Sprintf(": its replacement avoids it (avoid-failed-nodes: %s)", a)
	case v1alpha1.AvoidNone:
		text += ": remembered, not avoided (avoid-failed-nodes: none)"
	}
	return Line{"blame", text}, true
}

// avoidsLine is the detail line of a pod that carries avoided nodes: "node-a (device),
// node-b (node-oom); required".
func avoidsLine(job *batchv1.Job, p *corev1.Pod) (Line, bool) {
	a := avoidedBy(p)
	if len(a) == 0 {
		return Line{}, false
	}
	parts := make([]string, len(a))
	for i, x := range a {
		parts[i] = fmt.Sprintf("%s (%s)", x.Node, x.Class)
	}
	return Line{"avoids", strings.Join(parts, ", ") + "; avoid-failed-nodes: " + avoidanceText(podAvoidance(job, p, a.Nodes()))}, true
}

// nodeBlameDetails adds, to the report of a pod of a Job with a node-blame story, the
// nodes it avoids, the node its death blames, and a warning when it cannot be scheduled.
func nodeBlameDetails(job *batchv1.Job, p *corev1.Pod, pr *PodReport) {
	if l, ok := avoidsLine(job, p); ok {
		pr.Details = append(pr.Details, l)
	}
	if l, ok := blameLine(job, p); ok && job != nil && nodeBlameOn(job, nil) {
		pr.Details = append(pr.Details, l)
	}
	if s, ok := unschedulable(job, p); ok {
		pr.Warnings = append(pr.Warnings, s)
	}
}

// entryBlame is the node and class of a recorded pod whose death blamed its node, read as
// conditions.NodeBlame reads a live pod (the entry keeps the cause's condition).
func entryBlame(e *v1alpha1.Entry) (string, conditions.DisruptionClass, bool) {
	if e == nil || e.Cause == nil || e.Cause.Condition == "" {
		return "", "", false
	}
	p := &corev1.Pod{Spec: corev1.PodSpec{NodeName: e.Node}, Status: corev1.PodStatus{Phase: e.Phase,
		Conditions: []corev1.PodCondition{{Type: e.Cause.Condition, Status: corev1.ConditionTrue, Reason: e.Cause.Reason, Message: e.Cause.Message}}}}
	return conditions.NodeBlame(p)
}

// nodeBlameReport is the node-blame story of the Job from its pods' reports (existing
// pods oldest first, then the recorded ones); nil for a Job without one.
func nodeBlameReport(job *batchv1.Job, own []*corev1.Pod, pods []PodReport) *NodeBlameReport {
	if !nodeBlameOn(job, own) {
		return nil
	}
	nb := &NodeBlameReport{Avoidance: string(jobAvoidance(job)), Budget: job.Annotations[v1alpha1.AnnotationDisruptionBudget]}
	if _, err := v1alpha1.AvoidanceOf(job.Annotations, ""); err != nil {
		nb.Problems = append(nb.Problems, err.Error()+"; coroner-shim uses its --avoid-failed-nodes default")
	}
	budget, err := v1alpha1.DisruptionBudgetOf(job.Annotations)
	if err != nil {
		nb.Problems = append(nb.Problems, err.Error()+"; coroner-shim applies no budget: Ignore is unbounded")
		nb.Budget = ""
	}

	if ptrValue(job.Spec.ManagedBy) != conditions.ManagedBy && nodeBlameOn(job, nil) {
		nb.Problems = append(nb.Problems, "coroner-shim does not run this Job (spec.managedBy is not "+conditions.ManagedBy+"): the annotations have no effect")
	}

	groups := map[int]*blameGroup{}
	var order []int
	group := func(ix int) *blameGroup {
		g, ok := groups[ix]
		if !ok {
			g = &blameGroup{charged: v1alpha1.Charged{}, blamed: map[string]*AvoidedNodeReport{}}
			groups[ix] = g
			order = append(order, ix)
		}
		return g
	}
	for i := range pods {
		pr := &pods[i]
		ix := noIndex
		if pr.Index != nil {
			ix = *pr.Index
		}
		if indexed(job) && ix == noIndex {
			continue
		}
		g := group(ix)
		if p := pr.pod; p != nil {
			g.newest = p // existing pods come oldest first
			c, _ := v1alpha1.ParseCharged(p.Annotations[v1alpha1.AnnotationDisruptionsCharged])
			g.charged.Merge(c)
			if v, ok := budgetVerdict(p); ok {
				if v.Charged {
					g.charged.Add(v.Class, v1alpha1.ChargedID(string(p.UID)))
				} else {
					g.counted = append(g.counted, countedPod{v.Class, p.Name})
				}
			}
			if node, class, ok := conditions.NodeBlame(p); ok {
				g.blame(node, class, p.Name)
			}
			if s, ok := unschedulable(job, p); ok {
				g.unschedulable = append(g.unschedulable, p.Name+" "+s)
			}
			continue
		}
		if node, class, ok := entryBlame(pr.entry); ok {
			g.blame(node, class, pr.Name)
		}
	}
	slices.Sort(order)
	for _, ix := range order {
		if out, ok := groups[ix].report(ix, budget); ok {
			nb.Groups = append(nb.Groups, out)
		}
	}
	return nb
}

// blameGroup gathers an index's (a NonIndexed Job's) pods for its BlameGroup.
type blameGroup struct {
	newest        *corev1.Pod
	charged       v1alpha1.Charged
	counted       []countedPod
	blamed        map[string]*AvoidedNodeReport
	blamedOrder   []string
	unschedulable []string
}

type countedPod struct {
	class conditions.DisruptionClass
	pod   string
}

func (g *blameGroup) blame(node string, class conditions.DisruptionClass, pod string) {
	n, ok := g.blamed[node]
	if !ok {
		n = &AvoidedNodeReport{Node: node}
		g.blamed[node] = n
		g.blamedOrder = append(g.blamedOrder, node)
	}
	n.Class = string(class) // the latest death's
	if !slices.Contains(n.Pods, pod) {
		n.Pods = append(n.Pods, pod)
	}
}

// report is the group's BlameGroup; ok is false when it has nothing to say.
func (g *blameGroup) report(ix int, budget v1alpha1.DisruptionBudget) (BlameGroup, bool) {
	var out BlameGroup
	if ix != noIndex {
		out.Index = ptrTo(ix)
	}
	var carried v1alpha1.AvoidedNodes
	if g.newest != nil {
		carried = avoidedBy(g.newest)
		out.Pod = g.newest.Name
	}
	for _, a := range carried {
		n := AvoidedNodeReport{Node: a.Node, Class: string(a.Class), Avoided: true}
		if b, ok := g.blamed[a.Node]; ok {
			n.Pods = b.Pods
		}
		out.Nodes = append(out.Nodes, n)
	}
	for _, node := range g.blamedOrder {
		if !slices.ContainsFunc(carried, func(a v1alpha1.AvoidedNode) bool { return a.Node == node }) {
			out.Nodes = append(out.Nodes, *g.blamed[node])
		}
	}
	if budget != nil {
		for _, class := range conditions.DisruptionClasses {
			limit, ok := budget[class]
			if !ok {
				continue
			}
			u := BudgetUse{Class: string(class), Charged: len(g.charged[class]), Limit: limit}
			for _, c := range g.counted {
				if c.class == class {
					u.Counted = append(u.Counted, c.pod)
				}
			}
			u.Spent = u.Charged >= limit || len(u.Counted) > 0
			out.Budgets = append(out.Budgets, u)
		}
	}
	out.Unschedulable = g.unschedulable
	used := slices.ContainsFunc(out.Budgets, func(u BudgetUse) bool { return u.Charged > 0 || u.Spent })
	return out, len(out.Nodes) > 0 || used || len(out.Unschedulable) > 0
}

// writeNodeBlame prints the node-blame section of a Job's report.
func writeNodeBlame(w *errWriter, nb *NodeBlameReport) {
	budget := "not set (Ignore is unbounded)"
	if nb.Budget != "" {
		budget = nb.Budget
	}
	w.printf("\nNodes avoided and disruption budgets:\n")
	w.printf("  %-19s %s\n", "avoid-failed-nodes:", avoidanceText(v1alpha1.Avoidance(nb.Avoidance)))
	w.printf("  %-19s %s\n", "disruption-budget:", budget)
	for _, p := range nb.Problems {
		w.printf("  %-19s %s\n", "PROBLEM:", p)
	}
	if len(nb.Groups) == 0 {
		w.printf("  no node blamed, no disruption charged\n")
	}
	for _, g := range nb.Groups {
		if g.Index != nil {
			w.printf("  index %d:\n", *g.Index)
		} else {
			w.printf("  the Job:\n")
		}
		var avoids, blamed []string
		for _, n := range g.Nodes {
			s := fmt.Sprintf("%s (%s", n.Node, n.Class)
			if len(n.Pods) > 0 {
				s += ": " + strings.Join(n.Pods, ", ")
			}
			s += ")"
			if n.Avoided {
				avoids = append(avoids, s)
			} else {
				blamed = append(blamed, s)
			}
		}
		if len(avoids) > 0 {
			label := "avoids:"
			if nb.Avoidance == string(v1alpha1.AvoidNone) {
				label = "remembers:"
			}
			w.printf("    %-11s %s, carried by %s\n", label, strings.Join(avoids, ", "), g.Pod)
		}
		if len(blamed) > 0 {
			w.printf("    %-11s %s; not carried by the newest pod (its replacement is not made yet, or past the last %d)\n", "blamed:", strings.Join(blamed, ", "), v1alpha1.MaxAvoidedNodes)
		}
		if len(g.Budgets) > 0 {
			var parts []string
			for _, u := range g.Budgets {
				s := fmt.Sprintf("%s %d/%d", u.Class, u.Charged, u.Limit)
				if u.Spent {
					s += " spent"
				}
				if len(u.Counted) > 0 {
					s += " (counted since: " + strings.Join(u.Counted, ", ") + ")"
				}
				parts = append(parts, s)
			}
			w.printf("    %-11s %s\n", "budget:", strings.Join(parts, ", "))
		}
		for _, s := range g.Unschedulable {
			w.printf("    %-11s %s\n", "WARNING:", s)
		}
	}
}
