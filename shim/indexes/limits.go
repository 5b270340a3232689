package indexes

import (
	"fmt"

	batchv1 "k8s.io/api/batch/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Size limits of Indexed Jobs. They bound the length of completedIndexes and
// failedIndexes in the worst case, where every other index is missing (KEP-3850,
// "The Job object too big"). The values are those the v1.36 API server
// enforces when a Job is created or updated (pkg/apis/batch/validation).
const (
	// MaxParallelism is the largest spec.parallelism of any Indexed Job.
	MaxParallelism = 100_000

	// MaxMaxFailedIndexes is the largest spec.maxFailedIndexes of any Indexed
	// Job; spec.maxFailedIndexes must also not exceed spec.completions.
	MaxMaxFailedIndexes = 100_000

	// CompletionsSoftLimit is the spec.completions above which a Job with
	// spec.backoffLimitPerIndex must set spec.maxFailedIndexes and respect the
	// two stricter limits below. Completions themselves are not capped.
	CompletionsSoftLimit = 100_000

	// MaxParallelismAboveSoftLimit is the largest spec.parallelism of a Job
	// with spec.backoffLimitPerIndex and completions above CompletionsSoftLimit.
	MaxParallelismAboveSoftLimit = 10_000

	// MaxMaxFailedIndexesAboveSoftLimit is the largest spec.maxFailedIndexes
	// of a Job with spec.backoffLimitPerIndex and completions above
	// CompletionsSoftLimit.
	MaxMaxFailedIndexesAboveSoftLimit = 10_000
)

// CheckLimits reports every way an Indexed Job's spec breaks the size limits
// above, as one error that names the fields, or nil. It returns nil for
// NonIndexed Jobs. The API server rejects such specs already; the shim checks
// again so that it never manages a Job whose status could outgrow the object.
func CheckLimits(spec *batchv1.JobSpec) error {
	if spec.CompletionMode == nil || *spec.CompletionMode != batchv1.IndexedCompletion {
		return nil
	}
	path := field.NewPath("spec")
	var errs field.ErrorList
	if spec.Parallelism != nil && *spec.Parallelism > MaxParallelism {
		errs = append(errs, field.Invalid(path.Child("parallelism"), *spec.Parallelism,
			fmt.Sprintf("must be at most %d for an Indexed Job", MaxParallelism)))
	}
	if spec.MaxFailedIndexes != nil {
		if *spec.MaxFailedIndexes > MaxMaxFailedIndexes {
			errs = append(errs, field.Invalid(path.Child("maxFailedIndexes"), *spec.MaxFailedIndexes,
				fmt.Sprintf("must be at most %d", MaxMaxFailedIndexes)))
		}
		if spec.Completions != nil && *spec.MaxFailedIndexes > *spec.Completions {
			errs = append(errs, field.Invalid(path.Child("maxFailedIndexes"), *spec.MaxFailedIndexes,
				fmt.Sprintf("must be at most completions (%d)", *spec.Completions)))
		}
	}
	if spec.BackoffLimitPerIndex != nil && spec.Completions != nil && *spec.Completions > CompletionsSoftLimit {
		why := fmt.Sprintf("with backoffLimitPerIndex and completions (%d) above %d", *spec.Completions, CompletionsSoftLimit)
		if spec.MaxFailedIndexes == nil {
			errs = append(errs, field.Required(path.Child("maxFailedIndexes"), "must be set "+why))
		} else if *spec.MaxFailedIndexes > MaxMaxFailedIndexesAboveSoftLimit {
			errs = append(errs, field.Invalid(path.Child("maxFailedIndexes"), *spec.MaxFailedIndexes,
				fmt.Sprintf("must be at most %d %s", MaxMaxFailedIndexesAboveSoftLimit, why)))
		}
		if spec.Parallelism != nil && *spec.Parallelism > MaxParallelismAboveSoftLimit {
			errs = append(errs, field.Invalid(path.Child("parallelism"), *spec.Parallelism,
				fmt.Sprintf("must be at most %d %s", MaxParallelismAboveSoftLimit, why)))
		}
	}
	return errs.ToAggregate()
}
