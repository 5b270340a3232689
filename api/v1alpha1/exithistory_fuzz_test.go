package v1alpha1

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func FuzzParseExitHistory(f *testing.F) {
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
		entries, err := ParseExitHistory(in)
		if err != nil {
			if !errors.Is(err, ErrMalformedExitHistory) {
				t.Fatalf("ParseExitHistory(%q) error %v does not wrap ErrMalformedExitHistory", in, err)
			}
		} else {
			// What parses formats, and parses back to the same.
			s, err := FormatExitHistory(entries)
			if err != nil {
				t.Fatalf("ParseExitHistory(%q) = %+v, which does not format: %v", in, entries, err)
			}
			again, err := ParseExitHistory(s)
			if err != nil {
				t.Fatalf("FormatExitHistory() = %q, which does not parse: %v", s, err)
			}
			if len(entries) == 0 && len(again) == 0 {
				entries, again = nil, nil
			}
			if diff := cmp.Diff(entries, again); diff != "" {
				t.Fatalf("round trip of %q through %q differs (-first +second):\n%s", in, s, diff)
			}
		}
	})
}
