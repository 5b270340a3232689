package exithistory

import (
	"errors"
	"testing"

	"github.com/coroner-dev/coroner/api/v1alpha1"
)

func FuzzAppend(f *testing.F) {
	for _, s := range []string{
		"", "[]", "null", "{}", "[{}]", `[{"container":"a"}]`,
		`[{"container":"main","exitCode":137,"reason":"OOMKilled","finishedAt":"2026-01-02T03:04:05Z","restartCount":2,"oom":"limit"}]`,
		`[{"container":"a","exitCode":1,"restartCount":-1}]`,
		`[{"container":"a","finishedAt":"9999-12-31T23:59:59-23:59"}]`,
		`[{"container":"a","finishedAt":"0000-01-01T00:00:00+01:00"}]`,
		`[{"container":"\u0000","reason":"\xff"}]`, "[1]", `["a"]`, "[", "main:137",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		// Whatever the annotation holds, Append gives a bounded, parseable
		// value that holds the new exit, and appending it again is no change.
		e := v1alpha1.Exit{Container: "main", ExitCode: 137, Reason: "OOMKilled", RestartCount: 99}
		lim := Limits{MaxEntries: 3, MaxBytes: 600}
		v, _, err := Append(in, e, lim)
		if err != nil && !errors.Is(err, v1alpha1.ErrMalformedExitHistory) {
			t.Fatalf("Append(%q) error = %v", in, err)
		}
		got, err := v1alpha1.ParseExitHistory(v)
		if err != nil {
			t.Fatalf("Append(%q) = %q, which does not parse: %v", in, v, err)
		}
		if len(got) == 0 || len(got) > lim.MaxEntries {
			t.Fatalf("Append(%q) = %q: %d entries, want 1 to %d", in, v, len(got), lim.MaxEntries)
		}
		if len(got) > 1 && len(v) > lim.MaxBytes {
			t.Fatalf("Append(%q) = %q: %d bytes, over %d", in, v, len(v), lim.MaxBytes)
		}
		v2, changed, err := Append(v, e, lim)
		if err != nil || changed || v2 != v {
			t.Fatalf("Append(Append(%q)) = %q, %v, %v; want no change from %q", in, v2, changed, err, v)
		}
	})
}
