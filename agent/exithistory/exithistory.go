// Package exithistory keeps the last container exits of a pod in its
// annotation coroner.dev/exit-history (requirement A5).
//
// A pod with restartPolicy OnFailure or Always has its failed containers
// restarted in place by the kubelet: the pod never fails, its status keeps
// only the last termination of each container, and a podFailurePolicy
// onExitCodes rule never sees the exits before (a known upstream gap; the
// built-in controller even requires restartPolicy Never with a
// podFailurePolicy). The agent records every exit it sees in the annotation so
// that the shim, and a human with kubectl, can act on them.
//
// # Format
//
// The value is a compact JSON array of exits, oldest first:
//
//		[{"container":"main","exitCode":137,"reason":"OOMKilled","finishedAt":"2026-01-02T03:04:05Z","restartCount":2,"oom":"limit"}]
//
//	  - container: the container's name (required);
//	  - exitCode: its exit code;
//	  - reason: the runtime's reason ("Error", "OOMKilled", "Completed", ...),
//	    at most 64 bytes; omitted when empty;
//	  - finishedAt: when it exited, UTC, whole seconds (the precision of the
//	    pod's own timestamps); omitted when unknown;
//	  - restartCount: the container's restart count while it ran (0 for its
//	    first run), as the kubelet labels it; omitted when unknown;
//	  - oom: coroner's verdict when the exit was an OOM kill: "limit" (the
//	    pod's own memory limit), "node" (node memory pressure), "unknown"
//	    (an OOM kill that could not be placed); omitted otherwise.
//
// Readers must ignore fields they do not know, so fields can be added; a
// value that is not such an array (or has an entry without a container) is
// malformed, and Append replaces it rather than fail: the history is a
// convenience, a stuck writer is not.
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
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// OOM verdicts as written in the "oom" field.
const (
	OOMLimit   = "limit"
	OOMNode    = "node"
	OOMUnknown = "unknown"
)

// Entry is one container exit.
type Entry struct {
	Container string
	ExitCode  int32
	Reason    string
	// FinishedAt is when the container exited; zero when unknown.
	FinishedAt time.Time
	// RestartCount is the container's restart count while it ran; negative
	// when unknown.
	RestartCount int32
	// OOM is OOMLimit, OOMNode, OOMUnknown or empty.
	OOM string
}

// wire is Entry as written.
type wire struct {
	Container    string    `json:"container"`
	ExitCode     int32     `json:"exitCode"`
	Reason       string    `json:"reason,omitempty"`
	FinishedAt   time.Time `json:"finishedAt,omitzero"`
	RestartCount *int32    `json:"restartCount,omitempty"`
	OOM          string    `json:"oom,omitempty"`
}

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

// ErrMalformed is wrapped by Parse's error, and by Append's when it replaced
// a malformed annotation.
var ErrMalformed = errors.New("malformed exit history")

// Parse reads an annotation value. The empty string is an empty history.
// The error wraps ErrMalformed and says what is wrong, for a log line.
func Parse(s string) ([]Entry, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	if t := strings.TrimSpace(s); t[0] != '[' {
		return nil, fmt.Errorf("%w: not a JSON array: %.40q", ErrMalformed, s)
	}
	var ws []wire
	if err := json.Unmarshal([]byte(s), &ws); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	entries := make([]Entry, 0, len(ws))
	for i, w := range ws {
		if w.Container == "" {
			return nil, fmt.Errorf("%w: entry %d has no container", ErrMalformed, i)
		}
		if y := w.FinishedAt.UTC().Year(); !w.FinishedAt.IsZero() && (y < 1 || y > 9999) {
			return nil, fmt.Errorf("%w: entry %d: finishedAt %v is out of range", ErrMalformed, i, w.FinishedAt)
		}
		e := Entry{Container: w.Container, ExitCode: w.ExitCode, Reason: w.Reason, FinishedAt: w.FinishedAt, RestartCount: -1, OOM: w.OOM}
		if w.RestartCount != nil {
			if *w.RestartCount < 0 {
				return nil, fmt.Errorf("%w: entry %d: negative restartCount %d", ErrMalformed, i, *w.RestartCount)
			}
			e.RestartCount = *w.RestartCount
		}
		entries = append(entries, e)
	}
	return entries, nil
}

// Format writes entries as an annotation value (no bounds applied; see
// Append). An empty history is "[]".
func Format(entries []Entry) (string, error) {
	ws := make([]wire, 0, len(entries))
	for _, e := range entries {
		w := wire{Container: e.Container, ExitCode: e.ExitCode, Reason: e.Reason, FinishedAt: e.FinishedAt, OOM: e.OOM}
		if e.RestartCount >= 0 {
			rc := e.RestartCount
			w.RestartCount = &rc
		}
		ws = append(ws, w)
	}
	b, err := json.Marshal(ws)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

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
// is then to be written, and the error (wrapping ErrMalformed) says what was
// wrong, for a log line; changed is true. Any other error (e has no container
// name) returns current unchanged.
func Append(current string, e Entry, lim Limits) (value string, changed bool, err error) {
	if e.Container == "" {
		return current, false, errors.New("exithistory: exit without a container name")
	}
	lim = lim.normalized()
	e = normalize(e)

	entries, perr := Parse(current)
	if perr != nil {
		entries = nil
	}
	for i := range entries {
		entries[i] = normalize(entries[i])
	}

	if i := slices.IndexFunc(entries, func(x Entry) bool { return sameExit(x, e) }); i >= 0 {
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
func bounded(entries []Entry, lim Limits) (string, error) {
	if len(entries) > lim.MaxEntries {
		entries = entries[len(entries)-lim.MaxEntries:]
	}
	for {
		s, err := Format(entries)
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

func normalize(e Entry) Entry {
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
func sameExit(a, b Entry) bool {
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
func fillIn(recorded, e Entry) Entry {
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
