package jobsync

// Retry with more memory (docs/choices.md; the growth is shim/memretry's, the annotations'
// format api/v1alpha1's): a pod of a Job annotated coroner.dev/oom-memory-retry that
// coroner-agent stamped coroner.dev/OOMKilled (its own limit) is not counted and not
// judged by the pod failure policy while its limit can grow; its replacement gets the
// grown limit.

import (
	"fmt"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/memretry"
	"github.com/coroner-dev/coroner/shim/policy"
)

// EventReasonMemoryGrown is the reason of the Normal Event of each growth;
// EventReasonInvalidMemoryRetry that of the Warning about an annotation that does not
// parse (the Job then retries as without it).
const (
	EventReasonMemoryGrown        = "MemoryGrown"
	EventReasonInvalidMemoryRetry = "InvalidOOMMemoryRetry"
	// EventReasonMemoryRefused is the reason of the Warning Event the controller emits
	// when the API server refused a pod given more memory (Input.MemoryRefused).
	EventReasonMemoryRefused = "MemoryGrowthRefused"
)

// growthRule marks, in a policy.Result, a failure that grows the memory instead of going
// to the pod failure policy.
const growthRule = -1

// readMemoryRetry reads the Job's opt-in; an invalid one is said when the Job starts.
func (s *state) readMemoryRetry() {
	spec, err := v1alpha1.MemoryRetryOf(s.job.Annotations)
	if err != nil {
		if s.job.Status.StartTime == nil {
			s.plan.Events = append(s.plan.Events, Event{corev1.EventTypeWarning, EventReasonInvalidMemoryRetry, err.Error() + ": retried as without it"})
		}
		return
	}
	s.memory = spec
}

// growths are the limits that grow for the replacement of p; ok is false when p's failure
// is handled as without the annotation.
func (s *state) growths(p *corev1.Pod) ([]v1alpha1.Growth, bool) {
	if s.memory == nil {
		return nil, false
	}
	ix := noIndex
	if s.indexed {
		ix = completionIndex(p)
	}
	if _, refused := s.in.MemoryRefused[ix]; refused {
		return nil, false
	}
	return memretry.Decide(*s.memory, p)
}

// match is what the shim makes of a failed pod: a memory growth (not counted, like an
// Ignore rule, RuleIndex growthRule) or the pod failure policy's result, but for an Ignore
// whose disruption budget is spent, which counts as if no rule had matched.
func (s *state) match(p *corev1.Pod) policy.Result {
	if _, ok := s.growths(p); ok {
		return policy.Result{RuleIndex: growthRule, Action: batchv1.PodFailurePolicyActionIgnore}
	}
	r := policy.Match(s.job.Spec.PodFailurePolicy, p)
	if _, spent := s.budgetSpent(p); spent && r.Action == batchv1.PodFailurePolicyActionIgnore {
		// Counted as if no rule had matched (nodeblame.go).
		return policy.Result{}
	}
	return r
}

// growthText says what a growth does, for the Event and the record: "container main
// OOM-killed at its limit of 24Mi; its replacement gets 48Mi".
func growthText(g []v1alpha1.Growth) string {
	if len(g) == 0 {
		return ""
	}
	what := "container " + g[0].Container
	if g[0].Container == "" {
		what = "the pod"
	}
	s := fmt.Sprintf("%s OOM-killed at its limit of %s; retried with %s", what, g[0].From.String(), g[0].To.String())
	if len(g) > 1 {
		s += fmt.Sprintf(" (pod-level limit %s -> %s)", g[1].From.String(), g[1].To.String())
	}
	return s
}

// explainGrowth adds the Event of a growth.
func (s *state) explainGrowth(p *corev1.Pod, g []v1alpha1.Growth, ix int) {
	who := "pod " + p.Name
	if ix != noIndex {
		who = fmt.Sprintf("index %d (pod %s)", ix, p.Name)
	}
	why := v1alpha1.AnnotationOOMMemoryRetry + " " + s.memory.String()
	// coroner-agent's stamp says what it measured (the limit and the peak usage), quoted
	// as it stands.
	if c := conditions.FindTrue(p, conditions.OOMKilled); c != nil && c.Message != "" {
		why += "; coroner-agent: " + c.Message
	}
	s.plan.Events = append(s.plan.Events, Event{corev1.EventTypeNormal, EventReasonMemoryGrown, who + ": " + growthText(g) + " (" + why + ")"})
	s.plan.Observations.MemoryGrowths++
}

// memoryChoice is the memory the next pod of an index gets, and why.
type memoryChoice struct {
	mem v1alpha1.Memory
	why string
}

// planMemory fills s.memPlan: per index (noIndex for a NonIndexed Job), the largest
// memory a failed pod of the index (of the Job) had, grown where its own limit killed it.
// Memory only grows, so that is the newest pod's; pods' creation times, to the second,
// cannot tell which of two quick retries is the newer. Nothing without the opt-in.
func (s *state) planMemory() {
	if s.memory == nil {
		return
	}
	s.memPlan = map[int]memoryChoice{}
	for _, p := range s.in.Pods {
		if p.Status.Phase != corev1.PodFailed {
			continue
		}
		ix := s.validIndex(p)
		if s.indexed && ix == noIndex {
			continue
		}
		g, _ := s.growths(p)
		c := memoryChoice{mem: v1alpha1.MemoryOf(p).With(g), why: "as " + p.Name + " had"}
		if len(g) > 0 {
			c.why = p.Name + ": " + growthText(g)
		}
		if cur, ok := s.memPlan[ix]; ok {
			if merged := cur.mem.Max(c.mem); merged.String() != c.mem.String() {
				c = memoryChoice{mem: merged, why: cur.why}
			}
		}
		s.memPlan[ix] = c
	}
}

// giveMemory gives a new pod of index ix the planned memory, and says so on it.
func (s *state) giveMemory(pod *corev1.Pod, ix int) {
	plan, ok := s.memPlan[ix]
	if !ok {
		return
	}
	if changed := memretry.Apply(pod, plan.mem); len(changed) > 0 {
		pod.Annotations[v1alpha1.AnnotationMemoryGiven] = v1alpha1.MemoryGiven(changed, plan.why)
	}
}
