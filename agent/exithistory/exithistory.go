// Package exithistory is how coroner-agent writes a pod's exit history, the annotation
// coroner.dev/exit-history (docs/agent.md): its format, and reading it, are package
// api/v1alpha1's (Exit, ParseExitHistory, FormatExitHistory); Append records one more
// exit in it.
//
// # Bounds and identity
//
// The history holds at most Limits.MaxEntries exits and Limits.MaxBytes bytes,
// dropping the oldest first: annotations share a 256 KiB budget per object
// with everything else on the pod, and a crash-looping container must not
// grow its pod without end. An exit is identified by its container and
// restart count and finish time (either alone when the other is unknown), so the
// agent can record what it observes as often as it observes it (a relist, a
// restart of the agent): observing the same exit again changes nothing.
package exithistory

import (
	"errors"
	"fmt"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/coroner-dev/coroner/api/v1alpha1"
)

// Limits bound the history.
type Limits struct {
	// MaxEntries is how many exits to keep, at least 1 (the agent's
	// --exit-history-size, default 10).
	MaxEntries int
	// MaxBytes is the most bytes the annotation value may take, at least
	// MinBytes (default 2 KiB: about 20 exits).
	MaxBytes int
}

// DefaultLimits keeps 10 exits in at most 2 KiB.
var DefaultLimits = Limits{MaxEntries: 10, MaxBytes: 2048}

// MinBytes is the smallest MaxBytes honoured: one exit always fits.
const MinBytes = 512

// maxReason bounds Reason (runtime reasons are short words; this is a guard).
const maxReason = 64

// Append records exit e in the history current (an annotation value, maybe
// empty) and returns the new value and whether it differs from current.
//
//   - The same exit seen again (same container, and same restart count, or
//     when either count is unknown the same finish time, or when either of
//     those is unknown too the same exit code and reason) changes nothing,
//     except that fields the recorded exit lacks and e has (reason, finish
//     time, restart count, oom verdict) are filled in: a later, better
//     informed observation completes an earlier one and never contradicts
//     it.
//   - A new exit is placed by finish time (exits without one go last) and
//     the oldest exits are dropped beyond lim.MaxEntries and lim.MaxBytes.
//     An exit older than all of a full history is dropped at once, which is
//     no change.
//   - e is normalized first: finish time in UTC and whole seconds, reason cut
//     to 64 bytes.
//
// A malformed current is replaced by a history of just e: the value returned
// is then to be written, and the error (wrapping v1alpha1.ErrMalformedExitHistory) says what was
// wrong, for a log line; changed is true. Any other error (e has no container
// name) returns current unchanged.
func Append(current string, e v1alpha1.Exit, lim Limits) (value string, changed bool, err error) {
	if e.Container == "" {
		return current, false, errors.New("exithistory: exit without a container name")
	}
	lim = lim.normalized()
	e = normalize(e)

	entries, perr := v1alpha1.ParseExitHistory(current)
	if perr != nil {
		entries = nil
	}
	for i := range entries {
		entries[i] = normalize(entries[i])
	}

	if i := slices.IndexFunc(entries, func(x v1alpha1.Exit) bool { return sameExit(x, e) }); i >= 0 {
		entries[i] = fillIn(entries[i], e)
	} else {
		at := len(entries)
		if !e.FinishedAt.IsZero() {
			for at > 0 && !entries[at-1].FinishedAt.IsZero() && entries[at-1].FinishedAt.After(e.FinishedAt) {
				at--
			}
		}
		entries = slices.Insert(entries, at, e)
	}

	value, err = bounded(entries, lim)
	if err != nil {
		return current, false, fmt.Errorf("exithistory: %w", err)
	}
	if perr != nil {
		return value, true, fmt.Errorf("exithistory: replacing the annotation: %w", perr)
	}
	return value, value != current, nil
}

// bounded formats the last entries that fit lim.
func bounded(entries []v1alpha1.Exit, lim Limits) (string, error) {
	if len(entries) > lim.MaxEntries {
		entries = entries[len(entries)-lim.MaxEntries:]
	}
	for {
		s, err := v1alpha1.FormatExitHistory(entries)
		if err != nil {
			return "", err
		}
		if len(s) <= lim.MaxBytes || len(entries) <= 1 {
			return s, nil
		}
		entries = entries[1:]
	}
}

func (l Limits) normalized() Limits {
	if l.MaxEntries < 1 {
		l.MaxEntries = 1
	}
	if l.MaxBytes < MinBytes {
		l.MaxBytes = MinBytes
	}
	return l
}

func normalize(e v1alpha1.Exit) v1alpha1.Exit {
	if !e.FinishedAt.IsZero() {
		e.FinishedAt = e.FinishedAt.UTC().Truncate(time.Second)
	}
	if len(e.Reason) > maxReason {
		r := e.Reason[:maxReason]
		for !utf8.ValidString(r) {
			r = r[:len(r)-1]
		}
		e.Reason = r
	}
	if len(e.Container) > 253 {
		e.Container = e.Container[:253] // container names are DNS labels; a guard
	}
	if e.RestartCount < 0 {
		e.RestartCount = -1
	}
	return e
}

// sameExit reports whether a and b are the same exit of the same container.
func sameExit(a, b v1alpha1.Exit) bool {
	if a.Container != b.Container {
		return false
	}
	bothFinished := !a.FinishedAt.IsZero() && !b.FinishedAt.IsZero()
	switch {
	case a.RestartCount >= 0 && b.RestartCount >= 0:
		// The kubelet's restart count can start again from 0 (a new sandbox after the
		// old containers were garbage-collected): with both finish times known, they
		// must agree too.
		return a.RestartCount == b.RestartCount && (!bothFinished || a.FinishedAt.Equal(b.FinishedAt))
	case bothFinished:
		return a.FinishedAt.Equal(b.FinishedAt)
	default:
		return a.ExitCode == b.ExitCode && a.Reason == b.Reason
	}
}

// fillIn completes recorded with what it lacks and e has.
func fillIn(recorded, e v1alpha1.Exit) v1alpha1.Exit {
	if recorded.Reason == "" {
		recorded.Reason = e.Reason
	}
	if recorded.FinishedAt.IsZero() {
		recorded.FinishedAt = e.FinishedAt
	}
	if recorded.RestartCount < 0 {
		recorded.RestartCount = e.RestartCount
	}
	if recorded.OOM == "" {
		recorded.OOM = e.OOM
	}
	return recorded
}
