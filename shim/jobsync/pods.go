package jobsync

import (
	"cmp"
	"slices"
	"strconv"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/conditions"
)

// noIndex is the completion index of a pod without a valid one.
const noIndex = -1

// completionIndex reads the pod's completion index annotation; noIndex when it is
// missing or not a non-negative integer.
func completionIndex(p *corev1.Pod) int {
	v, ok := p.Annotations[batchv1.JobCompletionIndexAnnotation]
	if !ok {
		return noIndex
	}
	i, err := strconv.Atoi(v)
	if err != nil || i < 0 {
		return noIndex
	}
	return i
}

// byIndex returns a copy of pods sorted by completion index (pods without one first),
// pods of one index in their order in pods. Each pod's index is read once: a comparator
// that read the annotation took 9% of coroner-shim's CPU on a 10,000-pod Job (bench-shim
// indexed-10k's profile: a map lookup and an Atoi per comparison, n log n of them per
// sync).
func byIndex(pods []*corev1.Pod) []*corev1.Pod {
	type ranked struct{ ix, pos int }
	keys := make([]ranked, len(pods))
	for i, p := range pods {
		keys[i] = ranked{completionIndex(p), i}
	}
	slices.SortFunc(keys, func(a, b ranked) int {
		if c := cmp.Compare(a.ix, b.ix); c != 0 {
			return c
		}
		return cmp.Compare(a.pos, b.pos)
	})
	out := make([]*corev1.Pod, len(pods))
	for i, k := range keys {
		out[i] = pods[k.pos]
	}
	return out
}

func isTerminal(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// isActive: not finished and not being deleted.
func isActive(p *corev1.Pod) bool { return !isTerminal(p) && p.DeletionTimestamp == nil }

// isTerminating: being deleted but not finished yet.
func isTerminating(p *corev1.Pod) bool { return !isTerminal(p) && p.DeletionTimestamp != nil }

func isReady(p *corev1.Pod) bool {
	c := conditions.Find(&p.Status, corev1.PodReady)
	return c != nil && c.Status == corev1.ConditionTrue
}

func hasTrackingFinalizer(p *corev1.Pod) bool {
	return slices.Contains(p.Finalizers, batchv1.JobTrackingFinalizer)
}

// onlyReplaceFailedPods: replacements wait until a pod is Failed, not merely terminating
// (podReplacementPolicy Failed, which is also the only value with a pod failure policy).
func onlyReplaceFailedPods(job *batchv1.Job) bool {
	return ptr.Deref(job.Spec.PodReplacementPolicy, "") == batchv1.Failed || job.Spec.PodFailurePolicy != nil
}

// isFailed says whether the pod counts as failed for the Job: phase Failed, or, under
// TerminatingOrFailed, being deleted without having succeeded (KEP-3939).
func isFailed(p *corev1.Pod, job *batchv1.Job) bool {
	if p.Status.Phase == corev1.PodFailed {
		return true
	}
	if onlyReplaceFailedPods(job) {
		return false
	}
	return p.DeletionTimestamp != nil && p.Status.Phase != corev1.PodSucceeded
}

// removalRank orders active pods from the one we would rather delete to the one we would
// rather keep: unscheduled before scheduled, Pending before Unknown before Running, not
// ready before ready, more restarts before fewer, newer before older.
func removalRank(a, b *corev1.Pod) int {
	if c := cmp.Compare(boolRank(a.Spec.NodeName != ""), boolRank(b.Spec.NodeName != "")); c != 0 {
		return c
	}
	if c := cmp.Compare(phaseRank(a.Status.Phase), phaseRank(b.Status.Phase)); c != 0 {
		return c
	}
	if c := cmp.Compare(boolRank(isReady(a)), boolRank(isReady(b))); c != 0 {
		return c
	}
	if c := cmp.Compare(restarts(b), restarts(a)); c != 0 {
		return c
	}
	if c := b.CreationTimestamp.Compare(a.CreationTimestamp.Time); c != 0 {
		return c
	}
	return cmp.Compare(a.Name, b.Name)
}

func boolRank(b bool) int {
	if b {
		return 1
	}
	return 0
}

func phaseRank(p corev1.PodPhase) int {
	switch p {
	case corev1.PodPending:
		return 0
	case corev1.PodUnknown:
		return 1
	case corev1.PodRunning:
		return 2
	}
	return 3
}

func restarts(p *corev1.Pod) int32 {
	var n int32
	for _, c := range p.Status.ContainerStatuses {
		n += c.RestartCount
	}
	return n
}

// podsForRemoval picks at least rmAtLeast of the active pods to delete. For Indexed Jobs
// pods without a valid index, with an index beyond completions, and all but the best pod
// of an index held by several come first.
func podsForRemoval(job *batchv1.Job, active []*corev1.Pod, rmAtLeast int) []*corev1.Pod {
	var rm, left []*corev1.Pod
	if isIndexed(job) {
		completions := int(ptr.Deref(job.Spec.Completions, 0))
		byIndex := map[int][]*corev1.Pod{}
		for _, p := range active {
			ix := completionIndex(p)
			if ix == noIndex || ix >= completions {
				rm = append(rm, p)
				continue
			}
			byIndex[ix] = append(byIndex[ix], p)
		}
		for _, ix := range slices.Sorted(mapKeys(byIndex)) {
			group := byIndex[ix]
			slices.SortFunc(group, removalRank)
			rm = append(rm, group[:len(group)-1]...)
			left = append(left, group[len(group)-1])
		}
	} else {
		left = slices.Clone(active)
	}
	if len(rm) < rmAtLeast {
		slices.SortFunc(left, removalRank)
		rm = append(rm, left[:min(rmAtLeast-len(rm), len(left))]...)
	}
	return rm
}

func mapKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// maxGeneratedNameLength leaves room for the API server's 5-character random suffix.
const maxGeneratedNameLength = 63 - 5

// newPod builds a pod of the Job from its template, as the built-in controller does:
// template labels, annotations and finalizers plus the tracking finalizer, a controller
// owner reference, generateName "<job>-" (Indexed: "<job>-<index>-"), and for Indexed
// Jobs the completion index annotation and label, the hostname "<job>-<index>", the
// JOB_COMPLETION_INDEX variable, and with backoffLimitPerIndex the failure counts.
func newPod(job *batchv1.Job, index int, failureCount, ignoredCount int32) *corev1.Pod {
	tmpl := job.Spec.Template.DeepCopy()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:       job.Namespace,
			Labels:          tmpl.Labels,
			Annotations:     tmpl.Annotations,
			Finalizers:      tmpl.Finalizers,
			OwnerReferences: []metav1.OwnerReference{ControllerRef(job)},
		},
		Spec: tmpl.Spec,
	}
	if !slices.Contains(pod.Finalizers, batchv1.JobTrackingFinalizer) {
		pod.Finalizers = append(pod.Finalizers, batchv1.JobTrackingFinalizer)
	}
	if pod.Labels == nil {
		pod.Labels = map[string]string{}
	}
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	// The API server puts these in the template unless the Job has a manual selector;
	// coroner's pod informer selects on the first, so every pod carries both.
	pod.Labels[batchv1.ControllerUidLabel] = string(job.UID)
	pod.Labels[batchv1.JobNameLabel] = job.Name
	// A pod with it would never be in the shim's cache (conditions.CountedLabel); without
	// ManagedPodLabel neither (the cache selects on it).
	delete(pod.Labels, conditions.CountedLabel)
	pod.Labels[conditions.ManagedPodLabel] = "true"
	if index == noIndex {
		pod.GenerateName = truncate(job.Name+"-", maxGeneratedNameLength)
		return pod
	}
	ix := strconv.Itoa(index)
	suffix := "-" + ix + "-"
	pod.GenerateName = truncate(job.Name, maxGeneratedNameLength-len(suffix)) + suffix
	pod.Annotations[batchv1.JobCompletionIndexAnnotation] = ix
	pod.Labels[batchv1.JobCompletionIndexAnnotation] = ix
	pod.Spec.Hostname = job.Name + "-" + ix
	for i := range pod.Spec.InitContainers {
		addIndexEnv(&pod.Spec.InitContainers[i])
	}
	for i := range pod.Spec.Containers {
		addIndexEnv(&pod.Spec.Containers[i])
	}
	if job.Spec.BackoffLimitPerIndex != nil {
		pod.Annotations[batchv1.JobIndexFailureCountAnnotation] = strconv.Itoa(int(failureCount))
		if ignoredCount > 0 {
			pod.Annotations[batchv1.JobIndexIgnoredFailureCountAnnotation] = strconv.Itoa(int(ignoredCount))
		}
	}
	return pod
}

const completionIndexEnv = "JOB_COMPLETION_INDEX"

func addIndexEnv(c *corev1.Container) {
	for _, e := range c.Env {
		if e.Name == completionIndexEnv {
			return
		}
	}
	c.Env = append(c.Env, corev1.EnvVar{
		Name: completionIndexEnv,
		ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{
			FieldPath: "metadata.labels['" + batchv1.JobCompletionIndexAnnotation + "']",
		}},
	})
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

func isIndexed(job *batchv1.Job) bool {
	return ptr.Deref(job.Spec.CompletionMode, batchv1.NonIndexedCompletion) == batchv1.IndexedCompletion
}

// ControllerRef is the controller reference of the Job's pods: the ones it creates, and the
// orphans it adopts.
func ControllerRef(job *batchv1.Job) metav1.OwnerReference {
	return metav1.OwnerReference{
		APIVersion:         batchv1.SchemeGroupVersion.String(),
		Kind:               "Job",
		Name:               job.Name,
		UID:                job.UID,
		Controller:         ptr.To(true),
		BlockOwnerDeletion: ptr.To(true),
	}
}
