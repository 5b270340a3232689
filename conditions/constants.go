package conditions

import (
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
)

// Prefix is the prefix of coroner's own condition types, annotations and
// managedBy value (requirements: "API group and prefix coroner.dev").
const Prefix = "coroner.dev/"

// Pod condition types.
const (
	// DisruptionTarget is the upstream pod condition type (KEP-3329) saying the
	// pod is being, or was, terminated because of a disruption rather than a
	// fault of its own. podFailurePolicy rules match it with onPodConditions.
	// It is corev1.DisruptionTarget; its reasons are the DisruptionTarget
	// reasons below.
	DisruptionTarget = corev1.DisruptionTarget

	// OOMKilled is set to True by the agent when a container of the pod was
	// killed by the OOM killer because the pod (or the container) went over
	// its own memory limit: the kernel's oom_memcg lies inside the pod's own
	// cgroup subtree (A2). Its reason is ReasonMemoryLimitExceeded. A kill by
	// the node's OOM killer is not reported here but as DisruptionTarget with
	// reason ReasonNodeOOMKill.
	OOMKilled corev1.PodConditionType = Prefix + "OOMKilled"

	// ForcefullyTerminated is set to True by the shim, together with phase
	// Failed, when it recovers a zombie pod: a pod being deleted on a node
	// that cannot confirm the pod stopped (Z1, Z2). It is coroner's analogue
	// of Kueue's KueueFailureRecovery condition (Kueue KEP-6757). Its reason
	// says what made the recovery safe enough (ReasonNodeUnreachable,
	// ReasonNodeFenced); its message names the node and the wait, for example
	// "Pod forcefully terminated after 90s: node node-a is unreachable
	// (opted in by coroner.dev/safe-to-forcefully-delete)".
	ForcefullyTerminated corev1.PodConditionType = Prefix + "ForcefullyTerminated"

	// DeviceFailed is set to True by the agent, with DisruptionTarget=True reason
	// ReasonDeviceFailure, when a container of the pod died while a device allocated to it
	// had failed (its health Unhealthy in the pod's allocatedResourcesStatus, or a hardware
	// fault the driver logged for it): a rule can treat device failures apart from other
	// disruptions. Its reason is ReasonDeviceFailure; its message names the resource, the
	// device, the signal and when the device turned.
	DeviceFailed corev1.PodConditionType = Prefix + "DeviceFailed"
)

// Reasons of the DisruptionTarget pod condition. The first five are set by
// Kubernetes components (values as upstream; only the kubelet's and the
// scheduler's are exported by k8s.io/api). coroner writes
// ReasonTerminationByKubelet (A3), ReasonDeletionByPodGC (Z3), ReasonNodeOOMKill
// (A2) and ReasonStaleDisruptionTarget (Z4).
const (
	// ReasonPreemptionByScheduler: kube-scheduler preempted the pod.
	ReasonPreemptionByScheduler = corev1.PodReasonPreemptionByScheduler
	// ReasonDeletionByTaintManager: kube-controller-manager's taint eviction
	// deleted the pod because of a NoExecute taint it does not tolerate.
	ReasonDeletionByTaintManager = "DeletionByTaintManager"
	// ReasonEvictionByEvictionAPI: the pod was evicted through the Eviction API
	// (kubectl drain, a descheduler, ...).
	ReasonEvictionByEvictionAPI = "EvictionByEvictionAPI"
	// ReasonDeletionByPodGC: pod garbage collection deleted the pod, for
	// example because its node no longer exists. The shim uses it for orphans
	// (Z3), with a message like upstream's "PodGC: node no longer exists".
	ReasonDeletionByPodGC = "DeletionByPodGC"
	// ReasonTerminationByKubelet: the kubelet terminated the pod (node-pressure
	// eviction, kubelet preemption of a critical pod, graceful node shutdown).
	// The agent sets it on kubelets that do not (A3).
	ReasonTerminationByKubelet = corev1.PodReasonTerminationByKubelet

	// ReasonNodeOOMKill (coroner) is set by the agent when a container of the
	// pod was killed by the node's OOM killer (node memory pressure, the
	// kubepods or a QoS class cgroup over its limit, CONSTRAINT_NONE) rather
	// than because of the pod's own limit (A2). It makes an
	// "Ignore on DisruptionTarget" rule treat a node OOM kill as the
	// infrastructure failure it is.
	ReasonNodeOOMKill = "NodeOOMKill"

	// ReasonStaleDisruptionTarget (coroner) is the reason the shim writes when
	// it sets a stale DisruptionTarget to False: True for over two minutes on
	// a pod that is neither being deleted nor terminal, typically a failed
	// eviction (Z4). Upstream's disruption controller does the same with an
	// empty reason.
	ReasonStaleDisruptionTarget = "StaleDisruptionTarget"

	// ReasonDeviceFailure (coroner) is set by the agent, on DisruptionTarget and on
	// DeviceFailed, when a container died while a device allocated to it had failed:
	// an "Ignore on DisruptionTarget" rule then retries the pod without counting it.
	ReasonDeviceFailure = "DeviceFailure"
)

// Reason of the OOMKilled pod condition.
const (
	// ReasonMemoryLimitExceeded: a container was OOM-killed because its pod or
	// container memory limit was reached (kernel oom_memcg inside the pod's
	// cgroup subtree).
	ReasonMemoryLimitExceeded = "MemoryLimitExceeded"
)

// Reasons of the ForcefullyTerminated pod condition.
const (
	// ReasonNodeUnreachable: the pod was being deleted on a node tainted
	// node.kubernetes.io/unreachable, was opted in by one of the
	// safe-to-forcefully-* annotations, and deletionTimestamp plus the
	// recovery threshold has passed (Z1).
	ReasonNodeUnreachable = "NodeUnreachable"
	// ReasonNodeFenced: the node's agent has fenced the node (its Lease says
	// so, or the Lease has been expired for longer than the agent's fence
	// deadline plus a margin), so the pod's containers are known to be
	// stopped and recovery did not wait for the threshold (Z2).
	ReasonNodeFenced = "NodeFenced"
	// ReasonNodeDeleted: the pod was bound to a node that no longer exists (Z3).
	ReasonNodeDeleted = "NodeDeleted"
)

// Pod annotations.
const (
	// AnnotationSafeToForcefullyDelete, set to "true" on a pod (usually
	// through the Job's pod template), opts the pod in to zombie recovery
	// (Z1): the shim may move it to phase Failed and force-delete it when its
	// node is unreachable.
	AnnotationSafeToForcefullyDelete = Prefix + "safe-to-forcefully-delete"
	// AnnotationKueueSafeToForcefullyTerminate is Kueue's opt-in annotation for
	// the same recovery (Kueue KEP-6757); coroner honours it.
	AnnotationKueueSafeToForcefullyTerminate = "kueue.x-k8s.io/safe-to-forcefully-terminate"
	// AnnotationKueueSafeToForcefullyDelete is a second spelling of Kueue's
	// opt-in that coroner honours as well.
	AnnotationKueueSafeToForcefullyDelete = "kueue.x-k8s.io/safe-to-forcefully-delete"

	// AnnotationExitHistory is written by the agent on pods with
	// restartPolicy OnFailure or Always: the exits of their containers that
	// the kubelet restarted in place, so that onExitCodes rules can act on
	// them (A5). Its format is api/v1alpha1's (ParseExitHistory, FormatExitHistory).
	AnnotationExitHistory = Prefix + "exit-history"
)

// SafeToForcefullyDeleteAnnotations lists, in order of precedence, the
// annotations any of which, set to "true", opts a pod in to zombie recovery.
var SafeToForcefullyDeleteAnnotations = []string{
	AnnotationSafeToForcefullyDelete,
	AnnotationKueueSafeToForcefullyTerminate,
	AnnotationKueueSafeToForcefullyDelete,
}

// OptedInToForcefulDeletion reports whether the annotations (a pod's)
// opt the pod in to zombie recovery: any of
// SafeToForcefullyDeleteAnnotations has the exact value "true".
func OptedInToForcefulDeletion(annotations map[string]string) bool {
	for _, k := range SafeToForcefullyDeleteAnnotations {
		if annotations[k] == "true" {
			return true
		}
	}
	return false
}

// Well-known Job keys, labels and values the shim reads and writes, with the
// values of the built-in Job controller so that a user sees no difference.
const (
	// JobTrackingFinalizer is put on every pod the shim creates and removed
	// once the pod is counted in the Job's status (uncountedTerminatedPods).
	JobTrackingFinalizer = batchv1.JobTrackingFinalizer
	// JobIndexFailureCountAnnotation holds, on a pod of an Indexed Job with
	// backoffLimitPerIndex, the failures of its index so far that count
	// towards the limit (S5).
	JobIndexFailureCountAnnotation = batchv1.JobIndexFailureCountAnnotation
	// JobIndexIgnoredFailureCountAnnotation holds the failures of the index
	// ignored by the pod failure policy (S5); absent means zero.
	JobIndexIgnoredFailureCountAnnotation = batchv1.JobIndexIgnoredFailureCountAnnotation
	// JobCompletionIndexAnnotation is the completion index of a pod of an
	// Indexed Job. Upstream also sets a label with the same key.
	JobCompletionIndexAnnotation = batchv1.JobCompletionIndexAnnotation
	// JobCompletionIndexLabel is the label twin of JobCompletionIndexAnnotation,
	// set by the built-in controller too (KEP-4017, PodIndexLabel).
	JobCompletionIndexLabel = batchv1.JobCompletionIndexAnnotation
	// ControllerUIDLabel is the Job's UID on its pods; the shim's pod
	// selector.
	ControllerUIDLabel = batchv1.ControllerUidLabel
	// JobNameLabel is the Job's name on its pods.
	JobNameLabel = batchv1.JobNameLabel
	// LegacyControllerUIDLabel and LegacyJobNameLabel are the unprefixed
	// labels the built-in controller still sets next to the prefixed ones.
	LegacyControllerUIDLabel = "controller-uid"
	LegacyJobNameLabel       = "job-name"
	// CountedLabel ("true") is added by the shim, in the patch that removes the tracking
	// finalizer, to a pod that finished (Succeeded or Failed) and is counted in its Job's
	// status: the shim's pod informer selects "!coroner.dev/counted", so the pod leaves
	// its cache (a watch sends the shim a delete) and a Job of 100,000 completions costs
	// the shim its running pods rather than every pod it ever had. Nothing the shim
	// decides reads such a pod again (jobsync.LeavesCache says which pods may go). The
	// built-in Job controller sets no such label; the shim does not copy it from a pod
	// template.
	CountedLabel = Prefix + "counted"
	// ManagedPodLabel ("true") is on every pod the shim creates for a Job it manages, and
	// is added by the shim to the pods of managed Jobs that lack it (pods made by a shim
	// before the label, adopted orphans, a pod whose label was removed and that still
	// matches its Job's selector). The shim's pod informer selects on it, so the shim
	// watches its own Jobs' pods and not every Job's: in a cluster whose other Jobs run
	// 100,000 pods, those cost the shim nothing. The shim does not copy it from a pod
	// template; a template may not set it to anything else.
	ManagedPodLabel = Prefix + "managed"

	// ManagedBy is the shim's spec.managedBy value and the default of its
	// --managed-by flag (S1).
	ManagedBy = Prefix + "shim"
	// ShimComponent is coroner-shim's name as the source of its Events and the field
	// manager of its pod status writes.
	ShimComponent = "coroner-shim"
	// BuiltInJobControllerName is the managedBy value reserved for the
	// built-in Job controller, which is never the shim's.
	BuiltInJobControllerName = batchv1.JobControllerName
)

// Reasons of Job conditions (Failed, FailureTarget, Complete,
// SuccessCriteriaMet, Suspended), with the built-in controller's values. All
// but the Suspended ones are exported by k8s.io/api/batch/v1.
const (
	// JobReasonPodFailurePolicy: a failed pod matched a FailJob rule.
	JobReasonPodFailurePolicy = batchv1.JobReasonPodFailurePolicy
	// JobReasonBackoffLimitExceeded: more failed pods than backoffLimit.
	JobReasonBackoffLimitExceeded = batchv1.JobReasonBackoffLimitExceeded
	// JobReasonDeadlineExceeded: the Job was active longer than
	// activeDeadlineSeconds.
	JobReasonDeadlineExceeded = batchv1.JobReasonDeadlineExceeded
	// JobReasonFailedIndexes: every index finished and at least one failed
	// (backoffLimitPerIndex).
	JobReasonFailedIndexes = batchv1.JobReasonFailedIndexes
	// JobReasonMaxFailedIndexesExceeded: more failed indexes than
	// maxFailedIndexes.
	JobReasonMaxFailedIndexesExceeded = batchv1.JobReasonMaxFailedIndexesExceeded
	// JobReasonSuccessPolicy: the Job met a successPolicy rule.
	JobReasonSuccessPolicy = batchv1.JobReasonSuccessPolicy
	// JobReasonCompletionsReached: the Job has as many succeeded pods (or
	// indexes) as completions.
	JobReasonCompletionsReached = batchv1.JobReasonCompletionsReached
	// JobReasonSuspended is the reason of Suspended=True (upstream literal).
	JobReasonSuspended = "JobSuspended"
	// JobReasonResumed is the reason of Suspended=False (upstream literal).
	JobReasonResumed = "JobResumed"
)

// Fixed messages of Job conditions, as the built-in controller writes them.
// Pod failure policy and success policy messages are built by the shim's
// policy code since they name the pod, the container or condition and the
// rule index.
const (
	JobMessageBackoffLimitExceeded      = "Job has reached the specified backoff limit"
	JobMessageDeadlineExceeded          = "Job was active longer than specified deadline"
	JobMessageMaxFailedIndexesExceeded  = "Job has exceeded the specified maximal number of failed indexes"
	JobMessageFailedIndexes             = "Job has failed indexes"
	JobMessageCompletionsReached        = "Reached expected number of succeeded pods"
	JobMessageSuspended                 = "Job suspended"
	JobMessageResumed                   = "Job resumed"
	JobMessageSuccessPolicyRulesMatched = "Matched rules at index" // followed by " <index>"
)

// Messages of EventReasonAdopted and EventReasonReleased; %s is the pod's name.
const (
	AdoptedPodMessage  = "Adopted pod %s: it had no controller and matches the Job's selector"
	ReleasedPodMessage = "Released pod %s: its labels no longer match the Job's selector"
)

// Event reasons.
//
// On Jobs the shim emits the built-in controller's Events (same reason, type
// and message) and, when a Job finishes unsuccessfully, a Warning whose reason
// is the Job condition's reason (JobReasonPodFailurePolicy,
// JobReasonBackoffLimitExceeded, ...) and whose message is the condition's
// message, as upstream does. On top of that it emits one Event per pod failure
// policy decision (S8), so that every decision says why.
const (
	// Upstream-compatible Job events.
	EventReasonSuccessfulCreate     = "SuccessfulCreate" // Normal: "Created pod: <name>"
	EventReasonFailedCreate         = "FailedCreate"     // Warning: "Error creating: <err>"
	EventReasonSuccessfulDelete     = "SuccessfulDelete" // Normal: "Deleted pod: <name>"
	EventReasonFailedDelete         = "FailedDelete"     // Warning: "Error deleting: <err>"
	EventReasonSuspended            = "Suspended"        // Normal: JobMessageSuspended
	EventReasonResumed              = "Resumed"          // Normal: JobMessageResumed
	EventReasonCompleted            = "Completed"        // Normal: "Job completed"
	EventReasonTooManySucceededPods = "TooManySucceededPods"

	// EventReasonAdopted and EventReasonReleased (Normal, on the Job): the shim
	// took an orphan pod that matches the Job's selector as the Job's, or let go
	// of a pod whose labels stopped matching it (the built-in controller does both
	// silently; the shim says so). Messages: AdoptedPodMessage, ReleasedPodMessage.
	EventReasonAdopted  = "AdoptedPod"
	EventReasonReleased = "ReleasedPod"

	// EventReasonPodFailurePolicy (on the Job): what the shim made of one failed
	// pod, one Event per decision: Warning when the failure counts, fails an
	// index or the Job, Normal when an Ignore rule matched. The message names the
	// pod, the cause, the rule and the consequence, e.g. "pod default/x-2-abcde:
	// container main exited 42, matched rule 0 (FailIndex): index 2 failed".
	EventReasonPodFailurePolicy = "PodFailurePolicy"

	// EventReasonForcefullyTerminated (Warning, on the pod and its Job): the
	// shim moved a zombie pod to phase Failed and will force-delete it; the
	// message is the ForcefullyTerminated condition's (node, wait, opt-in).
	// Kueue's Event for the same is KueueForcefullyTerminated.
	EventReasonForcefullyTerminated = "ForcefullyTerminated"

	// EventReasonStamped (Normal or Warning, on the pod): the agent wrote a
	// condition the kubelet does not; the message names the condition type,
	// reason and container, e.g.
	// "DisruptionTarget=True (NodeOOMKill): container main".
	EventReasonStamped = "Stamped"
	// EventReasonFenced (Warning, on the Node): the agent lost the API server
	// for longer than --fence-after and stopped the containers of opted-in
	// pods; emitted once it is back (A6).
	EventReasonFenced = "Fenced"
)
