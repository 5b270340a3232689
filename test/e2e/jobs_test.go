package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/test/lab"
	"github.com/coroner-dev/coroner/test/wrappers"
)

const hostnameLabel = "kubernetes.io/hostname"

// job starts a Job for the shim: managed by coroner, one second of grace for its pods.
func job(name, ns string) *wrappers.JobWrapper {
	return wrappers.MakeJob(name, ns).ManagedBy(lab.ManagedBy).TerminationGracePeriodSeconds(1)
}

// onNode pins the Job's pods to a node (tolerating the VM node's taint for it).
func onNode(j *batchv1.Job, node string) *batchv1.Job {
	j.Spec.Template.Spec.NodeSelector = map[string]string{hostnameLabel: node}
	if isVM(node) {
		tolerateVM(&j.Spec.Template.Spec)
	}
	return j
}

// withIgnoredCount gives the main container IGNORED: how many failures of the pod's index
// the Job ignored so far (the annotation exists with backoffLimitPerIndex). A script that
// misbehaves only while IGNORED is 0 fails once, and its replacement succeeds.
func withIgnoredCount(j *batchv1.Job) *batchv1.Job {
	c := &j.Spec.Template.Spec.Containers[0]
	c.Env = append(c.Env, corev1.EnvVar{Name: "IGNORED", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{
		FieldPath: "metadata.annotations['" + batchv1.JobIndexIgnoredFailureCountAnnotation + "']",
	}}})
	return j
}

// withFailureCount gives the main container FAILURES: the failures of the pod's index that
// counted against backoffLimitPerIndex so far.
func withFailureCount(j *batchv1.Job) *batchv1.Job {
	c := &j.Spec.Template.Spec.Containers[0]
	c.Env = append(c.Env, corev1.EnvVar{Name: "FAILURES", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{
		FieldPath: "metadata.annotations['" + batchv1.JobIndexFailureCountAnnotation + "']",
	}}})
	return j
}

// withResources sets the main container's requests and limits, e.g. "cpu", "100m".
func withResources(j *batchv1.Job, requests, limits corev1.ResourceList) *batchv1.Job {
	c := &j.Spec.Template.Spec.Containers[0]
	c.Resources = corev1.ResourceRequirements{Requests: requests, Limits: limits}
	return j
}

func quantities(kv ...string) corev1.ResourceList {
	l := corev1.ResourceList{}
	for i := 0; i+1 < len(kv); i += 2 {
		l[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
	}
	return l
}

func createJob(ctx context.Context, t *testing.T, j *batchv1.Job) *batchv1.Job {
	t.Helper()
	got, err := suite.cs.BatchV1().Jobs(j.Namespace).Create(ctx, j, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create Job %s: %v", j.Name, err)
	}
	return got
}

// builtinCopy is the same Job for the built-in Job controller: no managedBy, "-builtin"
// appended to its name.
func builtinCopy(j *batchv1.Job) *batchv1.Job {
	c := j.DeepCopy()
	c.Name += "-builtin"
	c.Spec.ManagedBy = nil
	return c
}

// finished returns the Job's terminal condition (Complete or Failed), if any.
func finished(j *batchv1.Job) *batchv1.JobCondition {
	for i, c := range j.Status.Conditions {
		if (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) && c.Status == corev1.ConditionTrue {
			return &j.Status.Conditions[i]
		}
	}
	return nil
}

// waitFinished waits until the Job is Complete or Failed and returns it.
func waitFinished(ctx context.Context, t *testing.T, ns, name string, timeout time.Duration) *batchv1.Job {
	t.Helper()
	var j *batchv1.Job
	err := lab.Poll(ctx, timeout, "Job "+ns+"/"+name+" to finish", func() (bool, error) {
		var err error
		j, err = suite.cs.BatchV1().Jobs(ns).Get(ctx, name, metav1.GetOptions{})
		return err == nil && finished(j) != nil, nil
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, describe(ns, name))
	}
	return j
}

// outcome is what the suite compares between coroner and the built-in controller.
type outcome struct {
	Condition, Reason               string
	Succeeded, Failed               int32
	CompletedIndexes, FailedIndexes string
	Active, Terminating, Uncounted  int
}

func outcomeOf(j *batchv1.Job) outcome {
	o := outcome{
		Succeeded: j.Status.Succeeded, Failed: j.Status.Failed,
		CompletedIndexes: j.Status.CompletedIndexes, FailedIndexes: ptr.Deref(j.Status.FailedIndexes, ""),
		Active: int(j.Status.Active), Terminating: int(ptr.Deref(j.Status.Terminating, 0)),
	}
	if u := j.Status.UncountedTerminatedPods; u != nil {
		o.Uncounted = len(u.Succeeded) + len(u.Failed)
	}
	if c := finished(j); c != nil {
		o.Condition, o.Reason = string(c.Type), c.Reason
	}
	return o
}

// runBoth creates the Job for coroner and its built-in copy, waits for both to finish and
// fails the test when their outcomes differ. It returns coroner's Job.
func runBoth(ctx context.Context, t *testing.T, j *batchv1.Job, timeout time.Duration) *batchv1.Job {
	t.Helper()
	b := builtinCopy(j)
	createJob(ctx, t, j)
	createJob(ctx, t, b)
	got := waitFinished(ctx, t, j.Namespace, j.Name, timeout)
	ref := waitFinished(ctx, t, b.Namespace, b.Name, timeout)
	if o, r := outcomeOf(got), outcomeOf(ref); o != r {
		t.Errorf("coroner and the built-in Job controller disagree on the same Job:\n  coroner:  %+v\n  built-in: %+v", o, r)
	}
	return got
}

// wantOutcome fails the test when the Job's outcome is not want.
func wantOutcome(t *testing.T, j *batchv1.Job, want outcome) {
	t.Helper()
	if got := outcomeOf(j); got != want {
		t.Errorf("Job %s: outcome\n  got  %+v\n  want %+v\n%s", j.Name, got, want, describe(j.Namespace, j.Name))
	}
}

// jobPods lists the Job's pods, oldest first.
func jobPods(ctx context.Context, t *testing.T, ns, name string) []corev1.Pod {
	t.Helper()
	l, err := suite.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + name})
	if err != nil {
		t.Fatalf("list the pods of Job %s: %v", name, err)
	}
	pods := l.Items
	slices.SortFunc(pods, func(a, b corev1.Pod) int { return a.CreationTimestamp.Compare(b.CreationTimestamp.Time) })
	return pods
}

// waitRunning waits until n pods of the Job run (every container started) and returns them.
func waitRunning(ctx context.Context, t *testing.T, ns, name string, n int, timeout time.Duration) []corev1.Pod {
	t.Helper()
	var running []corev1.Pod
	err := lab.Poll(ctx, timeout, fmt.Sprintf("%d running pods of Job %s", n, name), func() (bool, error) {
		running = running[:0]
		for _, p := range jobPods(ctx, t, ns, name) {
			if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil && allStarted(&p) {
				running = append(running, p)
			}
		}
		return len(running) >= n, nil
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, describe(ns, name))
	}
	return running
}

func allStarted(p *corev1.Pod) bool {
	for _, s := range p.Status.ContainerStatuses {
		if s.State.Running == nil {
			return false
		}
	}
	return len(p.Status.ContainerStatuses) > 0
}

// pod gets a pod.
func pod(ctx context.Context, t *testing.T, ns, name string) *corev1.Pod {
	t.Helper()
	p, err := suite.cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get pod %s/%s: %v", ns, name, err)
	}
	return p
}

// condition returns the pod's condition of type ct, or nil.
func condition(p *corev1.Pod, ct corev1.PodConditionType) *corev1.PodCondition {
	for i, c := range p.Status.Conditions {
		if c.Type == ct {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

// wantCondition fails the test unless the pod has condition ct True with reason.
func wantCondition(t *testing.T, p *corev1.Pod, ct corev1.PodConditionType, reason string) {
	t.Helper()
	c := condition(p, ct)
	if c == nil || c.Status != corev1.ConditionTrue || c.Reason != reason {
		t.Errorf("pod %s: condition %s = %+v, want True with reason %s", p.Name, ct, c, reason)
	}
}

// wantNoCondition fails the test when the pod has condition ct True.
func wantNoCondition(t *testing.T, p *corev1.Pod, ct corev1.PodConditionType) {
	t.Helper()
	if c := condition(p, ct); c != nil && c.Status == corev1.ConditionTrue {
		t.Errorf("pod %s: unexpected condition %s True (%s: %s)", p.Name, ct, c.Reason, c.Message)
	}
}

// terminated is the main container's last termination, or nil.
func terminated(p *corev1.Pod) *corev1.ContainerStateTerminated {
	for _, s := range p.Status.ContainerStatuses {
		if s.Name == wrappers.DefaultContainerName {
			return s.State.Terminated
		}
	}
	return nil
}

// waitPod waits until f holds for the pod (which may disappear: f gets nil then, and
// waitPod returns nil).
func waitPod(ctx context.Context, t *testing.T, ns, name, what string, timeout time.Duration, f func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	var p *corev1.Pod
	err := lab.Poll(ctx, timeout, "pod "+name+": "+what, func() (bool, error) {
		got, err := suite.cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			p = nil
		case err != nil:
			return false, nil
		default:
			p = got
		}
		return f(p), nil
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, describe(ns, ""))
	}
	return p
}

// watchPod is waitPod for states that may last less than a poll: it follows every
// version of the pod through a watch, so a state the pod passes through on its way
// (a condition written just before the pod is deleted) is seen. f gets nil once the pod
// is deleted.
func watchPod(ctx context.Context, t *testing.T, ns, name, what string, timeout time.Duration, f func(*corev1.Pod) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	sel := fields.OneTermEqualSelector("metadata.name", name).String()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = sel
			return suite.cs.CoreV1().Pods(ns).List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = sel
			return suite.cs.CoreV1().Pods(ns).Watch(ctx, o)
		},
	}
	_, err := watchtools.UntilWithSync(ctx, lw, &corev1.Pod{}, func(store cache.Store) (bool, error) {
		return len(store.List()) == 0 && f(nil), nil
	}, func(ev watch.Event) (bool, error) {
		p, ok := ev.Object.(*corev1.Pod)
		if !ok {
			return false, nil
		}
		if ev.Type == watch.Deleted {
			p = nil
		}
		return f(p), nil
	})
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("timed out after %v waiting for pod %s: %s", timeout, name, what)
		}
		t.Fatalf("%v\n%s", err, describe(ns, ""))
	}
}

// jobEvents returns the Job's Events as "Reason: message" lines.
func jobEvents(ctx context.Context, t *testing.T, ns, name string) []string {
	t.Helper()
	l, err := suite.cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Job,involvedObject.name=" + name})
	if err != nil {
		t.Fatalf("events of Job %s: %v", name, err)
	}
	var lines []string
	for _, e := range l.Items {
		lines = append(lines, e.Reason+": "+e.Message)
	}
	return lines
}

// wantEvent fails the test unless the Job has an Event with reason whose message holds
// every part. Controllers write Events asynchronously (client-go's recorder queues them),
// so one may land a little after the state it explains: wantEvent waits up to
// eventWait for it.
func wantEvent(ctx context.Context, t *testing.T, ns, name, reason string, parts ...string) {
	t.Helper()
	var evs []string
	found := func() bool {
		evs = jobEvents(ctx, t, ns, name)
		for _, e := range evs {
			if !strings.HasPrefix(e, reason+": ") {
				continue
			}
			ok := true
			for _, p := range parts {
				ok = ok && strings.Contains(e, p)
			}
			if ok {
				return true
			}
		}
		return false
	}
	if lab.Poll(ctx, eventWait, "an Event", func() (bool, error) { return found(), nil }) == nil {
		return
	}
	t.Errorf("Job %s: no %s Event with %q within %v; Events:\n  %s", name, reason, parts, eventWait, strings.Join(evs, "\n  "))
}

// eventWait is how long wantEvent waits for an Event.
const eventWait = 30 * time.Second

// describe is the Job's (or the namespace's) state for a failure message.
func describe(ns, job string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	args := []string{"get", "jobs,pods", "-n", ns, "-o", "wide"}
	out, _ := kubectl(ctx, args...)
	if job != "" {
		d, _ := kubectl(ctx, "describe", "job", "-n", ns, job)
		out = append(out, d...)
	}
	return string(out) + containerEnds(ctx, ns)
}

// containerEnds lists the containers in ns that did not end with exit 0 or are waiting,
// with the kubelet's reason and message: the runtime's own error for a StartError or a
// CreateContainerError, which neither kubectl get nor describe job shows.
func containerEnds(ctx context.Context, ns string) string {
	l, err := suite.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return "containers: " + err.Error() + "\n"
	}
	var b strings.Builder
	for _, p := range l.Items {
		for _, s := range p.Status.ContainerStatuses {
			switch {
			case s.State.Terminated != nil && s.State.Terminated.ExitCode != 0:
				e := s.State.Terminated
				fmt.Fprintf(&b, "  %s/%s on %s: exit %d, %s: %q\n", p.Name, s.Name, p.Spec.NodeName, e.ExitCode, e.Reason, e.Message)
			case s.State.Waiting != nil && s.State.Waiting.Message != "":
				w := s.State.Waiting
				fmt.Fprintf(&b, "  %s/%s on %s: waiting, %s: %q\n", p.Name, s.Name, p.Spec.NodeName, w.Reason, w.Message)
			}
		}
	}
	if b.Len() == 0 {
		return ""
	}
	return "containers that failed or wait:\n" + b.String()
}

func ptrQuantity(s string) *resource.Quantity {
	q := resource.MustParse(s)
	return &q
}

func podNames(pods []corev1.Pod) []string {
	names := make([]string, len(pods))
	for i, p := range pods {
		names[i] = p.Name + "@" + p.Spec.NodeName
	}
	return names
}
