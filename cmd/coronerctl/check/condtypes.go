package check

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/validate/content"

	"github.com/coroner-dev/coroner/conditions"
)

// coronerConditionTypes are the pod condition types coroner sets (conditions/).
var coronerConditionTypes = []corev1.PodConditionType{conditions.OOMKilled, conditions.ForcefullyTerminated, conditions.DeviceFailed}

// knownConditionTypes are the pod condition types something is known to set: every
// PodConditionType of k8s.io/api/core/v1 v0.36, then coroner's.
var knownConditionTypes = append([]corev1.PodConditionType{
	corev1.PodScheduled,
	corev1.PodInitialized,
	corev1.ContainersReady,
	corev1.PodReady,
	corev1.PodReadyToStartContainers,
	corev1.DisruptionTarget,
	corev1.PodResizePending,
	corev1.PodResizeInProgress,
	corev1.AllContainersRestarting,
}, coronerConditionTypes...)

// conditionTypeFinding judges the type of an onPodConditions pattern. A known type gives
// nothing. A type close to a known one (a different case, a typo, coroner's name without
// or with a misspelt prefix) is a warning with the known type to use instead: the rule
// would silently never match. Any other type is a hint: it is someone else's condition,
// which this command cannot know. A type the API server rejects gives nothing here (the
// API error says it).
func conditionTypeFinding(t corev1.PodConditionType) (Severity, string, bool) {
	s := string(t)
	if len(content.IsLabelKey(s)) > 0 {
		return 0, "", false
	}
	for _, k := range knownConditionTypes {
		if s == string(k) {
			return 0, "", false
		}
	}
	if k, ok := suggestConditionType(s); ok {
		why := "no such condition type"
		if strings.EqualFold(s, string(k)) {
			why = "condition types are case-sensitive"
		}
		return Warning, fmt.Sprintf("unknown condition type %q (%s), the rule never matches: did you mean %s?", s, why, k), true
	}
	return Hint, fmt.Sprintf("condition type %q is set neither by Kubernetes nor by coroner: the rule matches only if another controller sets it on the pod", s), true
}

// suggestConditionType returns the known type s was probably meant to be, if one is close
// enough: equal ignoring case, within a small edit distance, or, for coroner's types, the
// same name with no prefix or a prefix that looks like coroner's.
func suggestConditionType(s string) (corev1.PodConditionType, bool) {
	lower := strings.ToLower(s)
	best, bestDist := corev1.PodConditionType(""), -1
	for _, k := range knownConditionTypes {
		d := editDistance(lower, strings.ToLower(string(k)))
		if bestDist < 0 || d < bestDist {
			best, bestDist = k, d
		}
	}
	if bestDist <= maxTypos(len(best)) {
		return best, true
	}
	// coroner's types without their prefix ("OOMKilled", the container's reason) or
	// under another spelling of it ("coroner.io/OOMKilled", "coroner/OOMKilled").
	prefix, name, prefixed := strings.Cut(s, "/")
	if !prefixed {
		prefix, name = "", s
	}
	if prefix != "" && !strings.Contains(strings.ToLower(prefix), "coroner") {
		return "", false
	}
	for _, k := range coronerConditionTypes {
		kname := strings.TrimPrefix(string(k), conditions.Prefix)
		if editDistance(strings.ToLower(name), strings.ToLower(kname)) <= maxTypos(len(kname)) {
			return k, true
		}
	}
	return "", false
}

// maxTypos is how many edits still make a name a misspelling of a known one of length n:
// one for short names (Ready), two otherwise.
func maxTypos(n int) int {
	if n <= 6 {
		return 1
	}
	return 2
}

// editDistance is the optimal string alignment distance of a and b (insertions,
// deletions, substitutions and transpositions of adjacent bytes).
func editDistance(a, b string) int {
	prev2 := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}
