// Package crifake is a hand-written cri.Source for tests of the agent: the test sends the
// events and sets the connection state.
package crifake

import (
	"context"
	"sync/atomic"

	"github.com/coroner-dev/coroner/cri"
)

// Source is a cri.Source fed by the test.
type Source struct {
	ch        chan cri.ContainerEvent
	connected atomic.Bool
	started   atomic.Bool
}

var _ cri.Source = (*Source)(nil)

// New returns a connected Source whose channel holds up to buffer events.
func New(buffer int) *Source {
	s := &Source{ch: make(chan cri.ContainerEvent, buffer)}
	s.connected.Store(true)
	return s
}

// Events returns the channel the test feeds; it is never closed (a test ends by
// cancelling the consumer's context). It panics when called twice, like cri.Watcher.
func (s *Source) Events(context.Context) <-chan cri.ContainerEvent {
	if !s.started.CompareAndSwap(false, true) {
		panic("crifake: Events called twice")
	}
	return s.ch
}

// Connected reports what SetConnected set (true at first).
func (s *Source) Connected() bool { return s.connected.Load() }

// SetConnected sets what Connected reports.
func (s *Source) SetConnected(c bool) { s.connected.Store(c) }

// Send delivers an event to the consumer; it blocks when the buffer is full.
func (s *Source) Send(ev cri.ContainerEvent) { s.ch <- ev }
