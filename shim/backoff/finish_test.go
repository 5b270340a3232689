package backoff

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

func TestFinishTime(t *testing.T) {
	created := at(-time.Hour)
	cases := map[string]struct {
		pod  *corev1.Pod
		want time.Time
	}{
		"single terminated container": {
			pod:  pod().created(created).containers(terminatedAt(at(-5 * time.Second))).obj(),
			want: at(-5 * time.Second),
		},
		"latest finishedAt of all terminated containers": {
			pod: pod().created(created).containers(
				terminatedAt(at(-3*time.Second)), terminatedAt(at(-1*time.Second)), terminatedAt(at(-2*time.Second)),
			).obj(),
			want: at(-time.Second),
		},
		"containers beat Ready=False and deletion": {
			pod: pod().created(created).containers(terminatedAt(at(-5*time.Second))).
				ready(corev1.ConditionFalse, at(-4*time.Second)).deleted(at(-3*time.Second), nil).obj(),
			want: at(-5 * time.Second),
		},
		"one container running: Ready=False": {
			pod: pod().created(created).containers(terminatedAt(at(-5*time.Second)), running).
				ready(corev1.ConditionFalse, at(-4*time.Second)).obj(),
			want: at(-4 * time.Second),
		},
		"one container running, no Ready condition: deletion": {
			pod: pod().created(created).containers(terminatedAt(at(-1*time.Second)), running, terminatedAt(at(-2*time.Second))).
				deleted(at(0), nil).obj(),
			want: at(0),
		},
		"one container waiting: creation": {
			pod:  pod().created(created).containers(terminatedAt(at(-5*time.Second)), waiting).obj(),
			want: created,
		},
		"terminated container without finishedAt: Ready=False": {
			pod: pod().created(created).containers(terminatedAt(time.Time{})).
				ready(corev1.ConditionFalse, at(-4*time.Second)).obj(),
			want: at(-4 * time.Second),
		},
		"no container statuses: Ready=False": {
			pod:  pod().created(created).ready(corev1.ConditionFalse, at(-4*time.Second)).obj(),
			want: at(-4 * time.Second),
		},
		"Ready=False beats deletion": {
			pod: pod().created(created).containers(running).
				ready(corev1.ConditionFalse, at(-4*time.Second)).deleted(at(-3*time.Second), ptr.To[int64](0)).obj(),
			want: at(-4 * time.Second),
		},
		"Ready=True is skipped: deletion": {
			pod: pod().created(created).containers(running).
				ready(corev1.ConditionTrue, at(-4*time.Second)).deleted(at(-3*time.Second), nil).obj(),
			want: at(-3 * time.Second),
		},
		"Ready=Unknown is skipped: creation": {
			pod:  pod().created(created).containers(running).ready(corev1.ConditionUnknown, at(-4*time.Second)).obj(),
			want: created,
		},
		"Ready=False without transition time is skipped: deletion": {
			pod: pod().created(created).containers(running).
				ready(corev1.ConditionFalse, time.Time{}).deleted(at(-3*time.Second), nil).obj(),
			want: at(-3 * time.Second),
		},
		"only the first Ready condition counts": {
			pod: pod().created(created).containers(running).
				ready(corev1.ConditionTrue, at(-5*time.Second)).ready(corev1.ConditionFalse, at(-4*time.Second)).obj(),
			want: created,
		},
		"deletion minus grace period": {
			pod:  pod().created(created).containers(running).deleted(at(0), ptr.To[int64](30)).obj(),
			want: at(-30 * time.Second),
		},
		"deletion without grace period": {
			pod:  pod().created(created).containers(running).deleted(at(0), nil).obj(),
			want: at(0),
		},
		"deletion with zero grace period": {
			pod:  pod().created(created).deleted(at(-7*time.Second), ptr.To[int64](0)).obj(),
			want: at(-7 * time.Second),
		},
		"nothing else: creation": {
			pod:  pod().created(created).containers(running).obj(),
			want: created,
		},
		"empty pod: creation": {
			pod:  pod().created(created).obj(),
			want: created,
		},
		"sidecar that finished after the app container": {
			pod: pod().created(created).containers(terminatedAt(at(-5*time.Second))).
				initContainer("sidecar", true, terminatedAt(at(-2*time.Second))).obj(),
			want: at(-2 * time.Second),
		},
		"sidecar still running: Ready=False": {
			pod: pod().created(created).containers(terminatedAt(at(-5*time.Second))).
				initContainer("sidecar", true, running).ready(corev1.ConditionFalse, at(-4*time.Second)).obj(),
			want: at(-4 * time.Second),
		},
		"ordinary init container is ignored": {
			pod: pod().created(created).initContainer("setup", false, terminatedAt(at(time.Minute))).
				containers(terminatedAt(at(-5 * time.Second))).obj(),
			want: at(-5 * time.Second),
		},
		"ordinary init container never terminated is ignored": {
			pod: pod().created(created).initContainer("setup", false, running).
				containers(terminatedAt(at(-5 * time.Second))).obj(),
			want: at(-5 * time.Second),
		},
		"only a terminated sidecar status, as upstream": {
			pod:  pod().created(created).initContainer("sidecar", true, terminatedAt(at(-2*time.Second))).obj(),
			want: at(-2 * time.Second),
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := FinishTime(tc.pod); !got.Equal(tc.want) {
				t.Errorf("FinishTime() = %v, want %v", got, tc.want)
			}
		})
	}
}
