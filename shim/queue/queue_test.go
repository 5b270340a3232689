package queue

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/utils/clock"
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

// TestServe: the workers handle the keys once the caches are in, a cancelled ctx stops
// them after the key in hand (its handling is not cancelled), and the queues are shut down
// also when the caches never synced.
func TestServe(t *testing.T) {
	t.Run("caches never synced", func(t *testing.T) {
		q := New("serve-unsynced", clock.RealClock{})
		err := Serve(context.Background(), 2, func() error { return errors.New("did not sync") },
			Worker{Queue: q, Handle: func(context.Context, string) error { return nil }, What: "x", Kind: "k"})
		if err == nil || !q.ShuttingDown() {
			t.Errorf("Serve = %v, queue shutting down %v; want the error and the queue shut down", err, q.ShuttingDown())
		}
	})
	t.Run("handles, then stops after the key in hand", func(t *testing.T) {
		q := New("serve", clock.RealClock{})
		ctx, cancel := context.WithCancel(context.Background())
		started, release := make(chan string, 4), make(chan struct{})
		var handled atomic.Int32
		handle := func(work context.Context, key string) error {
			started <- key
			<-release
			if work.Err() != nil {
				t.Errorf("the handling of %s was cancelled with ctx", key)
			}
			handled.Add(1)
			return nil
		}
		done := make(chan error, 1)
		go func() {
			done <- Serve(ctx, 1, func() error { return nil }, Worker{Queue: q, Handle: handle, What: "x", Kind: "k"})
		}()
		q.Add("ns/a")
		<-started
		q.Add("ns/b")
		cancel()
		close(release)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if handled.Load() != 1 || !q.ShuttingDown() {
			t.Errorf("handled %d keys, shutting down %v; want ns/a handled to its end and nothing after", handled.Load(), q.ShuttingDown())
		}
	})
}
