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
	// JobFinished is set when this plan adds the Complete or Failed condition.
	JobFinished *JobFinished
}

// JobFinished describes a Job that finished in this plan.
type JobFinished struct {
	Succeeded bool
	Reason    string
}
