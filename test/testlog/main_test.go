package main

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"testing"
)

// testdata/fail.json is what `go test -json -v` (Go 1.26) printed for a toy package whose
// TestMain writes to stderr, with a parallel subtest that fails (TestA/x), one that passes
// (TestA/y) and a passing TestB; its source is in the comment of TestSummary.
func TestSummary(t *testing.T) {
	// package tj
	// func TestMain(m *testing.M){ fmt.Fprintln(os.Stderr,"main says hi"); c:=m.Run(); fmt.Fprintln(os.Stderr,"main end"); os.Exit(c)}
	// func TestA(t *testing.T){ t.Run("x", func(t *testing.T){t.Parallel(); t.Log("hello x"); t.Error("bad x")}); t.Run("y", func(t *testing.T){t.Parallel(); t.Log("hello y")})}
	// func TestB(t *testing.T){ t.Log("b ok")}
	sample, err := os.ReadFile("testdata/fail.json")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(strings.TrimSpace(string(sample)), "\n")
	for _, tc := range []struct {
		name     string
		in       string
		failed   bool
		want     []string // in the output, in this order
		dontWant []string // not in the summary
	}{{
		name:   "a failed subtest is said again at the end",
		in:     string(sample),
		failed: true,
		want: []string{"main says hi", "bad x", "main end\n", "\ntestlog: 2 failed test(s) in tj",
			"--- FAIL: TestA (its subtests failed)", "--- FAIL: TestA/x\n    a_test.go:4: hello x\n    a_test.go:4: bad x\n",
			"\nFAIL\ttj\t0.002s\n"},
		dontWant: []string{"hello y", "b ok", "=== CONT"},
	}, {
		name:   "cut off before the package's result",
		in:     strings.Join(lines[:len(lines)-6], ""),
		failed: true,
		want:   []string{"testlog: tj ended without a result"},
	}, {
		name: "only passes",
		in: `{"Action":"start","Package":"p"}
{"Action":"output","Package":"p","Test":"TestB","Output":"    b_test.go:5: b ok\n"}
{"Action":"pass","Package":"p","Test":"TestB"}
{"Action":"output","Package":"p","Output":"ok  \tp\t0.1s\n"}
{"Action":"pass","Package":"p"}
`,
		want:     []string{"b ok", "ok  \tp\t0.1s\n"},
		dontWant: []string{"testlog:"},
	}, {
		// What `go test -json ./test/e2e/` printed (Go 1.26) once the directory had lost its
		// files: the reason comes as build output.
		name: "a package that does not load says why",
		in: `{"ImportPath":"./test/e2e","Action":"build-output","Output":"# ./test/e2e\n"}
{"ImportPath":"./test/e2e","Action":"build-output","Output":"no Go files in /tmp/ccA/test/e2e\n"}
{"ImportPath":"./test/e2e","Action":"build-fail"}
{"Time":"2026-11-24T16:34:07.58419998Z","Action":"start","Package":"./test/e2e"}
{"Time":"2026-11-24T16:34:07.584335964Z","Action":"output","Package":"./test/e2e","Output":"FAIL\t./test/e2e [setup failed]\n"}
{"Time":"2026-11-24T16:34:07.584340829Z","Action":"fail","Package":"./test/e2e","Elapsed":0,"FailedBuild":"./test/e2e"}
`,
		failed: true,
		want:   []string{"no Go files in /tmp/ccA/test/e2e\n", "FAIL\t./test/e2e [setup failed]"},
	}, {
		name: "a build error is not JSON and passes through",
		in: `# example.com/p
./p.go:3:1: syntax error
{"Action":"start","Package":"p"}
{"Action":"output","Package":"p","Output":"FAIL\tp [build failed]\n"}
{"Action":"fail","Package":"p"}
`,
		failed: true,
		want:   []string{"./p.go:3:1: syntax error\n", "FAIL\tp [build failed]"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLog()
			var out bytes.Buffer
			if err := l.read(strings.NewReader(tc.in), &out); err != nil {
				t.Fatal(err)
			}
			if err := l.end(&out); err != nil {
				t.Fatal(err)
			}
			got := out.String()
			if l.failedAny() != tc.failed {
				t.Errorf("failed %v, want %v", l.failedAny(), tc.failed)
			}
			rest := got
			for _, w := range tc.want {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Fatalf("output lacks %q (in order); output:\n%s", w, got)
				}
				rest = rest[i+len(w):]
			}
			summary := ""
			if i := strings.Index(got, "\ntestlog:"); i >= 0 {
				summary = got[i:]
			}
			for _, d := range tc.dontWant {
				if strings.Contains(summary, d) {
					t.Errorf("summary has %q:\n%s", d, summary)
				}
			}
		})
	}
}

// A test that talks for long shows only its last keepLines lines, and says how many came
// before.
func TestSummaryKeepsTheEnd(t *testing.T) {
	var in strings.Builder
	in.WriteString(`{"Action":"start","Package":"p"}` + "\n")
	n := 5*keepLines + 7
	for i := range n {
		in.WriteString(`{"Action":"output","Package":"p","Test":"TestLong","Output":"    line ` + strconv.Itoa(i) + `\n"}` + "\n")
	}
	in.WriteString(`{"Action":"fail","Package":"p","Test":"TestLong"}` + "\n" + `{"Action":"fail","Package":"p"}` + "\n")
	l := newLog()
	var out bytes.Buffer
	if err := l.read(strings.NewReader(in.String()), &out); err != nil {
		t.Fatal(err)
	}
	if err := l.end(&out); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	i := strings.Index(got, "\ntestlog:")
	if i < 0 {
		t.Fatalf("no summary in %d bytes of output", len(got))
	}
	got = got[i:]
	for _, w := range []string{"(" + strconv.Itoa(n-keepLines) + " earlier lines: see above)", "line " + strconv.Itoa(n-keepLines) + "\n", "line " + strconv.Itoa(n-1) + "\n"} {
		if !strings.Contains(got, w) {
			t.Errorf("summary lacks %q:\n%s", w, got)
		}
	}
	if strings.Contains(got, "line "+strconv.Itoa(n-keepLines-1)+"\n") {
		t.Errorf("summary keeps more than %d lines:\n%s", keepLines, got)
	}
}
