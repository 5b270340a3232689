package v1alpha1

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var exitT0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func formatExits(t *testing.T, entries ...Exit) string {
	t.Helper()
	s, err := FormatExitHistory(entries)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestFormatExitHistoryIsCompactAndStable(t *testing.T) {
	got := formatExits(t,
		Exit{Container: "main", ExitCode: 137, Reason: "OOMKilled", FinishedAt: exitT0, RestartCount: 2, OOM: ExitOOMLimit},
		Exit{Container: "side", ExitCode: 1, RestartCount: -1},
	)
	want := `[{"container":"main","exitCode":137,"reason":"OOMKilled","finishedAt":"2026-01-02T03:04:05Z","restartCount":2,"oom":"limit"},` +
		`{"container":"side","exitCode":1}]`
	if got != want {
		t.Errorf("FormatExitHistory() =\n%s\nwant\n%s", got, want)
	}
	if got := formatExits(t); got != "[]" {
		t.Errorf("FormatExitHistory(nil) = %q, want []", got)
	}
}

func TestParseExitHistory(t *testing.T) {
	cases := map[string]struct {
		in        string
		want      []Exit
		malformed bool
	}{
		"empty is no history":        {in: "", want: nil},
		"blank is no history":        {in: "  ", want: nil},
		"empty array":                {in: "[]", want: []Exit{}},
		"restart count 0 is kept":    {in: `[{"container":"a","exitCode":1,"restartCount":0}]`, want: []Exit{{Container: "a", ExitCode: 1, RestartCount: 0}}},
		"missing restart count":      {in: `[{"container":"a","exitCode":1}]`, want: []Exit{{Container: "a", ExitCode: 1, RestartCount: -1}}},
		"unknown fields are ignored": {in: `[{"container":"a","exitCode":3,"signal":9,"finishedAt":"2026-01-02T03:04:05Z"}]`, want: []Exit{{Container: "a", ExitCode: 3, FinishedAt: exitT0, RestartCount: -1}}},
		"all fields": {
			in:   `[{"container":"main","exitCode":137,"reason":"OOMKilled","finishedAt":"2026-01-02T03:04:05Z","restartCount":2,"oom":"node"}]`,
			want: []Exit{{Container: "main", ExitCode: 137, Reason: "OOMKilled", FinishedAt: exitT0, RestartCount: 2, OOM: ExitOOMNode}},
		},
		"not JSON":                    {in: "main:137", malformed: true},
		"an object, not an array":     {in: `{"container":"a"}`, malformed: true},
		"null":                        {in: "null", malformed: true},
		"entry without container":     {in: `[{"exitCode":1}]`, malformed: true},
		"exit code of the wrong type": {in: `[{"container":"a","exitCode":"1"}]`, malformed: true},
		"exit code out of range":      {in: `[{"container":"a","exitCode":4294967296}]`, malformed: true},
		"negative restart count":      {in: `[{"container":"a","exitCode":1,"restartCount":-2}]`, malformed: true},
		"bad time":                    {in: `[{"container":"a","exitCode":1,"finishedAt":"yesterday"}]`, malformed: true},
		"truncated":                   {in: `[{"container":"a","exitCode":1}`, malformed: true},
		"trailing garbage":            {in: `[] x`, malformed: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := ParseExitHistory(tc.in)
			if tc.malformed {
				if !errors.Is(err, ErrMalformedExitHistory) {
					t.Fatalf("ParseExitHistory(%q) error = %v, want ErrMalformedExitHistory", tc.in, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseExitHistory(%q) error = %v", tc.in, err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("ParseExitHistory(%q) mismatch (-want +got):\n%s", tc.in, diff)
			}
		})
	}
}
