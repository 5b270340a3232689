// Package memretry decides the memory of a pod that replaces one killed at its own memory
// limit, for Jobs that opt in with the annotation coroner.dev/oom-memory-retry (issue 22):
// "retry with more memory", as Nextflow's `memory { 2.GB * task.attempt }` does, but only
// where coroner-agent's coroner.dev/OOMKilled stamp says the pod's own limit killed it (a
// node OOM, DisruptionTarget NodeOOMKill, never grows anything).
//
// It is pure: the Job controller (shim/jobsync) asks Decide about a failed pod and
// Replacement for the pod that follows it.
//
// Choices the issue leaves open:
//   - The limit grown is the killed container's memory limit (the container the kubelet
//     reports OOMKilled, else the one that exited 137); when that container has no limit
//     and the pod has a pod-level one (spec.resources), the pod-level limit. When the
//     grown container limit would exceed a pod-level limit, that grows with it.
//   - New limits are rounded up to a whole MiB. Requests are raised only where they would
//     exceed the new limit, and to the limit where they equalled it (a Guaranteed pod
//     stays Guaranteed).
//   - Only pods with restartPolicy Never are grown: with OnFailure the kubelet restarts the
//     killed container in place and no new pod is made; resizing the running pod in place
//     (pods/resize) was weighed and left, as the kubelet's crash-loop restarts would race
//     the resize and a resize the node cannot fit stays pending with no failure to count
//     (coronerctl check warns).
//   - The grown memory follows an index (Indexed Jobs) or the Job (NonIndexed: every new
//     pod takes the largest memory a failed pod of the Job was given) from the failed pods
//     that still exist: a pod deleted by PodGC takes its growth with it.
package memretry

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

const (
	// Annotation opts a Job in: "factor=F,max=Q", F from 1.1 to 10, Q a memory quantity.
	Annotation = conditions.Prefix + "oom-memory-retry"
	// GivenAnnotation, on a pod coroner-shim made with more memory than the template's,
	// says what it was given and why, for example
	// "main=48Mi: container main of x-1-abcde OOM-killed at its limit of 24Mi, factor 2".
	GivenAnnotation = conditions.Prefix + "memory-given"

	minFactor = 1.1
	maxFactor = 10.0
)

// Spec is a Job's opt-in.
type Spec struct {
	Factor float64
	Max    resource.Quantity
}

func (s Spec) String() string { return fmt.Sprintf("factor=%g,max=%s", s.Factor, s.Max.String()) }

// Parse reads the annotation's value. Both keys are required; an unknown key, a factor
// out of [1.1, 10] or a max that is not a positive quantity is an error that says which.
func Parse(v string) (Spec, error) {
	var s Spec
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
			if err != nil || math.IsNaN(f) || f < minFactor || f > maxFactor {
				errs = append(errs, fmt.Errorf("factor %q: want a number from %g to %g", val, minFactor, maxFactor))
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
		return Spec{}, fmt.Errorf("%s %q: %w", Annotation, v, err)
	}
	return s, nil
}

// ForJob reads the Job's opt-in from its annotations: nil without the annotation, an error
// when it is invalid (the Job then retries as without it).
func ForJob(annotations map[string]string) (*Spec, error) {
	v, ok := annotations[Annotation]
	if !ok {
		return nil, nil
	}
	s, err := Parse(v)
	if err != nil {
		return nil, err
	}
	return &s, nil
}

// Growth is one limit grown for a replacement pod.
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

// Decide says how the memory of the pod that replaces p (a Failed pod) grows: ok is true
// when coroner-agent stamped p coroner.dev/OOMKilled (its own limit), the limit that killed
// it is known and below s.Max. At s.Max, or for any other failure, ok is false: the failure
// is handled as without the annotation.
func Decide(s Spec, p *corev1.Pod) (g []Growth, ok bool) {
	if p.Status.Phase != corev1.PodFailed || conditions.FindTrue(p, conditions.OOMKilled) == nil {
		return nil, false
	}
	name := killedContainer(p)
	var c *corev1.Container
	for i := range p.Spec.Containers {
		if p.Spec.Containers[i].Name == name {
			c = &p.Spec.Containers[i]
		}
	}
	podLimit, hasPodLimit := podMemoryLimit(p)
	if c != nil {
		if lim, has := c.Resources.Limits[corev1.ResourceMemory]; has {
			to, grows := grow(lim, s)
			if !grows {
				return nil, false
			}
			g = append(g, Growth{Container: c.Name, From: lim, To: to})
			if hasPodLimit && to.Cmp(podLimit) > 0 {
				g = append(g, Growth{From: podLimit, To: to})
			}
			return g, true
		}
	}
	if hasPodLimit {
		if to, grows := grow(podLimit, s); grows {
			return []Growth{{From: podLimit, To: to}}, true
		}
	}
	return nil, false
}

// grow is from times the factor, rounded up to a MiB, capped at s.Max; false when that is
// no more than from.
func grow(from resource.Quantity, s Spec) (resource.Quantity, bool) {
	const mib = 1 << 20
	want := math.Ceil(float64(from.Value())*s.Factor/mib) * mib
	to := *resource.NewQuantity(int64(want), resource.BinarySI)
	if to.Cmp(s.Max) > 0 {
		to = s.Max.DeepCopy()
	}
	return to, to.Cmp(from) > 0
}

// killedContainer is the container the kubelet reports OOMKilled, else the first that
// exited 137, else "".
func killedContainer(p *corev1.Pod) string {
	var sigkilled string
	for _, cs := range p.Status.ContainerStatuses {
		t := cs.State.Terminated
		if t == nil {
			continue
		}
		if t.Reason == "OOMKilled" {
			return cs.Name
		}
		if t.ExitCode == 137 && sigkilled == "" {
			sigkilled = cs.Name
		}
	}
	return sigkilled
}

func podMemoryLimit(p *corev1.Pod) (resource.Quantity, bool) {
	if p.Spec.Resources == nil {
		return resource.Quantity{}, false
	}
	q, ok := p.Spec.Resources.Limits[corev1.ResourceMemory]
	return q, ok
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
	if q, ok := podMemoryLimit(p); ok {
		m[""] = q
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

// Apply gives pod (a new pod from the Job's template) the limits of m that are larger than
// its own, raising requests only where the new limit requires (to the limit where the
// request equalled the old one: a Guaranteed pod stays Guaranteed). It returns the limits
// it changed, "" for the pod-level one.
func Apply(pod *corev1.Pod, m Memory) Memory {
	changed := Memory{}
	raise := func(res *corev1.ResourceRequirements, q resource.Quantity) bool {
		old, has := res.Limits[corev1.ResourceMemory]
		if !has || q.Cmp(old) <= 0 {
			return false
		}
		res.Limits[corev1.ResourceMemory] = q.DeepCopy()
		if req, ok := res.Requests[corev1.ResourceMemory]; ok && (req.Cmp(old) == 0 || req.Cmp(q) > 0) {
			res.Requests[corev1.ResourceMemory] = q.DeepCopy()
		}
		return true
	}
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		if q, ok := m[c.Name]; ok && raise(&c.Resources, q) {
			changed[c.Name] = q
		}
	}
	if q, ok := m[""]; ok && pod.Spec.Resources != nil && raise(pod.Spec.Resources, q) {
		changed[""] = q
	}
	return changed
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
