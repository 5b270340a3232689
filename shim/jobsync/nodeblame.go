package jobsync

// Node blame (docs/choices.md, "When a node keeps killing pods"; the decisions are
// package shim/nodeblame's, the annotations' format api/v1alpha1's): a Job that avoids
// failed nodes (coroner.dev/avoid-failed-nodes, or coroner-shim's --avoid-failed-nodes)
// gives the replacement of a pod whose death blamed its node affinity away from that node
// (the last few such nodes of its index, of its Job); a Job with a
// coroner.dev/disruption-budget counts the failures its Ignore rules match once their
// class's budget is spent, as if no rule had matched. Without either, nothing here runs.

import (
	"fmt"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/nodeblame"
	"github.com/coroner-dev/coroner/shim/policy"
)

// Reasons of the node-blame Events on the Job.
const (
	// EventReasonAvoidingNodes (Normal): a new pod avoids the nodes that killed its
	// predecessors.
	EventReasonAvoidingNodes = "AvoidingNodes"
	// EventReasonAvoidedNodesUnschedulable (Warning): a pod that must avoid nodes cannot be
	// scheduled.
	EventReasonAvoidedNodesUnschedulable = "AvoidedNodesUnschedulable"
	// EventReasonDisruptionBudgetSpent (Warning): a failure an Ignore rule matched counts,
	// its class's budget being spent. It replaces the pod's PodFailurePolicy Event.
	EventReasonDisruptionBudgetSpent = "DisruptionBudgetSpent"
	// EventReasonInvalidNodeBlame (Warning): an annotation that does not parse; the Job runs
	// as without it.
	EventReasonInvalidNodeBlame = "InvalidNodeBlameAnnotation"
	// EventReasonDamagedNodeBlame (Warning): a pod's carried node-blame annotation did not
	// parse; what parsed is used.
	EventReasonDamagedNodeBlame = "DamagedNodeBlameAnnotation"
)

// readNodeBlame reads the Job's opt-ins; an invalid one is said when the Job starts.
func (s *state) readNodeBlame() {
	avoid, errA := v1alpha1.AvoidanceOf(s.job.Annotations, s.in.DefaultAvoidance)
	budget, errB := v1alpha1.DisruptionBudgetOf(s.job.Annotations)
	for _, err := range []error{errA, errB} {
		if err != nil && s.job.Status.StartTime == nil {
			s.plan.Events = append(s.plan.Events, Event{corev1.EventTypeWarning, EventReasonInvalidNodeBlame, err.Error() + ": the Job runs as without it"})
		}
	}
	if avoid == "" {
		avoid = v1alpha1.AvoidNone
	}
	s.avoid, s.budget = avoid, budget
	if s.avoid == v1alpha1.AvoidNone && s.budget == nil {
		return
	}
	groups := map[int][]*corev1.Pod{}
	for _, p := range s.in.Pods {
		ix := s.validIndex(p)
		if s.indexed && ix == noIndex {
			continue
		}
		groups[ix] = append(groups[ix], p)
	}
	ignored := func(p *corev1.Pod) bool {
		if _, grows := s.growths(p); grows {
			return false
		}
		return policy.Match(s.job.Spec.PodFailurePolicy, p).Action == batchv1.PodFailurePolicyActionIgnore
	}
	s.stories = map[int]nodeblame.Story{}
	var damaged []string
	for ix, pods := range groups {
		st := nodeblame.Judge(pods, s.budget, ignored)
		s.stories[ix] = st
		for _, err := range st.Damaged {
			damaged = append(damaged, err.Error())
		}
	}
	if len(damaged) > 0 {
		s.plan.Events = append(s.plan.Events, Event{corev1.EventTypeWarning, EventReasonDamagedNodeBlame, strings.Join(damaged, "; ") + ": what parsed is used"})
	}
}

// story is the node-blame story of p's index (of the Job); ok is false without opt-in.
func (s *state) story(p *corev1.Pod) (nodeblame.Story, bool) {
	if s.stories == nil {
		return nodeblame.Story{}, false
	}
	st, ok := s.stories[s.validIndex(p)]
	return st, ok
}

// budgetSpent reports whether p's failure, which an Ignore rule matched, counts because
// its class's budget is spent.
func (s *state) budgetSpent(p *corev1.Pod) (v1alpha1.BudgetVerdict, bool) {
	st, ok := s.story(p)
	if !ok {
		return v1alpha1.BudgetVerdict{}, false
	}
	return st.Spent(p)
}

// newBudgetVerdict is the verdict to write on p as its finalizer goes, if one was taken
// now.
func (s *state) newBudgetVerdict(p *corev1.Pod) (v1alpha1.BudgetVerdict, bool) {
	st, ok := s.story(p)
	if !ok || !st.New[string(p.UID)] {
		return v1alpha1.BudgetVerdict{}, false
	}
	v, ok := st.Verdicts[string(p.UID)]
	return v, ok
}

// budgetWords say a spent budget: "its device budget (1) is spent".
func (s *state) budgetWords(v v1alpha1.BudgetVerdict) string {
	return fmt.Sprintf("its %s budget (%s %s=%d) is spent", v.Class, v1alpha1.AnnotationDisruptionBudget, v.Class, s.budget[v.Class])
}

// explainSpent adds the Event of a failure that counts because its budget is spent.
func (s *state) explainSpent(p *corev1.Pod, v v1alpha1.BudgetVerdict, r policy.Result, ix int) {
	ignoredBy := policy.Match(s.job.Spec.PodFailurePolicy, p)
	msg := conditions.PodDecisionMessage(p.Namespace, p.Name, fmt.Sprintf("%s, matched rule %d (Ignore) but %s: %s",
		conditions.CauseOfDeath(p), ignoredBy.RuleIndex, s.budgetWords(v), s.ruleConsequence(p, r, ix)))
	s.plan.Events = append(s.plan.Events, Event{corev1.EventTypeWarning, EventReasonDisruptionBudgetSpent, msg})
}

// giveAvoidance gives a new pod of index ix what its index (its Job) learnt: the nodes it
// avoids (annotation and affinity) and the failures charged to the budget.
func (s *state) giveAvoidance(pod *corev1.Pod, ix int) {
	st, ok := s.stories[ix]
	if !ok {
		return
	}
	if c := st.Charged.String(); c != "" && s.budget != nil {
		pod.Annotations[v1alpha1.AnnotationDisruptionsCharged] = c
	}
	if s.avoid == v1alpha1.AvoidNone || len(st.Avoided) == 0 {
		return
	}
	pod.Annotations[v1alpha1.AnnotationAvoidedNodes] = st.Avoided.String()
	nodeblame.Avoid(pod, st.Avoided.Nodes(), s.avoid)
	who := "the new pod"
	if ix != noIndex {
		who = fmt.Sprintf("the new pod of index %d", ix)
	}
	s.plan.Events = append(s.plan.Events, Event{corev1.EventTypeNormal, EventReasonAvoidingNodes,
		fmt.Sprintf("%s avoids (%s) the nodes that killed its predecessors: %s (%s: %s)", who, s.avoid, avoidedWords(st.Avoided), v1alpha1.AnnotationAvoidFailedNodes, s.avoid)})
	if s.plan.Observations.NodeAvoidances == nil {
		s.plan.Observations.NodeAvoidances = map[string]int{}
	}
	s.plan.Observations.NodeAvoidances[string(s.avoid)]++
}

// avoidedWords: "lab-node-1 (node-oom), lab-node-2 (device)".
func avoidedWords(a v1alpha1.AvoidedNodes) string {
	parts := make([]string, len(a))
	for i, x := range a {
		parts[i] = fmt.Sprintf("%s (%s)", x.Node, x.Class)
	}
	return strings.Join(parts, ", ")
}

// sayUnschedulable adds a Warning for each active pod that must avoid nodes and that the
// scheduler cannot place: the avoidance may be why, and it must be said.
func (s *state) sayUnschedulable() {
	if s.avoid != v1alpha1.AvoidRequired {
		return
	}
	for _, p := range s.active {
		v, ok := p.Annotations[v1alpha1.AnnotationAvoidedNodes]
		if !ok || p.Spec.NodeName != "" {
			continue
		}
		c := conditions.Find(&p.Status, corev1.PodScheduled)
		if c == nil || c.Status != corev1.ConditionFalse || c.Reason != corev1.PodReasonUnschedulable {
			continue
		}
		a, _ := v1alpha1.ParseAvoidedNodes(v)
		s.plan.Events = append(s.plan.Events, Event{corev1.EventTypeWarning, EventReasonAvoidedNodesUnschedulable,
			fmt.Sprintf("pod %s cannot be scheduled; it avoids %s (%s: required); the scheduler: %s", p.Name, avoidedWords(a), v1alpha1.AnnotationAvoidFailedNodes, c.Message)})
	}
}

// observeBudget counts a budget's verdict taken in this plan.
func (s *state) observeBudget(v v1alpha1.BudgetVerdict) {
	if s.plan.Observations.BudgetVerdicts == nil {
		s.plan.Observations.BudgetVerdicts = map[string]int{}
	}
	word := "charged"
	if !v.Charged {
		word = "spent"
	}
	s.plan.Observations.BudgetVerdicts[word+"/"+string(v.Class)]++
}
