package lab

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/test/images"
)

// ManagedBy is the shim's spec.managedBy value.
const ManagedBy = "coroner.dev/shim"

// demoScript is the demo Job's container: index 1 exits 42 (a bug in its shard, which the
// FailIndex rule fails at once), index 2 exits 1 on its first attempt (no rule matches:
// retried once under backoffLimitPerIndex 1), the others succeed.
const demoScript = `i=$JOB_COMPLETION_INDEX; f=${FAILURES:-0}
echo "index $i, attempt $((f + 1))"
sleep 2
if [ "$i" = 1 ]; then echo "index 1: corrupt shard, exit 42"; exit 42; fi
if [ "$i" = 2 ] && [ "$f" = 0 ]; then echo "index 2: flaky failure, exit 1"; exit 1; fi
echo "index $i: done"`

// DemoJobObject is the demo Job: Indexed, 3 completions, backoffLimitPerIndex 1, FailIndex
// on exit 42 and Ignore on DisruptionTarget, managed by coroner's shim.
func DemoJobObject() *batchv1.Job {
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: DemoJob, Namespace: DemoNamespace},
		Spec: batchv1.JobSpec{
			ManagedBy:            ptr.To(ManagedBy),
			CompletionMode:       ptr.To(batchv1.IndexedCompletion),
			Completions:          ptr.To[int32](3),
			Parallelism:          ptr.To[int32](3),
			BackoffLimitPerIndex: ptr.To[int32](1),
			PodFailurePolicy: &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{
				{
					Action:      batchv1.PodFailurePolicyActionFailIndex,
					OnExitCodes: &batchv1.PodFailurePolicyOnExitCodesRequirement{ContainerName: ptr.To("main"), Operator: batchv1.PodFailurePolicyOnExitCodesOpIn, Values: []int32{42}},
				},
				{
					Action:          batchv1.PodFailurePolicyActionIgnore,
					OnPodConditions: []batchv1.PodFailurePolicyOnPodConditionsPattern{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue}},
				},
			}},
			Template: corev1.PodTemplateSpec{
				Spec: corev1.PodSpec{
					RestartPolicy:                 corev1.RestartPolicyNever,
					TerminationGracePeriodSeconds: ptr.To[int64](1),
					Containers: []corev1.Container{{
						Name:            "main",
						Image:           images.BusyboxName,
						ImagePullPolicy: corev1.PullNever,
						Command:         []string{"sh", "-c", demoScript},
						Env: []corev1.EnvVar{{
							Name: "FAILURES",
							ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{
								FieldPath: "metadata.annotations['batch.kubernetes.io/job-index-failure-count']",
							}},
						}},
					}},
				},
			},
		},
	}
}

// shimRunning says whether a coroner-shim pod is ready, and if not why not.
func shimRunning(sts []workloadStatus) (bool, string) {
	for _, s := range sts {
		if !slices.ContainsFunc(s.Images, func(img string) bool { return strings.Contains(img, "coroner-shim") }) {
			continue
		}
		if s.Ready > 0 {
			return true, ""
		}
		why := fmt.Sprintf("%s has %d/%d pods ready", s.workload, s.Ready, s.Desired)
		if len(s.Pods) > 0 {
			why += ": " + s.Pods[0]
		}
		return false, why
	}
	return false, "no workload running the coroner-shim image is deployed"
}

// runDemo creates the demo Job (replacing an earlier one), waits until it finishes and
// prints its status, its pods, `kubectl describe job` events and what it shows.
func (c Config) runDemo(ctx context.Context, say func(string, ...any), timeout time.Duration) error {
	cs, err := c.Clientset()
	if err != nil {
		return err
	}
	jobs := cs.BatchV1().Jobs(DemoNamespace)
	if _, err := jobs.Get(ctx, DemoJob, metav1.GetOptions{}); err == nil {
		say("deleting the previous %s", DemoJob)
		if err := jobs.Delete(ctx, DemoJob, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationForeground)}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		if err := Poll(ctx, 60*time.Second, "the previous demo Job to go", func() (bool, error) {
			_, err := jobs.Get(ctx, DemoJob, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		}); err != nil {
			return err
		}
	}
	job, err := jobs.Create(ctx, DemoJobObject(), metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating the demo Job: %w", err)
	}
	say("created Job %s/%s: managedBy %s, Indexed, completions 3, backoffLimitPerIndex 1,", DemoNamespace, DemoJob, ManagedBy)
	say("  podFailurePolicy: rule 0 FailIndex on exit 42 (container main), rule 1 Ignore on DisruptionTarget;")
	say("  index 1 exits 42, index 2 exits 1 on its first attempt, index 0 succeeds")

	var finished *batchv1.JobCondition
	err = Poll(ctx, timeout, "the demo Job to finish", func() (bool, error) {
		j, err := jobs.Get(ctx, DemoJob, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		job = j
		for i := range j.Status.Conditions {
			cond := &j.Status.Conditions[i]
			if (cond.Type == batchv1.JobComplete || cond.Type == batchv1.JobFailed) && cond.Status == corev1.ConditionTrue {
				finished = cond
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil && ctx.Err() != nil {
		return err
	}

	s := job.Status
	say("")
	say("Job status:")
	say("  succeeded=%d failed=%d active=%d completedIndexes=%q failedIndexes=%q", s.Succeeded, s.Failed, s.Active, s.CompletedIndexes, ptr.Deref(s.FailedIndexes, ""))
	for _, cond := range s.Conditions {
		say("  condition %s=%s reason=%s: %s", cond.Type, cond.Status, cond.Reason, cond.Message)
	}
	pods, _ := cs.CoreV1().Pods(DemoNamespace).List(ctx, metav1.ListOptions{LabelSelector: "batch.kubernetes.io/job-name=" + DemoJob})
	if pods != nil {
		sort.Slice(pods.Items, func(i, j int) bool {
			return pods.Items[i].CreationTimestamp.Before(&pods.Items[j].CreationTimestamp)
		})
		say("Pods:")
		for _, p := range pods.Items {
			say("  %s index=%s failures-before=%s node=%s phase=%s%s", p.Name,
				p.Annotations[batchv1.JobCompletionIndexAnnotation], orZero(p.Annotations["batch.kubernetes.io/job-index-failure-count"]),
				p.Spec.NodeName, p.Status.Phase, exitCodes(&p))
		}
	}
	if out, err := c.Kubectl(ctx, nil, "describe", "job", "-n", DemoNamespace, DemoJob); err == nil {
		say("kubectl describe job %s (events):", DemoJob)
		if i := strings.Index(string(out), "Events:"); i >= 0 {
			for _, l := range strings.Split(strings.TrimRight(string(out[i:]), "\n"), "\n") {
				say("  %s", l)
			}
		}
	} else {
		say("kubectl describe job: %v", err)
	}

	say("")
	if finished == nil {
		say("WARNING: the demo Job did not finish within %v: the shim did not run it to the end (its logs: kubectl -n <ns> logs deploy/coroner-shim).", timeout)
		return nil
	}
	want := finished.Type == batchv1.JobFailed && finished.Reason == batchv1.JobReasonFailedIndexes &&
		ptr.Deref(s.FailedIndexes, "") == "1" && s.CompletedIndexes == "0,2"
	if want {
		say("What happened: index 1 exited 42, which rule 0 (FailIndex) fails at once: no retry spent on a doomed shard.")
		say("Index 2 exited 1, which no rule matches: it counted against backoffLimitPerIndex 1 and its retry succeeded.")
		say("Index 0 succeeded. With every index finished and index 1 failed, the Job is Failed (reason FailedIndexes):")
		say("completedIndexes 0,2, failedIndexes 1. Each decision is an Event on the Job, from coroner-shim.")
	} else {
		say("WARNING: the demo Job ended %s (reason %s, completedIndexes %q, failedIndexes %q); expected Failed, reason FailedIndexes, completed 0,2, failed 1.",
			finished.Type, finished.Reason, s.CompletedIndexes, ptr.Deref(s.FailedIndexes, ""))
	}
	return nil
}

func orZero(s string) string {
	if s == "" {
		return "0"
	}
	return s
}

func exitCodes(p *corev1.Pod) string {
	var b strings.Builder
	for _, cs := range p.Status.ContainerStatuses {
		if t := cs.State.Terminated; t != nil {
			fmt.Fprintf(&b, " exit=%d", t.ExitCode)
		}
	}
	return b.String()
}
