// Package queue is what coroner-shim's controllers (the Job controller, shim/controller,
// and node-failure recovery, shim/recoverer) share about their work queues: how a queue
// of object keys is built, with the retry backoff of a key whose handling failed, and one
// step of a worker.
package queue

import (
	"context"
	"sync"
	"time"

	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
)

// Retry backoff of a key whose handling failed (the built-in Job controller's
// DefaultJobApiBackOff and MaxJobApiBackOff).
const (
	RetryBase = time.Second
	RetryMax  = time.Minute
)

// Queue is a rate-limited queue of object keys (namespace/name).
type Queue = workqueue.TypedRateLimitingInterface[string]

// New builds a Queue named name (the name of its workqueue metrics) on clk.
func New(name string, clk clock.WithTicker) Queue {
	return workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedItemExponentialFailureRateLimiter[string](RetryBase, RetryMax),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: name, Clock: clk})
}

// ProcessNext takes one key from q and handles it with work: a key handled without error
// is forgotten, one whose handling failed is logged (what names the work, kind the key's
// kind: "<what> failed; will retry", kind, key) and added again with rate limiting. It
// returns false when q is shut down or stop is done; the handling itself runs with work,
// which callers do not cancel, so that stopping never cuts the writes of one key in half.
func ProcessNext(stop, work context.Context, q Queue, handle func(context.Context, string) error, what, kind string) bool {
	key, quit := q.Get()
	if quit {
		return false
	}
	defer q.Done(key)
	if stop.Err() != nil {
		return false
	}
	if err := handle(work, key); err != nil {
		utilruntime.HandleErrorWithContext(work, err, what+" failed; will retry", kind, key)
		q.AddRateLimited(key)
		return true
	}
	q.Forget(key)
	return true
}

// Worker is one kind of work of a controller: the keys of Queue, handled by Handle (What
// and Kind name it in logs, see ProcessNext).
type Worker struct {
	Queue      Queue
	Handle     func(context.Context, string) error
	What, Kind string
}

// Serve runs a controller's workers: once synced (which waits for the caches the
// controller reads) says they are in, n goroutines per Worker until ctx is done. Then, or
// when synced fails, it shuts the queues down and waits for the goroutines to finish the
// key they are on: the handling runs with a context ctx's cancellation does not reach, so
// that stopping never cuts the writes of one key in half. It returns synced's error.
func Serve(ctx context.Context, n int, synced func() error, workers ...Worker) error {
	var wg sync.WaitGroup
	defer func() {
		for _, w := range workers {
			w.Queue.ShutDown()
		}
		wg.Wait()
	}()
	if err := synced(); err != nil {
		return err
	}
	work := context.WithoutCancel(ctx)
	for range n {
		for _, w := range workers {
			wg.Go(func() {
				for ProcessNext(ctx, work, w.Queue, w.Handle, w.What, w.Kind) {
				}
			})
		}
	}
	<-ctx.Done()
	return nil
}
