package crifake

import (
	"context"
	"testing"

	"github.com/coroner-dev/coroner/cri"
)

func TestSource(t *testing.T) {
	s := New(1)
	events := s.Events(context.Background())
	s.Send(cri.ContainerEvent{Kind: cri.Exited, ContainerID: "c"})
	if ev := <-events; ev.ContainerID != "c" {
		t.Errorf("got %+v", ev)
	}
	if !s.Connected() {
		t.Error("not connected at first")
	}
	s.SetConnected(false)
	if s.Connected() {
		t.Error("still connected")
	}
}
