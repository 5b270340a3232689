package cri

import (
	"io"
	"testing"
)

func TestStreamQueue(t *testing.T) {
	q := newStreamQueue[int](2)
	for i, want := range []struct{ dropped, overflowed bool }{{false, false}, {false, false}, {true, true}, {true, false}} {
		if d, o := q.push(i); d != want.dropped || o != want.overflowed {
			t.Errorf("push %d: dropped %v overflowed %v, want %+v", i, d, o, want)
		}
	}
	q.close(io.EOF) // the end is kept although the queue is full
	<-q.ready
	items, overflow, dropped, ended, end := q.take()
	if len(items) != 2 || items[0] != 0 || items[1] != 1 || !overflow || dropped != 2 || !ended || end != io.EOF || q.count() != 4 {
		t.Errorf("take = %v %v %d %v %v, count %d", items, overflow, dropped, ended, end, q.count())
	}
	if items, overflow, dropped, _, _ := q.take(); len(items) != 0 || overflow || dropped != 0 {
		t.Errorf("second take = %v %v %d", items, overflow, dropped)
	}
	if d, o := q.push(9); d || o {
		t.Error("a push after a take dropped")
	}
}
