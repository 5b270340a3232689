package check

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// neverFires finds the podFailurePolicy rules that can never fire because earlier rules
// match every pod they would. Rules are tried in order and the first that matches decides,
// whatever its action (upstream's matchPodFailurePolicy, shim/policy.Match), so a later rule
// that only matches pods an earlier one matches is dead.
//
// Only what is certain is reported, over all pods the template can make:
//   - onExitCodes rules match a pod when one container in their scope (containerName, or
//     every container and init container of the template) terminated with a non-zero
//     exit code in their set (In: the values; NotIn: every non-zero code but the values).
//     Rule N is dead when, for each container in its scope, the earlier rules whose scope
//     holds that container together cover its set.
//   - onPodConditions rules match when the pod has one of their (type, status) pairs. Rule
//     N is dead when the earlier rules together hold all its pairs.
//
// Rules the API server rejects (no or an unknown action, both or neither requirement, an
// unknown operator or container) are left out on both sides. spec is defaulted (pattern
// statuses are set).
func neverFires(spec *batchv1.JobSpec, rulesPath *field.Path) []Finding {
	pfp := spec.PodFailurePolicy
	if pfp == nil {
		return nil
	}
	all := containerNames(&spec.Template.Spec)
	var out []Finding
	for n := range pfp.Rules {
		rn := &pfp.Rules[n]
		if !analysable(rn, all) {
			continue
		}
		var by []int
		switch {
		case rn.OnExitCodes != nil:
			by = exitCodesCoveredBy(pfp.Rules[:n], rn.OnExitCodes, all)
		default:
			by = conditionsCoveredBy(pfp.Rules[:n], rn.OnPodConditions, all)
		}
		if by == nil {
			continue
		}
		out = append(out, Finding{Severity: Warning, Lint: true, Field: rulesPath.Index(n).String(), Message: deadRuleMessage(pfp.Rules, n, by)})
	}
	return out
}

func deadRuleMessage(rules []batchv1.PodFailurePolicyRule, n int, by []int) string {
	if len(by) == 1 {
		m := by[0]
		msg := fmt.Sprintf("rule %d can never fire: rule %d matches every pod it would", n, m)
		if sameRequirement(&rules[m], &rules[n]) {
			msg += fmt.Sprintf(" (it repeats rule %d", m)
			if rules[m].Action != rules[n].Action {
				msg += fmt.Sprintf(", whose action %s wins over %s", rules[m].Action, rules[n].Action)
			}
			msg += ")"
		}
		return msg
	}
	names := make([]string, len(by))
	for i, m := range by {
		names[i] = strconv.Itoa(m)
	}
	return fmt.Sprintf("rule %d can never fire: rules %s and %s together match every pod it would",
		n, strings.Join(names[:len(names)-1], ", "), names[len(names)-1])
}

// analysable reports whether a rule is one the API server accepts, as far as matching
// goes.
func analysable(r *batchv1.PodFailurePolicyRule, containers map[string]bool) bool {
	if !slices.Contains(supportedActions, string(r.Action)) {
		return false
	}
	switch {
	case r.OnExitCodes != nil && len(r.OnPodConditions) == 0:
		req := r.OnExitCodes
		if req.Operator != batchv1.PodFailurePolicyOnExitCodesOpIn && req.Operator != batchv1.PodFailurePolicyOnExitCodesOpNotIn {
			return false
		}
		if len(req.Values) == 0 || (req.ContainerName != nil && !containers[*req.ContainerName]) {
			return false
		}
		return len(scope(req, containers)) > 0
	case r.OnExitCodes == nil && len(r.OnPodConditions) > 0:
		for _, p := range r.OnPodConditions {
			if !slices.Contains(supportedConditionStatuses, string(p.Status)) {
				return false
			}
		}
		return true
	}
	return false
}

func sameRequirement(a, b *batchv1.PodFailurePolicyRule) bool {
	if a.OnExitCodes != nil || b.OnExitCodes != nil {
		if a.OnExitCodes == nil || b.OnExitCodes == nil {
			return false
		}
		x, y := a.OnExitCodes, b.OnExitCodes
		return x.Operator == y.Operator && slices.Equal(x.Values, y.Values) &&
			((x.ContainerName == nil && y.ContainerName == nil) ||
				(x.ContainerName != nil && y.ContainerName != nil && *x.ContainerName == *y.ContainerName))
	}
	return slices.Equal(a.OnPodConditions, b.OnPodConditions)
}

// scope is the containers an onExitCodes requirement looks at.
func scope(req *batchv1.PodFailurePolicyOnExitCodesRequirement, containers map[string]bool) []string {
	if req.ContainerName != nil {
		return []string{*req.ContainerName}
	}
	names := make([]string, 0, len(containers))
	for c := range containers {
		names = append(names, c)
	}
	slices.Sort(names)
	return names
}

// exitCodesCoveredBy returns the earlier rules that together match every pod req matches,
// or nil when they do not.
func exitCodesCoveredBy(earlier []batchv1.PodFailurePolicyRule, req *batchv1.PodFailurePolicyOnExitCodesRequirement, containers map[string]bool) []int {
	want := exitSetOf(req)
	used := map[int]bool{}
	for _, c := range scope(req, containers) {
		// A single earlier rule covering the whole set is named alone when there is one.
		var cover exitSet
		var contributors []int
		single := -1
		for m := range earlier {
			rm := &earlier[m]
			if rm.OnExitCodes == nil || !analysable(rm, containers) || !slices.Contains(scope(rm.OnExitCodes, containers), c) {
				continue
			}
			s := exitSetOf(rm.OnExitCodes)
			if s.intersects(want) {
				contributors = append(contributors, m)
			}
			if single < 0 && want.subsetOf(s) {
				single = m
			}
			cover = cover.union(s)
		}
		switch {
		case single >= 0:
			used[single] = true
		case want.subsetOf(cover):
			for _, m := range contributors {
				used[m] = true
			}
		default:
			return nil
		}
	}
	return sortedKeys(used)
}

// conditionsCoveredBy returns the earlier rules that together hold every (type, status)
// pair of patterns, or nil when they do not.
func conditionsCoveredBy(earlier []batchv1.PodFailurePolicyRule, patterns []batchv1.PodFailurePolicyOnPodConditionsPattern, containers map[string]bool) []int {
	type pair struct {
		t corev1.PodConditionType
		s corev1.ConditionStatus
	}
	holders := func(p batchv1.PodFailurePolicyOnPodConditionsPattern) []int {
		var ms []int
		for m := range earlier {
			rm := &earlier[m]
			if rm.OnExitCodes != nil || !analysable(rm, containers) {
				continue
			}
			for _, q := range rm.OnPodConditions {
				if (pair{q.Type, q.Status}) == (pair{p.Type, p.Status}) {
					ms = append(ms, m)
					break
				}
			}
		}
		return ms
	}
	// A single earlier rule holding every pair is named alone when there is one.
	count := map[int]int{}
	distinct := map[pair]bool{}
	used := map[int]bool{}
	for _, p := range patterns {
		ms := holders(p)
		if len(ms) == 0 {
			return nil
		}
		used[ms[0]] = true
		if !distinct[pair{p.Type, p.Status}] {
			distinct[pair{p.Type, p.Status}] = true
			for _, m := range ms {
				count[m]++
			}
		}
	}
	for m := range earlier {
		if count[m] == len(distinct) {
			return []int{m}
		}
	}
	return sortedKeys(used)
}

func sortedKeys(m map[int]bool) []int {
	keys := make([]int, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// exitSet is a set of non-zero exit codes: values, or, when co is true, every non-zero
// code but values. Exit code 0 never matches a rule, so it is in no set.
type exitSet struct {
	values map[int32]bool
	co     bool
}

func exitSetOf(req *batchv1.PodFailurePolicyOnExitCodesRequirement) exitSet {
	s := exitSet{values: map[int32]bool{}, co: req.Operator == batchv1.PodFailurePolicyOnExitCodesOpNotIn}
	for _, v := range req.Values {
		if v != 0 {
			s.values[v] = true
		}
	}
	return s
}

func (s exitSet) has(v int32) bool { return v != 0 && s.values[v] != s.co }

// subsetOf reports whether every code of s is in t.
func (s exitSet) subsetOf(t exitSet) bool {
	switch {
	case !s.co:
		for v := range s.values {
			if !t.has(v) {
				return false
			}
		}
		return true
	case t.co:
		// all but A within all but B: B within A.
		for v := range t.values {
			if !s.values[v] {
				return false
			}
		}
		return true
	}
	return false // all but a few codes is never within a finite set
}

func (s exitSet) intersects(t exitSet) bool {
	if s.co && t.co {
		return true
	}
	if s.co {
		s, t = t, s
	}
	for v := range s.values {
		if t.has(v) {
			return true
		}
	}
	return false
}

func (s exitSet) union(t exitSet) exitSet {
	out := exitSet{values: map[int32]bool{}}
	switch {
	case !s.co && !t.co:
		for v := range s.values {
			out.values[v] = true
		}
		for v := range t.values {
			out.values[v] = true
		}
	case s.co && t.co:
		// all but A, or all but B: all but the codes in both.
		out.co = true
		for v := range s.values {
			if t.values[v] {
				out.values[v] = true
			}
		}
	default:
		if !s.co {
			s, t = t, s
		}
		// all but A, or B: all but A minus B.
		out.co = true
		for v := range s.values {
			if !t.values[v] {
				out.values[v] = true
			}
		}
	}
	return out
}
