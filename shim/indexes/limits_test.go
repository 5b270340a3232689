package indexes

import (
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	"k8s.io/utils/ptr"
)

func TestCheckLimits(t *testing.T) {
	indexed := func(completions, parallelism int32, backoffLimitPerIndex, maxFailedIndexes *int32) *batchv1.JobSpec {
		return &batchv1.JobSpec{
			CompletionMode:       ptr.To(batchv1.IndexedCompletion),
			Completions:          ptr.To(completions),
			Parallelism:          ptr.To(parallelism),
			BackoffLimitPerIndex: backoffLimitPerIndex,
			MaxFailedIndexes:     maxFailedIndexes,
		}
	}
	cases := map[string]struct {
		spec     *batchv1.JobSpec
		wantErrs []string // substrings of the error; none means no error
	}{
		"NonIndexed Job is not checked": {
			spec: &batchv1.JobSpec{Parallelism: ptr.To[int32](1_000_000), Completions: ptr.To[int32](1_000_000)},
		},
		"Indexed Job at every limit": {
			spec: indexed(CompletionsSoftLimit, MaxParallelism, ptr.To[int32](1), ptr.To[int32](MaxMaxFailedIndexes)),
		},
		"Indexed Job without parallelism or maxFailedIndexes": {
			spec: &batchv1.JobSpec{CompletionMode: ptr.To(batchv1.IndexedCompletion), Completions: ptr.To[int32](5)},
		},
		"parallelism above the Indexed limit": {
			spec:     indexed(10, MaxParallelism+1, nil, nil),
			wantErrs: []string{"spec.parallelism", "must be at most 100000 for an Indexed Job"},
		},
		"maxFailedIndexes above its limit": {
			spec:     indexed(MaxMaxFailedIndexes+1, 1, ptr.To[int32](1), ptr.To[int32](MaxMaxFailedIndexes+1)),
			wantErrs: []string{"spec.maxFailedIndexes", "must be at most 100000"},
		},
		"maxFailedIndexes above completions": {
			spec:     indexed(5, 1, ptr.To[int32](1), ptr.To[int32](6)),
			wantErrs: []string{"spec.maxFailedIndexes", "must be at most completions (5)"},
		},
		"high completions without backoffLimitPerIndex are not limited": {
			spec: indexed(1_000_000, MaxParallelism, nil, nil),
		},
		"high completions with backoffLimitPerIndex at the stricter limits": {
			spec: indexed(1_000_000, MaxParallelismAboveSoftLimit, ptr.To[int32](1), ptr.To[int32](MaxMaxFailedIndexesAboveSoftLimit)),
		},
		"high completions with backoffLimitPerIndex need maxFailedIndexes": {
			spec:     indexed(CompletionsSoftLimit+1, 1, ptr.To[int32](1), nil),
			wantErrs: []string{"spec.maxFailedIndexes: Required value", "completions (100001) above 100000"},
		},
		"high completions with backoffLimitPerIndex limit maxFailedIndexes": {
			spec:     indexed(CompletionsSoftLimit+1, 1, ptr.To[int32](1), ptr.To[int32](MaxMaxFailedIndexesAboveSoftLimit+1)),
			wantErrs: []string{"spec.maxFailedIndexes", "must be at most 10000 with backoffLimitPerIndex"},
		},
		"high completions with backoffLimitPerIndex limit parallelism": {
			spec:     indexed(CompletionsSoftLimit+1, MaxParallelismAboveSoftLimit+1, ptr.To[int32](1), ptr.To[int32](1)),
			wantErrs: []string{"spec.parallelism", "must be at most 10000 with backoffLimitPerIndex"},
		},
		"every violation is reported at once": {
			spec: indexed(CompletionsSoftLimit+1, MaxParallelism+1, ptr.To[int32](1), ptr.To[int32](MaxMaxFailedIndexes+1)),
			wantErrs: []string{
				"must be at most 100000 for an Indexed Job",
				"maxFailedIndexes: Invalid value: 100001: must be at most 100000",
				"must be at most 10000 with backoffLimitPerIndex",
			},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			err := CheckLimits(tc.spec)
			if len(tc.wantErrs) == 0 {
				if err != nil {
					t.Fatalf("CheckLimits() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("CheckLimits() = nil, want an error containing %q", tc.wantErrs)
			}
			for _, want := range tc.wantErrs {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("CheckLimits() = %q, want it to contain %q", err, want)
				}
			}
		})
	}
}
