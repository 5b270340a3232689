package backoff

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
)

func TestIndexFailureCounts(t *testing.T) {
	type parser func(*corev1.Pod) (int32, error)
	parsers := map[string]struct {
		parse parser
		key   string
	}{
		"failure count":         {parse: IndexFailureCount, key: batchv1.JobIndexFailureCountAnnotation},
		"ignored failure count": {parse: IndexIgnoredFailureCount, key: batchv1.JobIndexIgnoredFailureCountAnnotation},
	}
	cases := map[string]struct {
		value   *string // nil: no annotation
		want    int32
		wantErr bool
	}{
		"missing annotation is zero":          {value: nil, want: 0},
		"zero":                                {value: strPtr("0"), want: 0},
		"small value":                         {value: strPtr("3"), want: 3},
		"largest int32":                       {value: strPtr("2147483647"), want: 2147483647},
		"plus sign, as strconv.Atoi reads it": {value: strPtr("+3"), want: 3},
		"leading zero":                        {value: strPtr("03"), want: 3},
		"empty value":                         {value: strPtr(""), wantErr: true},
		"not a number":                        {value: strPtr("three"), wantErr: true},
		"negative":                            {value: strPtr("-1"), wantErr: true},
		"above int32":                         {value: strPtr("2147483648"), wantErr: true},
		"way above int64":                     {value: strPtr("99999999999999999999"), wantErr: true},
		"surrounding space":                   {value: strPtr(" 3"), wantErr: true},
		"fraction":                            {value: strPtr("1.5"), wantErr: true},
	}
	for pname, p := range parsers {
		for name, tc := range cases {
			t.Run(pname+"/"+name, func(t *testing.T) {
				w := pod().name("job-3-abcde")
				if tc.value != nil {
					w.annotation(p.key, *tc.value)
				}
				// The other annotation must not be read.
				other := batchv1.JobIndexIgnoredFailureCountAnnotation
				if p.key == other {
					other = batchv1.JobIndexFailureCountAnnotation
				}
				w.annotation(other, "77")
				got, err := p.parse(w.obj())
				if tc.wantErr {
					if err == nil {
						t.Fatalf("got %d, want an error", got)
					}
					for _, want := range []string{"ns/job-3-abcde", p.key, `"` + *tc.value + `"`} {
						if !strings.Contains(err.Error(), want) {
							t.Errorf("error %q does not mention %s", err, want)
						}
					}
					if got != 0 {
						t.Errorf("got %d with the error, want 0", got)
					}
					return
				}
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				if got != tc.want {
					t.Errorf("got %d, want %d", got, tc.want)
				}
			})
		}
	}
}

func strPtr(s string) *string { return &s }

func TestIndexConsecutiveFailures(t *testing.T) {
	cases := map[string]struct {
		pod  *corev1.Pod
		want int
	}{
		"no failed pod":                     {pod: nil, want: 0},
		"first pod of the index failed":     {pod: pod().obj(), want: 1},
		"failure count annotation plus one": {pod: pod().failureCount("2").obj(), want: 3},
		"ignored failures count too":        {pod: pod().failureCount("1").ignoredFailureCount("1").obj(), want: 3},
		"only ignored failures":             {pod: pod().failureCount("0").ignoredFailureCount("4").obj(), want: 5},
		"malformed annotations count as 0":  {pod: pod().failureCount("x").ignoredFailureCount("-2").obj(), want: 1},
		"both at int32 max do not overflow": {pod: pod().failureCount("2147483647").ignoredFailureCount("2147483647").obj(), want: int(min(2*math.MaxInt32+1, int64(math.MaxInt)))},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := IndexConsecutiveFailures(tc.pod); got != tc.want {
				t.Errorf("IndexConsecutiveFailures() = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestIndexRemaining(t *testing.T) {
	cases := map[string]struct {
		now  time.Time
		pod  *corev1.Pod
		want time.Duration
	}{
		"no failed pod": {
			now: t0, pod: nil, want: 0,
		},
		"first failure just now": {
			now: t0, pod: finishedAt(t0), want: 10 * time.Second,
		},
		"third consecutive failure just now": {
			now: t0, pod: pod().failureCount("2").containers(terminatedAt(t0)).obj(), want: 40 * time.Second,
		},
		"one counted and one ignored previous failure, as upstream": {
			now: t0, pod: pod().failureCount("1").ignoredFailureCount("1").deleted(t0, nil).obj(), want: 40 * time.Second,
		},
		"second failure, 15s ago": {
			now: t0, pod: pod().failureCount("1").containers(terminatedAt(at(-15 * time.Second))).obj(), want: 5 * time.Second,
		},
		"delay over": {
			now: t0, pod: pod().failureCount("1").containers(terminatedAt(at(-21 * time.Second))).obj(), want: 0,
		},
		"many failures are capped": {
			now: t0, pod: pod().failureCount("40").containers(terminatedAt(t0)).obj(), want: 10 * time.Minute,
		},
		"measured from the finish time, not the creation time": {
			now: t0, pod: pod().created(at(-time.Hour)).containers(terminatedAt(at(-2 * time.Second))).obj(), want: 8 * time.Second,
		},
		"pod with no finish information falls back to creation": {
			now: t0, pod: pod().created(at(-3 * time.Second)).containers(running).obj(), want: 7 * time.Second,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := IndexRemaining(tc.now, Default, tc.pod); got != tc.want {
				t.Errorf("IndexRemaining() = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestReadyIndexes(t *testing.T) {
	failedAgo := func(failureCount string, ago time.Duration) *corev1.Pod {
		return pod().failureCount(failureCount).containers(terminatedAt(at(-ago))).obj()
	}
	cases := map[string]struct {
		pending    []int
		lastFailed map[int]*corev1.Pod
		wantReady  []int
		wantWait   time.Duration
	}{
		"nothing pending": {
			pending: nil, lastFailed: map[int]*corev1.Pod{1: failedAgo("0", 0)},
			wantReady: nil, wantWait: 0,
		},
		"no failures: all ready": {
			pending:   []int{0, 1, 2},
			wantReady: []int{0, 1, 2}, wantWait: 0,
		},
		"all waiting: shortest wait": {
			pending: []int{4, 7},
			lastFailed: map[int]*corev1.Pod{
				4: failedAgo("1", 5*time.Second), // 20s delay, 15s left
				7: failedAgo("0", 2*time.Second), // 10s delay, 8s left
			},
			wantReady: nil, wantWait: 8 * time.Second,
		},
		"mix: ready in the given order, wait for the others": {
			pending: []int{5, 2, 9, 3},
			lastFailed: map[int]*corev1.Pod{
				2: failedAgo("0", time.Minute),    // over
				9: failedAgo("2", 10*time.Second), // 40s delay, 30s left
				3: failedAgo("0", time.Second),    // 10s delay, 9s left
			},
			wantReady: []int{5, 2}, wantWait: 9 * time.Second,
		},
		"delay ending exactly now is ready": {
			pending:    []int{1},
			lastFailed: map[int]*corev1.Pod{1: failedAgo("0", 10*time.Second)},
			wantReady:  []int{1}, wantWait: 0,
		},
		"failed pods of indexes that are not pending are ignored": {
			pending:    []int{1},
			lastFailed: map[int]*corev1.Pod{0: failedAgo("0", 0), 2: failedAgo("0", 0)},
			wantReady:  []int{1}, wantWait: 0,
		},
		"nil pod in the map means no failure": {
			pending:    []int{1},
			lastFailed: map[int]*corev1.Pod{1: nil},
			wantReady:  []int{1}, wantWait: 0,
		},
		"sub-second wait is exact; the floor is RequeueDelay's job": {
			pending:    []int{1},
			lastFailed: map[int]*corev1.Pod{1: failedAgo("0", 9*time.Second+700*time.Millisecond)},
			wantReady:  nil, wantWait: 300 * time.Millisecond,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ready, wait := ReadyIndexes(t0, Default, tc.pending, tc.lastFailed)
			if diff := cmp.Diff(tc.wantReady, ready); diff != "" {
				t.Errorf("ready (-want,+got):\n%s", diff)
			}
			if wait != tc.wantWait {
				t.Errorf("wait = %v, want %v", wait, tc.wantWait)
			}
		})
	}
}
