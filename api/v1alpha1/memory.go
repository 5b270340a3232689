package v1alpha1

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/coroner-dev/coroner/conditions"
)

// Retry with more memory (docs/choices.md): a Job opts in with AnnotationOOMMemoryRetry;
// coroner-shim then gives the pod that replaces one its own memory limit killed more
// memory (the decision is package shim/memretry's) and says so on the new pod in
// AnnotationMemoryGiven; `coronerctl check` validates the opt-in and `coronerctl explain`
// tells both.

const (
	// AnnotationOOMMemoryRetry opts a Job in: "factor=F,max=Q", F from
	// MinMemoryRetryFactor to MaxMemoryRetryFactor, Q a memory quantity.
	AnnotationOOMMemoryRetry = conditions.Prefix + "oom-memory-retry"
	// AnnotationMemoryGiven, on a pod coroner-shim made with more memory than the
	// template's, says what it was given and why (MemoryGiven), for example
	// "main=48Mi: container main of x-1-abcde OOM-killed at its limit of 24Mi, factor 2".
	AnnotationMemoryGiven = conditions.Prefix + "memory-given"

	// MinMemoryRetryFactor and MaxMemoryRetryFactor bound the opt-in's factor.
	MinMemoryRetryFactor = 1.1
	MaxMemoryRetryFactor = 10.0
)

// MemoryRetry is a Job's opt-in, the value of AnnotationOOMMemoryRetry.
type MemoryRetry struct {
	Factor float64
	Max    resource.Quantity
}

func (s MemoryRetry) String() string {
	return fmt.Sprintf("factor=%g,max=%s", s.Factor, s.Max.String())
}

// ParseMemoryRetry reads the annotation's value. Both keys are required; an unknown key, a
// factor out of [1.1, 10] or a max that is not a positive quantity is an error that says
// which.
func ParseMemoryRetry(v string) (MemoryRetry, error) {
	var s MemoryRetry
	var haveF, haveM bool
	var errs []error
	for part := range strings.SplitSeq(v, ",") {
		key, val, ok := strings.Cut(strings.TrimSpace(part), "=")
		key, val = strings.TrimSpace(key), strings.TrimSpace(val)
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("%q is not key=value", part))
		case key == "factor":
			f, err := strconv.ParseFloat(val, 64)
			if err != nil || math.IsNaN(f) || f < MinMemoryRetryFactor || f > MaxMemoryRetryFactor {
				errs = append(errs, fmt.Errorf("factor %q: want a number from %g to %g", val, MinMemoryRetryFactor, MaxMemoryRetryFactor))
				continue
			}
			s.Factor, haveF = f, true
		case key == "max":
			q, err := resource.ParseQuantity(val)
			if err != nil || q.Sign() <= 0 {
				errs = append(errs, fmt.Errorf("max %q: want a positive memory quantity such as 4Gi", val))
				continue
			}
			s.Max, haveM = q, true
		default:
			errs = append(errs, fmt.Errorf("unknown key %q (want factor and max)", key))
		}
	}
	if len(errs) == 0 && (!haveF || !haveM) {
		errs = append(errs, errors.New("both factor and max are required, as in factor=2,max=4Gi"))
	}
	if err := errors.Join(errs...); err != nil {
		return MemoryRetry{}, fmt.Errorf("%s %q: %w", AnnotationOOMMemoryRetry, v, err)
	}
	return s, nil
}

// MemoryRetryOf reads a Job's opt-in from its annotations: nil without the annotation, an
// error when it is invalid (the Job then retries as without it).
func MemoryRetryOf(annotations map[string]string) (*MemoryRetry, error) {
	v, ok := annotations[AnnotationOOMMemoryRetry]
	if !ok {
		return nil, nil
	}
	s, err := ParseMemoryRetry(v)
	if err != nil {
		return nil, err
	}
	return &s, nil
}

// Growth is one limit grown for a replacement pod. Its String is what a JobRecord's
// Entry.Grown says.
type Growth struct {
	// Container is the container whose limit grows; empty for the pod-level limit.
	Container string
	From, To  resource.Quantity
}

func (g Growth) String() string {
	what := "container " + g.Container
	if g.Container == "" {
		what = "the pod-level limit"
	}
	return fmt.Sprintf("%s %s -> %s", what, g.From.String(), g.To.String())
}

// Memory is the memory limits of a pod: per container name, and the pod-level one ("").
type Memory map[string]resource.Quantity

// MemoryOf reads p's memory limits.
func MemoryOf(p *corev1.Pod) Memory {
	m := Memory{}
	for _, c := range p.Spec.Containers {
		if q, ok := c.Resources.Limits[corev1.ResourceMemory]; ok {
			m[c.Name] = q
		}
	}
	if p.Spec.Resources != nil {
		if q, ok := p.Spec.Resources.Limits[corev1.ResourceMemory]; ok {
			m[""] = q
		}
	}
	return m
}

// With is m with the growths applied.
func (m Memory) With(g []Growth) Memory {
	out := Memory{}
	for k, v := range m {
		out[k] = v
	}
	for _, x := range g {
		out[x.Container] = x.To
	}
	return out
}

// Max is, per limit, the larger of m and o.
func (m Memory) Max(o Memory) Memory {
	out := m.With(nil)
	for k, v := range o {
		if cur, ok := out[k]; !ok || v.Cmp(cur) > 0 {
			out[k] = v
		}
	}
	return out
}

// String is m as "main=48Mi,pod=64Mi": the containers by name, then the pod-level limit.
func (m Memory) String() string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if v := m[k]; k != "" {
			parts = append(parts, k+"="+v.String())
		}
	}
	if v, ok := m[""]; ok {
		parts = append(parts, "pod="+v.String())
	}
	return strings.Join(parts, ",")
}

// MemoryGiven is the value of AnnotationMemoryGiven on a pod given the limits changed,
// for the reason why: "main=48Mi: " followed by why.
func MemoryGiven(changed Memory, why string) string {
	return changed.String() + ": " + why
}
