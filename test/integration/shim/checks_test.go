package shim_test

import (
	"context"
	"fmt"
	"strconv"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/conditions"
)

// finalChecks runs at the end of every test that made a fixture: it reports the
// invariants broken at any time during the test and checks, for every tracked Job that
// finished, what the built-in controller guarantees of a finished Job.
func (f *fixture) finalChecks() {
	t := f.t
	f.settle()
	f.mirror.mu.Lock()
	violations := append([]string(nil), f.mirror.violations...)
	var jobs []*batchv1.Job
	for _, jr := range f.mirror.jobs {
		jobs = append(jobs, jr.job)
	}
	f.mirror.mu.Unlock()
	for _, v := range violations {
		t.Errorf("invariant broken during the test (%s): %s", f.target(), v)
	}
	for _, job := range jobs {
		f.checkPodShapes(job)
		if finished(job) {
			f.checkFinished(job)
		}
	}
}

// settle waits until the watch has caught up with the API server: the pods it holds and
// the tracked Jobs are those a fresh read returns, at the same resourceVersions.
func (f *fixture) settle() {
	ctx := context.Background()
	var diff string
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		diff = ""
		list, err := f.client.CoreV1().Pods(f.ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			diff = err.Error()
			time.Sleep(pollInterval)
			continue
		}
		want := map[types.UID]string{}
		for _, p := range list.Items {
			want[p.UID] = p.ResourceVersion
		}
		f.mirror.mu.Lock()
		got := map[types.UID]string{}
		for uid, r := range f.mirror.pods {
			if !r.gone {
				got[uid] = r.last.ResourceVersion
			}
		}
		var jobUIDs []types.UID
		for uid := range f.mirror.jobs {
			jobUIDs = append(jobUIDs, uid)
		}
		f.mirror.mu.Unlock()
		if fmt.Sprint(want) != fmt.Sprint(got) {
			diff = fmt.Sprintf("pods: watched %v, listed %v", got, want)
		}
		for _, uid := range jobUIDs {
			jw := f.mirror.job(uid)
			j, err := f.client.BatchV1().Jobs(f.ns).Get(ctx, jw.Name, metav1.GetOptions{})
			if err == nil && j.ResourceVersion != jw.ResourceVersion {
				diff += fmt.Sprintf(" Job %s: watched %s, read %s", j.Name, jw.ResourceVersion, j.ResourceVersion)
			}
		}
		if diff == "" {
			return
		}
		time.Sleep(pollInterval)
	}
	f.t.Errorf("the watch of %s did not catch up with the API server within 10s: %s", f.ns, diff)
}

// checkFinished checks a Job with Complete or Failed: the interim condition
// (SuccessCriteriaMet or FailureTarget) came first, in an earlier status write, with the
// same reason; no pod of the Job was terminating when the terminal condition was written;
// the status has nothing active, terminating or uncounted left; no pod keeps the tracking
// finalizer.
func (f *fixture) checkFinished(job *batchv1.Job) {
	t := f.t
	terminal, interim := batchv1.JobFailed, batchv1.JobFailureTarget
	if hasCondition(job.Status.Conditions, batchv1.JobComplete) {
		terminal, interim = batchv1.JobComplete, batchv1.JobSuccessCriteriaMet
	}
	conds := job.Status.Conditions
	ti, ii := -1, -1
	for i, c := range conds {
		if c.Status != corev1.ConditionTrue {
			continue
		}
		switch c.Type {
		case terminal:
			ti = i
		case interim:
			ii = i
		}
	}
	if ii < 0 || ii > ti {
		t.Errorf("Job %s: %s must come after %s in the conditions, got %v", job.Name, terminal, interim, condList(conds))
	} else {
		if conds[ii].Reason != conds[ti].Reason || conds[ii].Message != conds[ti].Message {
			t.Errorf("Job %s: %s (%s: %q) and %s (%s: %q) differ", job.Name, interim, conds[ii].Reason, conds[ii].Message, terminal, conds[ti].Reason, conds[ti].Message)
		}
		if conds[ti].LastTransitionTime.Before(&conds[ii].LastTransitionTime) {
			t.Errorf("Job %s: %s at %v is before %s at %v", job.Name, terminal, conds[ti].LastTransitionTime, interim, conds[ii].LastTransitionTime)
		}
	}

	// The interim condition was written before, on its own.
	var terminalRV uint64
	sawInterimAlone := false
	for _, s := range f.mirror.statuses(job.UID) {
		if hasCondition(s.status.Conditions, terminal) {
			terminalRV = s.rv
			break
		}
		if hasCondition(s.status.Conditions, interim) {
			sawInterimAlone = true
		}
	}
	if !sawInterimAlone {
		t.Errorf("Job %s: no status with %s before the one with %s; statuses seen:\n%s", job.Name, interim, terminal, f.statusLog(job))
	}

	// No pod was terminating when the terminal condition was written.
	for _, r := range f.mirror.records(job) {
		if r.terminatingRV != 0 && r.terminatingRV < terminalRV && (r.terminatingEndRV == 0 || r.terminatingEndRV > terminalRV) {
			t.Errorf("Job %s got %s (resourceVersion %d) while its pod %s was terminating (from resourceVersion %d to %s)\n%s",
				job.Name, terminal, terminalRV, r.first.Name, r.terminatingRV, rvStr(r.terminatingEndRV), f.describe(job))
		}
	}

	// Every pod was counted, its tracking finalizer removed, before the terminal condition
	// was written: the built-in controller writes it only after the removals returned.
	for _, r := range f.mirror.records(job) {
		if r.createdRV < terminalRV && (r.finalizerGoneRV == 0 || r.finalizerGoneRV > terminalRV) {
			t.Errorf("Job %s got %s (resourceVersion %d) while its pod %s still had the tracking finalizer (removed at %s)\n%s",
				job.Name, terminal, terminalRV, r.first.Name, rvStr(r.finalizerGoneRV), f.describe(job))
		}
	}

	s := job.Status
	if s.Active != 0 || ptr.Deref(s.Ready, 0) != 0 || ptr.Deref(s.Terminating, 0) != 0 {
		t.Errorf("finished Job %s has active=%d ready=%s terminating=%s, want 0", job.Name, s.Active, ptrStr(s.Ready), ptrStr(s.Terminating))
	}
	if u := s.UncountedTerminatedPods; u != nil && len(u.Succeeded)+len(u.Failed) > 0 {
		t.Errorf("finished Job %s has uncountedTerminatedPods %+v", job.Name, u)
	}
	if s.StartTime == nil {
		t.Errorf("finished Job %s has no startTime", job.Name)
	}
	if (terminal == batchv1.JobComplete) != (s.CompletionTime != nil) {
		t.Errorf("Job %s finished with %s has completionTime %s", job.Name, terminal, timeStr(s.CompletionTime))
	}
	if s.CompletionTime != nil && s.StartTime != nil && s.CompletionTime.Before(s.StartTime) {
		t.Errorf("Job %s: completionTime %v before startTime %v", job.Name, s.CompletionTime, s.StartTime)
	}

	pods, err := f.client.CoreV1().Pods(f.ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Errorf("listing pods: %v", err)
		return
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if ownedBy(p, job) && hasTrackingFinalizer(p) {
			t.Errorf("finished Job %s: pod %s still has the tracking finalizer", job.Name, p.Name)
		}
	}
}

func rvStr(rv uint64) string {
	if rv == 0 {
		return "the end of the test"
	}
	return strconv.FormatUint(rv, 10)
}

// statusLog renders the statuses the Job went through.
func (f *fixture) statusLog(job *batchv1.Job) string {
	out := ""
	for _, s := range f.mirror.statuses(job.UID) {
		out += fmt.Sprintf("  rv=%d %v %v\n", s.rv, countersOf(s.status), condList(s.status.Conditions))
	}
	return out
}

// checkPodShapes checks every pod the Job ever had, as it was created: owned by the Job
// as its controller, with the tracking finalizer and the Job's labels; for an Indexed Job
// the completion index as annotation, label, hostname, name prefix and environment
// variable; with backoffLimitPerIndex the index failure count annotation.
func (f *fixture) checkPodShapes(job *batchv1.Job) {
	t := f.t
	for _, r := range f.mirror.records(job) {
		p := r.first
		ref := metav1.GetControllerOf(p)
		if ref == nil || ref.Kind != "Job" || ref.Name != job.Name || !ptr.Deref(ref.BlockOwnerDeletion, false) {
			t.Errorf("pod %s: controller reference %+v, want the Job %s with blockOwnerDeletion", p.Name, ref, job.Name)
		}
		if !hasTrackingFinalizer(p) {
			t.Errorf("pod %s was created without the %s finalizer: %v", p.Name, conditions.JobTrackingFinalizer, p.Finalizers)
		}
		for k, v := range map[string]string{
			conditions.ControllerUIDLabel:       string(job.UID),
			conditions.JobNameLabel:             job.Name,
			conditions.LegacyControllerUIDLabel: string(job.UID),
			conditions.LegacyJobNameLabel:       job.Name,
		} {
			if p.Labels[k] != v {
				t.Errorf("pod %s: label %s = %q, want %q", p.Name, k, p.Labels[k], v)
			}
		}
		if !isIndexed(job) {
			if _, ok := p.Annotations[batchv1.JobCompletionIndexAnnotation]; ok {
				t.Errorf("pod %s of NonIndexed Job %s has a completion index", p.Name, job.Name)
			}
			if p.GenerateName != job.Name+"-" {
				t.Errorf("pod %s: generateName %q, want %q", p.Name, p.GenerateName, job.Name+"-")
			}
			continue
		}
		ix := podIndex(p)
		if ix < 0 || ix >= int(ptr.Deref(job.Spec.Completions, 0)) {
			t.Errorf("pod %s of Indexed Job %s has completion index annotation %q", p.Name, job.Name, p.Annotations[batchv1.JobCompletionIndexAnnotation])
			continue
		}
		s := strconv.Itoa(ix)
		if p.Labels[batchv1.JobCompletionIndexAnnotation] != s {
			t.Errorf("pod %s: label %s = %q, want %q", p.Name, batchv1.JobCompletionIndexAnnotation, p.Labels[batchv1.JobCompletionIndexAnnotation], s)
		}
		if want := fmt.Sprintf("%s-%d", job.Name, ix); p.Spec.Hostname != want {
			t.Errorf("pod %s: hostname %q, want %q", p.Name, p.Spec.Hostname, want)
		}
		if want := fmt.Sprintf("%s-%d-", job.Name, ix); p.GenerateName != want {
			t.Errorf("pod %s: generateName %q, want %q", p.Name, p.GenerateName, want)
		}
		for _, c := range p.Spec.Containers {
			if !hasIndexEnv(c) {
				t.Errorf("pod %s container %s: no JOB_COMPLETION_INDEX from the completion index label: %+v", p.Name, c.Name, c.Env)
			}
		}
		if job.Spec.BackoffLimitPerIndex != nil {
			if _, err := strconv.Atoi(p.Annotations[batchv1.JobIndexFailureCountAnnotation]); err != nil {
				t.Errorf("pod %s of a Job with backoffLimitPerIndex: annotation %s = %q, want a count",
					p.Name, batchv1.JobIndexFailureCountAnnotation, p.Annotations[batchv1.JobIndexFailureCountAnnotation])
			}
		}
	}
}

func hasIndexEnv(c corev1.Container) bool {
	want := fmt.Sprintf("metadata.labels['%s']", batchv1.JobCompletionIndexAnnotation)
	for _, e := range c.Env {
		if e.Name == "JOB_COMPLETION_INDEX" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == want {
			return true
		}
	}
	return false
}

// wantPodsPerIndex checks how many pods each index of job ever had.
func (f *fixture) wantPodsPerIndex(job *batchv1.Job, want map[int]int) {
	f.t.Helper()
	got := map[int]int{}
	for _, r := range f.mirror.records(job) {
		got[podIndex(r.first)]++
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		f.t.Errorf("Job %s: pods ever created per index = %v, want %v\n%s", job.Name, got, want, f.describe(job))
	}
}

// wantAnnotation checks an annotation of a pod as it was created.
func (f *fixture) wantAnnotation(p *corev1.Pod, key, want string) {
	f.t.Helper()
	r := f.mirror.record(p.UID)
	got, ok := r.first.Annotations[key]
	if want == "" && !ok {
		return
	}
	if got != want {
		f.t.Errorf("pod %s (index %s): annotation %s = %q, want %q", p.Name, indexStr(p), key, got, want)
	}
}
