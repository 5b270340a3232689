package queue

import (
	"context"
	"errors"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// TestProcessNext: a key handled without error is forgotten, one whose handling failed is
// retried after the backoff, and a worker stops on a shut-down queue or a done stop
// context without handling the key.
func TestProcessNext(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	q := New("test", clk)
	defer q.ShutDown()
	ctx := context.Background()
	var handled []string
	fail := true
	handle := func(_ context.Context, key string) error {
		handled = append(handled, key)
		if fail {
			return errors.New("boom")
		}
		return nil
	}

	q.Add("ns/a")
	if !ProcessNext(ctx, ctx, q, handle, "Testing", "pod") {
		t.Fatal("ProcessNext = false on a running queue")
	}
	if n := q.NumRequeues("ns/a"); n != 1 {
		t.Errorf("after a failure: %d requeues, want 1", n)
	}
	if q.Len() != 0 {
		t.Errorf("the failed key is queued at once, want it after the backoff (%v)", RetryBase)
	}
	clk.Step(RetryBase)
	fail = false
	if !ProcessNext(ctx, ctx, q, handle, "Testing", "pod") {
		t.Fatal("ProcessNext = false on a running queue")
	}
	if n := q.NumRequeues("ns/a"); n != 0 {
		t.Errorf("after a success: %d requeues, want 0 (forgotten)", n)
	}
	if len(handled) != 2 {
		t.Errorf("handled %v, want ns/a twice", handled)
	}

	stopped, cancel := context.WithCancel(ctx)
	cancel()
	q.Add("ns/b")
	if ProcessNext(stopped, ctx, q, handle, "Testing", "pod") {
		t.Error("ProcessNext = true with stop done")
	}
	if len(handled) != 2 {
		t.Errorf("handled %v after stop, want nothing more", handled)
	}
	q.ShutDown()
	if ProcessNext(ctx, ctx, q, handle, "Testing", "pod") {
		t.Error("ProcessNext = true on a shut-down queue")
	}
}
