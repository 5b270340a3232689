package cri

import "sync"

// streamQueue sits between a goroutine that receives a runtime's event stream, which
// must never wait (a subscriber that stops reading holds back the runtime's publishing:
// containerd 2.x internal/eventq publishes to each subscriber's channel of 100 with a
// blocking send, v2.3.4), and the session that handles the events, which calls the
// runtime and waits for the consumer. It holds at most max events; when full, new events
// are dropped and the queue remembers that it overflowed, which the session answers
// with a relist: the tracker then finds every exit again and emits those not emitted
// yet. The stream's end is kept apart and never dropped.
type streamQueue[T any] struct {
	mu       sync.Mutex
	items    []T
	max      int
	overflow bool
	dropped  uint64 // events dropped since the last take
	received uint64 // events received, dropped or not
	end      error
	ended    bool
	ready    chan struct{} // has a value while there is something to take
}

func newStreamQueue[T any](max int) *streamQueue[T] {
	return &streamQueue[T]{max: max, ready: make(chan struct{}, 1)}
}

func (q *streamQueue[T]) signal() {
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// push adds an event, or drops it when the queue is full. It never blocks. It reports
// whether it dropped the event, and whether that began an overflow (the first drop since
// the last take).
func (q *streamQueue[T]) push(v T) (dropped, overflowed bool) {
	q.mu.Lock()
	q.received++
	if len(q.items) >= q.max {
		dropped, overflowed = true, !q.overflow
		q.overflow = true
		q.dropped++
	} else {
		q.items = append(q.items, v)
	}
	q.mu.Unlock()
	q.signal()
	return dropped, overflowed
}

// close records how the stream ended (the error of its last Recv).
func (q *streamQueue[T]) close(err error) {
	q.mu.Lock()
	q.end, q.ended = err, true
	q.mu.Unlock()
	q.signal()
}

// take returns what is queued and empties the queue: the events (those queued before
// an overflow too: they are valid, only not all), whether it overflowed and how many
// events were dropped, and the stream's end once it has ended.
func (q *streamQueue[T]) take() (items []T, overflow bool, dropped uint64, ended bool, end error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	items, overflow, dropped = q.items, q.overflow, q.dropped
	q.items, q.overflow, q.dropped = nil, false, 0
	return items, overflow, dropped, q.ended, q.end
}

// count is how many events the stream delivered.
func (q *streamQueue[T]) count() uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.received
}
