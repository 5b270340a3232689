// Package observe is what one sync of a Job observed, for the shim's metrics: the
// decisions of one plan (Observations) and the reasons pods were created (CreateReason),
// with the built-in Job controller's label values (docs/operating.md lists the metrics).
// The Job controller's decisions (shim/jobsync) fill them and shim/metrics counts them;
// neither imports the other.
package observe

// CreateReason labels pod creations in metrics, with the built-in controller's values.
type CreateReason string

const (
	CreateNew                         CreateReason = "new"
	CreateRecreateTerminatingOrFailed CreateReason = "recreate_terminating_or_failed"
	CreateRecreateFailed              CreateReason = "recreate_failed"
)

// Observations are the metrics of one plan.
type Observations struct {
	// PodFailures counts newly handled pod failures by pod failure policy action:
	// "FailJob", "FailIndex", "Ignore", "Count", or "None" when no rule matched or the
	// Job has no policy.
	PodFailures map[string]int
	// FinishedIndexes counts indexes newly finished, by "succeeded"/"failed".
	FinishedIndexes map[string]int
	// PodsFinished counts pods newly counted in status.succeeded/failed, by
	// "succeeded"/"failed".
	PodsFinished map[string]int
	// MemoryGrowths counts the failures whose replacement gets more memory
	// (coroner.dev/oom-memory-retry).
	MemoryGrowths int
	// DeviceFailures counts the failed pods decided with coroner-agent's DeviceFailure
	// verdict (a device killed them), by the failing device's resource and the action.
	DeviceFailures map[DeviceFailure]int
	// DeviceVerdicts are, for each failed pod decided in this plan whose failure
	// coroner-agent's device verdict could change, the verdict it was decided with and how
	// long after its container's death.
	DeviceVerdicts []DeviceVerdict
	// JobFinished is set when this plan adds the Complete or Failed condition.
	JobFinished *JobFinished
	// NodeAvoidances counts the new pods given affinity away from failed nodes, by the
	// Job's avoidance ("preferred", "required").
	NodeAvoidances map[string]int
	// BudgetVerdicts counts the disruption budgets' verdicts taken, by "charged/<class>"
	// or "spent/<class>".
	BudgetVerdicts map[string]int
}

// DeviceFailure labels a device failure: Resource is the failing device's resource
// ("nvidia.com/gpu"; "claim" for every DRA claim, whose names are the pods'; "unknown"
// when the verdict does not say), Action what the pod failure policy did ("Ignore",
// "Count", "FailJob", "FailIndex", or "None" when no rule matched).
type DeviceFailure struct {
	Resource, Action string
}

// Values of DeviceVerdict.Verdict.
const (
	VerdictDeviceFailure   = "DeviceFailure"   // DisruptionTarget DeviceFailure: a device killed the pod
	VerdictNoDeviceFailure = "NoDeviceFailure" // coroner.dev/DeviceFailed=False: no device did
	VerdictMissing         = "Missing"         // none came before the wait was over
)

// DeviceVerdict is one decision on coroner-agent's device verdict: the verdict it was
// taken with (VerdictDeviceFailure, VerdictNoDeviceFailure, VerdictMissing) and the
// seconds from the container's death to the decision.
type DeviceVerdict struct {
	Verdict string
	Seconds float64
}

// JobFinished describes a Job that finished in this plan.
type JobFinished struct {
	Succeeded bool
	Reason    string
}
