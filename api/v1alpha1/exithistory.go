package v1alpha1

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// The exit history: coroner-agent keeps the last container exits of a pod in its
// annotation coroner.dev/exit-history (conditions.AnnotationExitHistory; docs/agent.md,
// requirement A5 in docs/requirements.md), and `coronerctl explain` reads it.
//
// A pod with restartPolicy OnFailure or Always has its failed containers restarted in
// place by the kubelet: the pod never fails, its status keeps only the last termination of
// each container, and a podFailurePolicy onExitCodes rule never sees the exits before.
// The agent records every exit it sees in the annotation so that the shim, and a human
// with kubectl, can act on them. How the agent bounds the history and recognizes an exit
// it has recorded before is package agent/exithistory's.
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
// malformed (ErrMalformedExitHistory), and the agent replaces it rather than
// fail: the history is a convenience, a stuck writer is not.

// OOM verdicts as written in the "oom" field.
const (
	ExitOOMLimit   = "limit"
	ExitOOMNode    = "node"
	ExitOOMUnknown = "unknown"
)

// Exit is one container exit in the history.
type Exit struct {
	Container string
	ExitCode  int32
	Reason    string
	// FinishedAt is when the container exited; zero when unknown.
	FinishedAt time.Time
	// RestartCount is the container's restart count while it ran; negative
	// when unknown.
	RestartCount int32
	// OOM is ExitOOMLimit, ExitOOMNode, ExitOOMUnknown or empty.
	OOM string
}

// exitWire is Exit as written.
type exitWire struct {
	Container    string    `json:"container"`
	ExitCode     int32     `json:"exitCode"`
	Reason       string    `json:"reason,omitempty"`
	FinishedAt   time.Time `json:"finishedAt,omitzero"`
	RestartCount *int32    `json:"restartCount,omitempty"`
	OOM          string    `json:"oom,omitempty"`
}

// ErrMalformedExitHistory is wrapped by ParseExitHistory's error (and by the
// agent's when it replaced a malformed annotation).
var ErrMalformedExitHistory = errors.New("malformed exit history")

// ParseExitHistory reads an annotation value. The empty string is an empty history.
// The error wraps ErrMalformedExitHistory and says what is wrong, for a log line.
func ParseExitHistory(s string) ([]Exit, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	if t := strings.TrimSpace(s); t[0] != '[' {
		return nil, fmt.Errorf("%w: not a JSON array: %.40q", ErrMalformedExitHistory, s)
	}
	var ws []exitWire
	if err := json.Unmarshal([]byte(s), &ws); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformedExitHistory, err)
	}
	entries := make([]Exit, 0, len(ws))
	for i, w := range ws {
		if w.Container == "" {
			return nil, fmt.Errorf("%w: entry %d has no container", ErrMalformedExitHistory, i)
		}
		if y := w.FinishedAt.UTC().Year(); !w.FinishedAt.IsZero() && (y < 1 || y > 9999) {
			return nil, fmt.Errorf("%w: entry %d: finishedAt %v is out of range", ErrMalformedExitHistory, i, w.FinishedAt)
		}
		e := Exit{Container: w.Container, ExitCode: w.ExitCode, Reason: w.Reason, FinishedAt: w.FinishedAt, RestartCount: -1, OOM: w.OOM}
		if w.RestartCount != nil {
			if *w.RestartCount < 0 {
				return nil, fmt.Errorf("%w: entry %d: negative restartCount %d", ErrMalformedExitHistory, i, *w.RestartCount)
			}
			e.RestartCount = *w.RestartCount
		}
		entries = append(entries, e)
	}
	return entries, nil
}

// FormatExitHistory writes entries as an annotation value (no bounds applied:
// those are the writer's). An empty history is "[]".
func FormatExitHistory(entries []Exit) (string, error) {
	ws := make([]exitWire, 0, len(entries))
	for _, e := range entries {
		w := exitWire{Container: e.Container, ExitCode: e.ExitCode, Reason: e.Reason, FinishedAt: e.FinishedAt, OOM: e.OOM}
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
