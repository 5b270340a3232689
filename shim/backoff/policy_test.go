package backoff

import (
	"math"
	"testing"
	"time"
)

func TestDelay(t *testing.T) {
	cases := map[string]struct {
		policy   Policy
		failures int
		want     time.Duration
	}{
		"no failures":                         {policy: Default, failures: 0, want: 0},
		"negative failures":                   {policy: Default, failures: -3, want: 0},
		"one failure is the base":             {policy: Default, failures: 1, want: 10 * time.Second},
		"two failures double it":              {policy: Default, failures: 2, want: 20 * time.Second},
		"three failures":                      {policy: Default, failures: 3, want: 40 * time.Second},
		"six failures, just below the cap":    {policy: Default, failures: 6, want: 320 * time.Second},
		"seven failures reach the cap":        {policy: Default, failures: 7, want: 10 * time.Minute},
		"eight failures stay at the cap":      {policy: Default, failures: 8, want: 10 * time.Minute},
		"huge count stays at the cap":         {policy: Default, failures: math.MaxInt, want: 10 * time.Minute},
		"cap hit exactly":                     {policy: Policy{Base: 5 * time.Second, Max: 20 * time.Second}, failures: 3, want: 20 * time.Second},
		"base above cap is capped":            {policy: Policy{Base: time.Hour, Max: time.Minute}, failures: 1, want: time.Minute},
		"zero base turns backoff off":         {policy: Policy{Base: 0, Max: time.Minute}, failures: 5, want: 0},
		"negative base turns backoff off":     {policy: Policy{Base: -time.Second, Max: time.Minute}, failures: 5, want: 0},
		"no cap keeps doubling":               {policy: Policy{Base: 10 * time.Second}, failures: 11, want: 10240 * time.Second},
		"no cap and huge count saturate":      {policy: Policy{Base: 10 * time.Second}, failures: math.MaxInt, want: math.MaxInt64},
		"no cap, one nanosecond, 64 failures": {policy: Policy{Base: 1}, failures: 64, want: math.MaxInt64},
		"no cap, one nanosecond, 63 failures": {policy: Policy{Base: 1}, failures: 63, want: 1 << 62},
		"cap near the largest duration":       {policy: Policy{Base: time.Second, Max: math.MaxInt64}, failures: 1000, want: math.MaxInt64},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := tc.policy.Delay(tc.failures); got != tc.want {
				t.Errorf("%+v.Delay(%d) = %v, want %v", tc.policy, tc.failures, got, tc.want)
			}
		})
	}
}

func TestRemaining(t *testing.T) {
	cases := map[string]struct {
		now, lastFailure time.Time
		failures         int
		want             time.Duration
	}{
		"no failures":                                        {now: t0, lastFailure: t0, failures: 0, want: 0},
		"failure just now waits the whole delay":             {now: t0, lastFailure: t0, failures: 1, want: 10 * time.Second},
		"one second after the failure":                       {now: at(time.Second), lastFailure: t0, failures: 1, want: 9 * time.Second},
		"three failures, partly waited":                      {now: at(15 * time.Second), lastFailure: t0, failures: 3, want: 25 * time.Second},
		"exactly at the end of the delay":                    {now: at(10 * time.Second), lastFailure: t0, failures: 1, want: 0},
		"long after the delay":                               {now: at(time.Hour), lastFailure: t0, failures: 1, want: 0},
		"capped delay":                                       {now: at(time.Minute), lastFailure: t0, failures: 100, want: 9 * time.Minute},
		"failure in the future waits no more than the delay": {now: t0, lastFailure: at(time.Hour), failures: 1, want: 10 * time.Second},
		"zero failure time means long ago":                   {now: t0, lastFailure: time.Time{}, failures: 5, want: 0},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := Default.Remaining(tc.now, tc.lastFailure, tc.failures); got != tc.want {
				t.Errorf("Remaining() = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestRequeueDelay(t *testing.T) {
	cases := map[string]struct {
		remaining, want time.Duration
	}{
		"zero is floored":            {remaining: 0, want: time.Second},
		"below the floor is floored": {remaining: 300 * time.Millisecond, want: time.Second},
		"exactly the floor":          {remaining: time.Second, want: time.Second},
		"above the floor is kept":    {remaining: 40 * time.Second, want: 40 * time.Second},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := RequeueDelay(tc.remaining); got != tc.want {
				t.Errorf("RequeueDelay(%v) = %v, want %v", tc.remaining, got, tc.want)
			}
		})
	}
}
