package controller

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	clocktesting "k8s.io/utils/clock/testing"
)

func TestExpectationsSatisfied(t *testing.T) {
	const key = "ns/job"
	cases := []struct {
		name string
		// steps act on the expectations of key, with the fake clock.
		steps []func(e *expectations, clk *clocktesting.FakeClock)
		want  bool
	}{
		{
			name: "a Job never seen is satisfied",
			want: true,
		},
		{
			name:  "nothing expected is satisfied",
			steps: []func(*expectations, *clocktesting.FakeClock){expect(0)},
			want:  true,
		},
		{
			name:  "pending creations are not satisfied",
			steps: []func(*expectations, *clocktesting.FakeClock){expect(2), created},
			want:  false,
		},
		{
			name:  "every creation observed is satisfied",
			steps: []func(*expectations, *clocktesting.FakeClock){expect(2), created, created},
			want:  true,
		},
		{
			name:  "more creations observed than expected is satisfied",
			steps: []func(*expectations, *clocktesting.FakeClock){expect(1), created, created, created},
			want:  true,
		},
		{
			name:  "creations observed before the expectation do not count for it",
			steps: []func(*expectations, *clocktesting.FakeClock){expect(0), created, created, expect(1)},
			want:  false,
		},
		{
			name:  "a pending deletion is not satisfied",
			steps: []func(*expectations, *clocktesting.FakeClock){expect(0, "a", "b"), deleted("a")},
			want:  false,
		},
		{
			name:  "observing one deletion twice does not cover for another",
			steps: []func(*expectations, *clocktesting.FakeClock){expect(0, "a", "b"), deleted("a"), deleted("a")},
			want:  false,
		},
		{
			name:  "a deletion of a pod not expected does not count",
			steps: []func(*expectations, *clocktesting.FakeClock){expect(0, "a"), deleted("z")},
			want:  false,
		},
		{
			name:  "every deletion observed is satisfied",
			steps: []func(*expectations, *clocktesting.FakeClock){expect(0, "a", "b"), deleted("b"), deleted("a")},
			want:  true,
		},
		{
			name:  "creations and deletions both needed",
			steps: []func(*expectations, *clocktesting.FakeClock){expect(1, "a"), deleted("a")},
			want:  false,
		},
		{
			name:  "a new expectation replaces the old one",
			steps: []func(*expectations, *clocktesting.FakeClock){expect(3, "a"), expect(0, "b"), deleted("b")},
			want:  true,
		},
		{
			name:  "pending expectations expire after the TTL",
			steps: []func(*expectations, *clocktesting.FakeClock){expect(1, "a"), wait(ExpectationsTTL + time.Second)},
			want:  true,
		},
		{
			name:  "pending expectations hold until the TTL",
			steps: []func(*expectations, *clocktesting.FakeClock){expect(1, "a"), wait(ExpectationsTTL)},
			want:  false,
		},
		{
			name:  "forget drops pending expectations",
			steps: []func(*expectations, *clocktesting.FakeClock){expect(1, "a"), forget},
			want:  true,
		},
		{
			name:  "finalizer removals in flight do not hold creations back",
			steps: []func(*expectations, *clocktesting.FakeClock){removing("x")},
			want:  true,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
			e := newExpectations(clk)
			for _, step := range tc.steps {
				step(e, clk)
			}
			if got := e.satisfied(key); got != tc.want {
				t.Errorf("satisfied = %v, want %v", got, tc.want)
			}
			if got := e.satisfied("ns/other"); !got {
				t.Errorf("another Job's expectations are not satisfied")
			}
		})
	}
}

func expect(creations int, deletions ...types.UID) func(*expectations, *clocktesting.FakeClock) {
	return func(e *expectations, _ *clocktesting.FakeClock) { e.expect("ns/job", creations, deletions) }
}
func created(e *expectations, _ *clocktesting.FakeClock) { e.creationObserved("ns/job") }
func deleted(uid types.UID) func(*expectations, *clocktesting.FakeClock) {
	return func(e *expectations, _ *clocktesting.FakeClock) { e.deletionObserved("ns/job", uid) }
}
func wait(d time.Duration) func(*expectations, *clocktesting.FakeClock) {
	return func(_ *expectations, clk *clocktesting.FakeClock) { clk.Step(d) }
}
func forget(e *expectations, _ *clocktesting.FakeClock) { e.forget("ns/job") }
func removing(uids ...types.UID) func(*expectations, *clocktesting.FakeClock) {
	return func(e *expectations, _ *clocktesting.FakeClock) { e.expectFinalizersRemoved("ns/job", uids) }
}

func TestExpectationsFinalizers(t *testing.T) {
	const key = "ns/job"
	cases := []struct {
		name     string
		expected [][]types.UID
		observed []types.UID
		forget   bool
		want     sets.Set[types.UID]
	}{
		{name: "none", want: sets.New[types.UID]()},
		{name: "in flight", expected: [][]types.UID{{"a", "b"}}, want: sets.New[types.UID]("a", "b")},
		{name: "two syncs add up", expected: [][]types.UID{{"a"}, {"b"}}, want: sets.New[types.UID]("a", "b")},
		{name: "observed removal", expected: [][]types.UID{{"a", "b"}}, observed: []types.UID{"a", "a", "z"}, want: sets.New[types.UID]("b")},
		{name: "all observed", expected: [][]types.UID{{"a"}}, observed: []types.UID{"a"}, want: sets.New[types.UID]()},
		{name: "observed without expectation", observed: []types.UID{"a"}, want: sets.New[types.UID]()},
		{name: "forgotten", expected: [][]types.UID{{"a"}}, forget: true, want: sets.New[types.UID]()},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(time.Now())
			e := newExpectations(clk)
			for _, uids := range tc.expected {
				e.expectFinalizersRemoved(key, uids)
			}
			for _, uid := range tc.observed {
				e.finalizerRemovalObserved(key, uid)
			}
			if tc.forget {
				e.forget(key)
			}
			// Removals in flight never expire.
			clk.Step(2 * ExpectationsTTL)
			got := e.finalizersBeingRemoved(key)
			if !got.Equal(tc.want) {
				t.Errorf("finalizersBeingRemoved = %v, want %v", sets.List(got), sets.List(tc.want))
			}
			// The result is a copy.
			got.Insert("mutated")
			if e.finalizersBeingRemoved(key).Has("mutated") {
				t.Errorf("finalizersBeingRemoved returned the internal set")
			}
		})
	}
}

// finalizerRemovalObserved says when the last removal in flight is seen, so that the Job
// is synced at once to count its pods.
func TestLastFinalizerRemovalObserved(t *testing.T) {
	e := newExpectations(clocktesting.NewFakeClock(time.Now()))
	const key = "ns/job"
	e.expectFinalizersRemoved(key, []types.UID{"a", "b"})
	steps := []struct {
		uid  types.UID
		want bool
	}{
		{"a", false}, // b still in flight
		{"x", false}, // never expected
		{"b", true},  // the last one
		{"b", false}, // seen again: not the last any more
		{"c", false}, // nothing in flight
	}
	for _, s := range steps {
		if got := e.finalizerRemovalObserved(key, s.uid); got != s.want {
			t.Errorf("observed %s: last = %v, want %v", s.uid, got, s.want)
		}
	}
	if got := e.finalizerRemovalObserved("other/job", "a"); got {
		t.Error("a key without expectations reported a last removal")
	}
}
