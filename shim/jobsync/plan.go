// Package jobsync decides what coroner's Job controller does for one Job in one sync: a
// pure function of the Job, its pods, the controller's in-memory backoff record and a
// clock. It makes no API call; the controller (package shim/controller) carries out the
// Plan it returns.
//
// The order the controller follows, and why:
//
//  1. Delete, then create pods (Plan.Delete, Plan.Create; at most 500 of each, creations
//     in slow-start batches). Plan.Status already assumes they all succeed; the controller
//     calls Plan.Adjust with what failed before writing.
//  2. Write Plan.Status once (only when Plan.WriteStatus), with an Update of the status
//     subresource (resourceVersion precondition: a conflict re-queues the Job).
//  3. Only after that write succeeded, remove the tracking finalizer from
//     Plan.RemoveFinalizer. Every finished pod whose failure or success counts is first
//     recorded in status.uncountedTerminatedPods by step 2, so a crash between 2 and 3
//     loses nothing. Then the pods whose finalizer removal succeeded are counted: their
//     UIDs move from uncountedTerminatedPods to the succeeded/failed counters
//     (CountRemoved) in a second status write, as the built-in controller counts them in
//     the sync that removed their finalizers. Should that write fail, a later sync counts
//     them (Sync moves the UIDs of pods whose finalizer is gone).
//  4. Emit Plan.Events and record Plan.Observations, keep Plan.Retries as the Job's new
//     backoff record, and re-queue after Plan.RequeueAfter when it is positive.
//
// Plan.Status is all a sync decides; the write of step 3 only counts what step 2 recorded,
// and the Job's end (its Complete or Failed condition) is left to the next sync. The
// observable results (counters, conditions and their order, failedIndexes,
// completedIndexes) are the built-in controller's.
//
// Files, by concern: sync.go (Sync: one pass in order), pods.go (pod predicates, removal order,
// new pods), verdict.go (waiting for the agent's OOM and device verdicts), device.go (the device verdicts' Events), finish.go (the
// Job's end), manage.go (creating, deleting, suspending), track.go (finalizer tracking),
// explain.go (Events), conditions.go (the Job's conditions), plan.go (the Plan).
package jobsync

import (
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/shim/backoff"
	"github.com/coroner-dev/coroner/shim/observe"
)

// MaxPodCreateDeletePerSync bounds the pods one sync creates, and those it deletes.
const MaxPodCreateDeletePerSync = 500

// Input is everything Sync looks at.
type Input struct {
	// Job is the Job as the informer has it. Sync never modifies it.
	Job *batchv1.Job
	// Pods are the Job's pods (controlled by the Job: controller ownerReference with the
	// Job's UID), in any phase, from the informer. Sync never modifies them.
	Pods []*corev1.Pod
	// Now is the time of this sync.
	Now time.Time
	// Backoff is the replacement delay policy (default backoff.Default).
	Backoff backoff.Policy
	// Retries is the Job's global backoff record from the previous sync (zero at first).
	Retries backoff.Record
	// ExpectationsSatisfied is false while pod creations or deletions issued by an
	// earlier sync have not been observed in Pods yet; Sync then creates and deletes
	// nothing and declares nothing finished, as the informer may be behind.
	ExpectationsSatisfied bool
	// FinalizersBeingRemoved are the UIDs of pods whose tracking finalizer removal was
	// issued but not yet observed; Sync treats them as already without the finalizer.
	FinalizersBeingRemoved sets.Set[types.UID]
	// MemoryRefused are the completion indexes (noIndex, -1, for a NonIndexed Job) whose
	// pod with grown memory the API server refused (a LimitRange, a ResourceQuota), with
	// why: their failures count as without coroner.dev/oom-memory-retry, rather than
	// being retried with a pod that cannot be made.
	MemoryRefused map[int]string
	// VerdictWait is how long a Failed pod whose container was OOM-killed waits for the
	// agent's verdict (coroner.dev/OOMKilled or DisruptionTarget) when the Job's policy
	// has a rule on pod conditions (policy.AwaitingVerdict); 0: no wait.
	VerdictWait time.Duration
	// DeviceVerdictWait is how long a Failed pod that held devices and whose container
	// died waits for the agent's device verdict (DisruptionTarget DeviceFailure, or
	// coroner.dev/DeviceFailed of either status) when the verdict can change what the
	// Job's policy does (policy.AwaitingDeviceVerdict); 0: no wait.
	DeviceVerdictWait time.Duration
	// DefaultAvoidance is the avoidance of failed nodes of a Job without
	// coroner.dev/avoid-failed-nodes (coroner-shim's --avoid-failed-nodes; "" is none).
	DefaultAvoidance v1alpha1.Avoidance
}

// Plan is what the controller must do for the Job.
type Plan struct {
	// Skip, when not empty, says why nothing is to be done (not our Job, already
	// finished, ...); every other field is then empty.
	Skip string

	// Status is the complete new status of the Job.
	Status batchv1.JobStatus
	// WriteStatus is true when Status differs from the Job's current status.
	WriteStatus bool

	// Create holds the pods to create, fully built (labels, annotations, finalizer,
	// owner reference, generateName, hostname); Reason says why, for metrics.
	Create []PodCreate
	// Delete holds active pods to delete.
	Delete []PodDelete
	// RemoveFinalizer holds the pods whose tracking finalizer must be removed, after the
	// status write.
	RemoveFinalizer []*corev1.Pod
	// BudgetVerdicts are, for pods in RemoveFinalizer, the disruption budget's verdict to
	// write on the pod (api/v1alpha1.AnnotationBudgetVerdict) in the patch that removes
	// its finalizer.
	BudgetVerdicts map[types.UID]string

	// Leaving are the record entries of the pods that leave the Job in this plan: those
	// in Delete and RemoveFinalizer, but for pods that succeeded (a success stays a pod
	// until its Job goes; not recording them keeps successful Jobs free of record
	// writes). The controller writes them to the Job's JobRecord
	// before anything else, so that a pod is never gone (or uncounted from the record's
	// point of view) before its story is stored.
	Leaving []v1alpha1.Entry

	// Retries is the Job's new global backoff record; keep it after the status write.
	Retries backoff.Record
	// RequeueAfter, when positive, asks for another sync after that long (pending
	// backoff, activeDeadlineSeconds, per-index backoff); never below backoff.MinRequeue.
	RequeueAfter time.Duration

	// Events are Events for the Job, to emit after the status write succeeded.
	Events []Event
	// Observations are the metrics of the decisions in this Plan, to record after the
	// status write succeeded.
	Observations observe.Observations
}

// PodCreate is a pod to create.
type PodCreate struct {
	Pod    *corev1.Pod
	Reason observe.CreateReason
}

// PodDelete is an active pod to delete.
type PodDelete struct {
	Pod *corev1.Pod
	// RemoveFinalizerFirst is set for pods deleted because the Job is suspended or has
	// too many pods: they must not count as failed, so their tracking finalizer is removed
	// before the delete. Pods deleted because the Job is finishing keep it until Plan's
	// RemoveFinalizer handles them.
	RemoveFinalizerFirst bool
	// Reason is a short human reason for logs ("job suspended", "excess pod",
	// "duplicate index 3", "job failed: BackoffLimitExceeded").
	Reason string
}

// Event is an Event to emit on the Job.
type Event struct {
	Type    string // corev1.EventTypeNormal or corev1.EventTypeWarning
	Reason  string
	Message string
}

// Adjust corrects Status after the controller carried out Create and Delete: failedCreates
// pods were not created (failed, or skipped after a failed slow-start batch) and
// failedDeletes were not deleted. Active, Ready and Terminating are corrected, and a
// terminal condition planned on the assumption that every deletion succeeded is
// withdrawn. WriteStatus is recomputed against the Job's old status.
func (p *Plan) Adjust(old *batchv1.JobStatus, failedCreates int, failedDeletes []*corev1.Pod) {
	adjust(p, old, failedCreates, failedDeletes)
}
