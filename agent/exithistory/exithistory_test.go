package exithistory

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/coroner-dev/coroner/api/v1alpha1"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func at(sec int) time.Time { return t0.Add(time.Duration(sec) * time.Second) }

func exit(container string, code int32, restarts int32, finished time.Time) v1alpha1.Exit {
	reason := "Error"
	if code == 0 {
		reason = "Completed"
	}
	return v1alpha1.Exit{Container: container, ExitCode: code, Reason: reason, FinishedAt: finished, RestartCount: restarts}
}

func format(t *testing.T, entries ...v1alpha1.Exit) string {
	t.Helper()
	s, err := v1alpha1.FormatExitHistory(entries)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestAppend(t *testing.T) {
	lim := Limits{MaxEntries: 3, MaxBytes: 2048}
	cases := map[string]struct {
		current       string
		exit          v1alpha1.Exit
		lim           Limits
		want          []v1alpha1.Exit
		wantChanged   bool
		wantMalformed bool
		wantErr       bool
	}{
		"first exit into an empty annotation": {
			exit:        exit("main", 1, 0, at(0)),
			want:        []v1alpha1.Exit{exit("main", 1, 0, at(0))},
			wantChanged: true,
		},
		"a later exit goes last": {
			current:     format(t, exit("main", 1, 0, at(0))),
			exit:        exit("main", 2, 1, at(30)),
			want:        []v1alpha1.Exit{exit("main", 1, 0, at(0)), exit("main", 2, 1, at(30))},
			wantChanged: true,
		},
		"the same exit again changes nothing": {
			current: format(t, exit("main", 1, 0, at(0)), exit("main", 2, 1, at(30))),
			exit:    exit("main", 2, 1, at(30)),
			want:    []v1alpha1.Exit{exit("main", 1, 0, at(0)), exit("main", 2, 1, at(30))},
		},
		"the same restart count with a sub-second finish time is the same exit": {
			current: format(t, exit("main", 2, 1, at(30))),
			exit:    exit("main", 2, 1, at(30).Add(400*time.Millisecond)),
			want:    []v1alpha1.Exit{exit("main", 2, 1, at(30))},
		},
		"an exit recorded before an agent restart, observed again: no duplicate": {
			current: format(t, exit("main", 137, 0, at(0)), exit("main", 1, 1, at(30))),
			exit:    exit("main", 137, 0, at(0)),
			want:    []v1alpha1.Exit{exit("main", 137, 0, at(0)), exit("main", 1, 1, at(30))},
		},
		"the same restart count with another finish time is another exit (restart counts began again)": {
			current:     format(t, exit("main", 1, 0, at(0))),
			exit:        exit("main", 2, 0, at(40)),
			want:        []v1alpha1.Exit{exit("main", 1, 0, at(0)), exit("main", 2, 0, at(40))},
			wantChanged: true,
		},
		"same restart count of another container is another exit": {
			current:     format(t, exit("main", 1, 0, at(0))),
			exit:        exit("sidecar", 1, 0, at(1)),
			want:        []v1alpha1.Exit{exit("main", 1, 0, at(0)), exit("sidecar", 1, 0, at(1))},
			wantChanged: true,
		},
		"unknown restart count: the finish time identifies the exit": {
			current: format(t, exit("main", 1, -1, at(0))),
			exit:    exit("main", 1, -1, at(0)),
			want:    []v1alpha1.Exit{exit("main", 1, -1, at(0))},
		},
		"unknown restart count and a different finish time is another exit": {
			current:     format(t, exit("main", 1, -1, at(0))),
			exit:        exit("main", 1, -1, at(20)),
			want:        []v1alpha1.Exit{exit("main", 1, -1, at(0)), exit("main", 1, -1, at(20))},
			wantChanged: true,
		},
		"a better informed observation fills in what was missing": {
			current:     format(t, v1alpha1.Exit{Container: "main", ExitCode: 137, RestartCount: -1, FinishedAt: at(5)}),
			exit:        v1alpha1.Exit{Container: "main", ExitCode: 137, Reason: "OOMKilled", RestartCount: 3, FinishedAt: at(5), OOM: v1alpha1.ExitOOMNode},
			want:        []v1alpha1.Exit{{Container: "main", ExitCode: 137, Reason: "OOMKilled", RestartCount: 3, FinishedAt: at(5), OOM: v1alpha1.ExitOOMNode}},
			wantChanged: true,
		},
		"a later observation never contradicts a recorded exit": {
			current: format(t, v1alpha1.Exit{Container: "main", ExitCode: 137, Reason: "OOMKilled", RestartCount: 3, FinishedAt: at(5), OOM: v1alpha1.ExitOOMLimit}),
			exit:    v1alpha1.Exit{Container: "main", ExitCode: 137, Reason: "Error", RestartCount: 3, FinishedAt: at(5), OOM: v1alpha1.ExitOOMNode},
			want:    []v1alpha1.Exit{{Container: "main", ExitCode: 137, Reason: "OOMKilled", RestartCount: 3, FinishedAt: at(5), OOM: v1alpha1.ExitOOMLimit}},
		},
		"an exit observed late is placed by finish time": {
			current:     format(t, exit("main", 1, 0, at(0)), exit("main", 3, 2, at(60))),
			exit:        exit("main", 2, 1, at(30)),
			want:        []v1alpha1.Exit{exit("main", 1, 0, at(0)), exit("main", 2, 1, at(30)), exit("main", 3, 2, at(60))},
			wantChanged: true,
		},
		"an exit without a finish time goes last": {
			current:     format(t, exit("main", 1, 0, at(60))),
			exit:        exit("main", 2, 1, time.Time{}),
			want:        []v1alpha1.Exit{exit("main", 1, 0, at(60)), exit("main", 2, 1, time.Time{})},
			wantChanged: true,
		},
		"the oldest exit is dropped beyond MaxEntries": {
			current:     format(t, exit("main", 1, 0, at(0)), exit("main", 1, 1, at(10)), exit("main", 1, 2, at(20))),
			exit:        exit("main", 1, 3, at(30)),
			want:        []v1alpha1.Exit{exit("main", 1, 1, at(10)), exit("main", 1, 2, at(20)), exit("main", 1, 3, at(30))},
			wantChanged: true,
		},
		"an exit older than a full history is dropped at once: no change": {
			current: format(t, exit("main", 1, 1, at(10)), exit("main", 1, 2, at(20)), exit("main", 1, 3, at(30))),
			exit:    exit("main", 1, 0, at(0)),
			want:    []v1alpha1.Exit{exit("main", 1, 1, at(10)), exit("main", 1, 2, at(20)), exit("main", 1, 3, at(30))},
		},
		"the oldest exits are dropped beyond MaxBytes": {
			// Each exit takes 103 bytes: five (521 bytes) fit in 530, six do not.
			current: format(t, exit("main", 1, 0, at(0)), exit("main", 1, 1, at(10)), exit("main", 1, 2, at(20)),
				exit("main", 1, 3, at(30)), exit("main", 1, 4, at(40))),
			exit: exit("main", 1, 5, at(50)),
			lim:  Limits{MaxEntries: 10, MaxBytes: 530},
			want: []v1alpha1.Exit{exit("main", 1, 1, at(10)), exit("main", 1, 2, at(20)), exit("main", 1, 3, at(30)),
				exit("main", 1, 4, at(40)), exit("main", 1, 5, at(50))},
			wantChanged: true,
		},
		"MaxBytes below MinBytes is raised to it": {
			current:     format(t, exit("main", 1, 0, at(0)), exit("main", 1, 1, at(10))),
			exit:        exit("main", 1, 2, at(20)),
			lim:         Limits{MaxEntries: 10, MaxBytes: 1},
			want:        []v1alpha1.Exit{exit("main", 1, 0, at(0)), exit("main", 1, 1, at(10)), exit("main", 1, 2, at(20))},
			wantChanged: true,
		},
		"a long reason is cut to 64 bytes without splitting a character": {
			exit:        v1alpha1.Exit{Container: "main", ExitCode: 1, Reason: strings.Repeat("a", 63) + "é" + "tail", RestartCount: 0},
			want:        []v1alpha1.Exit{{Container: "main", ExitCode: 1, Reason: strings.Repeat("a", 63), RestartCount: 0}},
			wantChanged: true,
		},
		"a malformed annotation is replaced, with an error to log": {
			current:       "main:137,main:1",
			exit:          exit("main", 1, 4, at(0)),
			want:          []v1alpha1.Exit{exit("main", 1, 4, at(0))},
			wantChanged:   true,
			wantMalformed: true,
		},
		"an entry without a container makes the annotation malformed": {
			current:       `[{"exitCode":1}]`,
			exit:          exit("main", 1, 4, at(0)),
			want:          []v1alpha1.Exit{exit("main", 1, 4, at(0))},
			wantChanged:   true,
			wantMalformed: true,
		},
		"an exit without a container is refused": {
			current: format(t, exit("main", 1, 0, at(0))),
			exit:    v1alpha1.Exit{ExitCode: 1},
			want:    []v1alpha1.Exit{exit("main", 1, 0, at(0))},
			wantErr: true,
		},
		"finish times are stored in UTC, whole seconds": {
			exit:        exit("main", 1, 0, time.Date(2026, 1, 2, 4, 4, 5, 999, time.FixedZone("CET", 3600))),
			want:        []v1alpha1.Exit{exit("main", 1, 0, t0)},
			wantChanged: true,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			l := tc.lim
			if l == (Limits{}) {
				l = lim
			}
			got, changed, err := Append(tc.current, tc.exit, l)
			switch {
			case tc.wantMalformed:
				if !errors.Is(err, v1alpha1.ErrMalformedExitHistory) {
					t.Errorf("Append() error = %v, want v1alpha1.ErrMalformedExitHistory", err)
				}
			case tc.wantErr:
				if err == nil || errors.Is(err, v1alpha1.ErrMalformedExitHistory) {
					t.Errorf("Append() error = %v, want a non-malformed error", err)
				}
				if got != tc.current {
					t.Errorf("Append() = %q, want current %q unchanged", got, tc.current)
				}
			case err != nil:
				t.Fatalf("Append() error = %v", err)
			}
			if changed != tc.wantChanged {
				t.Errorf("Append() changed = %v, want %v", changed, tc.wantChanged)
			}
			entries, err := v1alpha1.ParseExitHistory(got)
			if err != nil {
				t.Fatalf("Append() = %q, which does not parse: %v", got, err)
			}
			if diff := cmp.Diff(tc.want, entries); diff != "" {
				t.Errorf("Append() = %s; entries mismatch (-want +got):\n%s", got, diff)
			}
			if changed != (got != tc.current) && !tc.wantMalformed {
				t.Errorf("Append() changed = %v but value %q vs current %q", changed, got, tc.current)
			}
		})
	}
}

func TestAppendBoundsWithDefaults(t *testing.T) {
	s := ""
	for i := range 100 {
		var err error
		s, _, err = Append(s, v1alpha1.Exit{Container: fmt.Sprintf("container-%02d", i%7), ExitCode: int32(i), Reason: "Error", FinishedAt: at(i), RestartCount: int32(i)}, DefaultLimits)
		if err != nil {
			t.Fatal(err)
		}
		if len(s) > DefaultLimits.MaxBytes {
			t.Fatalf("after %d exits the annotation is %d bytes, over %d", i+1, len(s), DefaultLimits.MaxBytes)
		}
	}
	entries, err := v1alpha1.ParseExitHistory(s)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != DefaultLimits.MaxEntries || entries[len(entries)-1].ExitCode != 99 || entries[0].ExitCode != 90 {
		t.Errorf("kept %d exits from %d to %d, want the last %d (90 to 99)", len(entries), entries[0].ExitCode, entries[len(entries)-1].ExitCode, DefaultLimits.MaxEntries)
	}
}
