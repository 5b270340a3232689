package measure

import (
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	var ds []time.Duration
	for i := 10; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Second)
	}
	for _, tc := range []struct {
		p    int
		want time.Duration
	}{{50, 5 * time.Second}, {90, 9 * time.Second}, {99, 10 * time.Second}, {100, 10 * time.Second}, {1, time.Second}} {
		if got := Percentile(ds, tc.p); got != tc.want {
			t.Errorf("p%d = %v, want %v", tc.p, got, tc.want)
		}
	}
	if ds[0] != 10*time.Second {
		t.Error("Percentile sorted its input in place")
	}
	if Percentile(nil, 50) != 0 {
		t.Error("p50 of nothing is not 0")
	}
}
