package backoff

import (
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
)

func finishedAtAll(ds ...time.Duration) []*corev1.Pod {
	var out []*corev1.Pod
	for _, d := range ds {
		out = append(out, finishedAt(at(d)))
	}
	return out
}

func TestRecordFold(t *testing.T) {
	cases := map[string]struct {
		prev      Record
		succeeded []*corev1.Pod
		failed    []*corev1.Pod
		want      Record
	}{
		"nothing new on an empty record": {
			want: Record{},
		},
		"nothing new keeps the previous record": {
			prev: Record{Failures: 2, LastFailure: at(-time.Minute)},
			want: Record{Failures: 2, LastFailure: at(-time.Minute)},
		},
		"first failure": {
			failed: finishedAtAll(-5 * time.Second),
			want:   Record{Failures: 1, LastFailure: at(-5 * time.Second)},
		},
		"unordered failures: count all, keep the latest": {
			failed: finishedAtAll(-5*time.Second, -1*time.Second, -9*time.Second),
			want:   Record{Failures: 3, LastFailure: at(-time.Second)},
		},
		"new failures add to previous ones": {
			prev:   Record{Failures: 2, LastFailure: at(-time.Minute)},
			failed: finishedAtAll(-10 * time.Second),
			want:   Record{Failures: 3, LastFailure: at(-10 * time.Second)},
		},
		"a late-reported older failure does not move the last failure back": {
			prev:   Record{Failures: 2, LastFailure: at(-time.Minute)},
			failed: finishedAtAll(-2 * time.Minute),
			want:   Record{Failures: 3, LastFailure: at(-time.Minute)},
		},
		"a success alone resets": {
			prev:      Record{Failures: 4, LastFailure: at(-time.Minute)},
			succeeded: finishedAtAll(-10 * time.Second),
			want:      Record{},
		},
		"a success newer than every new failure resets": {
			prev:      Record{Failures: 4, LastFailure: at(-time.Minute)},
			succeeded: finishedAtAll(-10 * time.Second),
			failed:    finishedAtAll(-20*time.Second, -30*time.Second),
			want:      Record{},
		},
		"failures after the success are counted": {
			prev:      Record{Failures: 4, LastFailure: at(-time.Minute)},
			succeeded: finishedAtAll(-30 * time.Second),
			failed:    finishedAtAll(-40*time.Second, -20*time.Second, -10*time.Second),
			want:      Record{Failures: 2, LastFailure: at(-10 * time.Second)},
		},
		"unordered mix: only failures after the latest success count": {
			succeeded: finishedAtAll(-50*time.Second, -25*time.Second, -45*time.Second),
			failed:    finishedAtAll(-5*time.Second, -30*time.Second, -15*time.Second, -60*time.Second),
			want:      Record{Failures: 2, LastFailure: at(-5 * time.Second)},
		},
		"failure at the same time as the success is not counted": {
			succeeded: finishedAtAll(-10 * time.Second),
			failed:    finishedAtAll(-10 * time.Second),
			want:      Record{},
		},
		"a late-reported older success still forgets newer previous failures, as upstream": {
			prev:      Record{Failures: 3, LastFailure: at(-time.Second)},
			succeeded: finishedAtAll(-time.Hour),
			want:      Record{},
		},
		"failure times come from FinishTime fallbacks": {
			failed: []*corev1.Pod{
				pod().created(at(-time.Hour)).containers(running).deleted(at(0), nil).obj(),
				pod().created(at(-time.Hour)).ready(corev1.ConditionFalse, at(-3*time.Second)).obj(),
			},
			want: Record{Failures: 2, LastFailure: at(0)},
		},
		"nil pods are skipped": {
			succeeded: []*corev1.Pod{nil},
			failed:    []*corev1.Pod{nil, finishedAt(at(-time.Second))},
			want:      Record{Failures: 1, LastFailure: at(-time.Second)},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			succeeded, failed := slices.Clone(tc.succeeded), slices.Clone(tc.failed)
			got := tc.prev.Fold(tc.succeeded, tc.failed)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Fold() (-want,+got):\n%s", diff)
			}
			if !slices.Equal(succeeded, tc.succeeded) || !slices.Equal(failed, tc.failed) {
				t.Error("Fold() reordered its input slices")
			}
		})
	}
}

func TestRecordRemaining(t *testing.T) {
	cases := map[string]struct {
		record Record
		now    time.Time
		want   time.Duration
	}{
		"zero record":            {record: Record{}, now: t0, want: 0},
		"one failure just now":   {record: Record{Failures: 1, LastFailure: t0}, now: t0, want: 10 * time.Second},
		"three failures, 5s ago": {record: Record{Failures: 3, LastFailure: at(-5 * time.Second)}, now: t0, want: 35 * time.Second},
		"many failures, capped":  {record: Record{Failures: 50, LastFailure: at(-time.Minute)}, now: t0, want: 9 * time.Minute},
		"backoff over":           {record: Record{Failures: 2, LastFailure: at(-time.Minute)}, now: t0, want: 0},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := tc.record.Remaining(tc.now, Default); got != tc.want {
				t.Errorf("Remaining() = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestRecordSequence folds several syncs in a row, as the controller does.
func TestRecordSequence(t *testing.T) {
	var r Record
	r = r.Fold(nil, finishedAtAll(-30*time.Second))
	r = r.Fold(nil, finishedAtAll(-20*time.Second))
	if got, want := r.Remaining(t0, Default), 0*time.Second; got != want {
		// two failures: 20s from -20s ends at t0.
		t.Errorf("after two failures Remaining() = %v, want %v", got, want)
	}
	r = r.Fold(nil, finishedAtAll(-5*time.Second))
	if got, want := r.Remaining(t0, Default), 35*time.Second; got != want {
		t.Errorf("after three failures Remaining() = %v, want %v", got, want)
	}
	r = r.Fold(finishedAtAll(-time.Second), nil)
	if got := r.Remaining(t0, Default); got != 0 {
		t.Errorf("after a success Remaining() = %v, want 0", got)
	}
	r = r.Fold(nil, finishedAtAll(0))
	if diff := cmp.Diff(Record{Failures: 1, LastFailure: t0}, r); diff != "" {
		t.Errorf("failure after the success (-want,+got):\n%s", diff)
	}
}
