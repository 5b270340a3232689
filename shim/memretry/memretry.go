// Package memretry decides the memory of a pod that replaces one killed at its own memory
// limit, for Jobs that opt in with the annotation coroner.dev/oom-memory-retry
// (docs/choices.md; the annotations' formats are package api/v1alpha1's):
// "retry with more memory", as Nextflow's `memory { 2.GB * task.attempt }` does, but only
// where coroner-agent's coroner.dev/OOMKilled stamp says the pod's own limit killed it (a
// node OOM, DisruptionTarget NodeOOMKill, never grows anything).
//
// It is pure: the Job controller (shim/jobsync) asks Decide about a failed pod and
// Apply to the pod that follows it.
//
// Choices made:
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
	"math"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/conditions"
)

// Decide says how the memory of the pod that replaces p (a Failed pod) grows: ok is true
// when coroner-agent stamped p coroner.dev/OOMKilled (its own limit), the limit that killed
// it is known and below s.Max. At s.Max, or for any other failure, ok is false: the failure
// is handled as without the annotation.
func Decide(s v1alpha1.MemoryRetry, p *corev1.Pod) (g []v1alpha1.Growth, ok bool) {
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
			g = append(g, v1alpha1.Growth{Container: c.Name, From: lim, To: to})
			if hasPodLimit && to.Cmp(podLimit) > 0 {
				g = append(g, v1alpha1.Growth{From: podLimit, To: to})
			}
			return g, true
		}
	}
	if hasPodLimit {
		if to, grows := grow(podLimit, s); grows {
			return []v1alpha1.Growth{{From: podLimit, To: to}}, true
		}
	}
	return nil, false
}

// grow is from times the factor, rounded up to a MiB, capped at s.Max; false when that is
// no more than from.
func grow(from resource.Quantity, s v1alpha1.MemoryRetry) (resource.Quantity, bool) {
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

// Apply gives pod (a new pod from the Job's template) the limits of m that are larger than
// its own, raising requests only where the new limit requires (to the limit where the
// request equalled the old one: a Guaranteed pod stays Guaranteed). It returns the limits
// it changed, "" for the pod-level one.
func Apply(pod *corev1.Pod, m v1alpha1.Memory) v1alpha1.Memory {
	changed := v1alpha1.Memory{}
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
