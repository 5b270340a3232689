// Command testlog reads `go test -json` on standard input, prints the usual verbose
// output as it comes, and, when a package ends with failed tests, prints again, test by
// test, what each failed test said, just before the package's closing "FAIL <package>"
// line. A long suite of parallel tests (the e2e suite runs for minutes with 8 at once)
// interleaves its tests' lines, and a CI log shows only the lines before that closing
// line: the summary puts the reason of a failure there.
//
//	go test -json -v ./test/e2e/ 2>&1 | go run ./test/testlog
//
// It exits 1 if a test or a package failed or did not build (or the input ended without a
// package's result), 0 otherwise. Build output (JSON since Go 1.24) and lines that are not
// JSON pass through unchanged.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
)

// event is the part of test2json's TestEvent that testlog reads.
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

// keepLines is how many of its last lines a failed test shows in the summary.
const keepLines = 80

type testKey struct{ pkg, test string }

type log struct {
	lines   map[testKey][]string
	dropped map[testKey]int // lines no longer kept
	failed  map[string][]testKey
	// closing holds a package's last line ("FAIL\tpkg\t12.3s", "ok  \tpkg ...") until
	// its result, so that the summary goes before it.
	closing map[string]string
	started map[string]bool // packages with a start and no result yet
	anyFail bool
}

func main() {
	l := newLog()
	err := l.read(os.Stdin, os.Stdout)
	if err == nil {
		err = l.end(os.Stdout)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "testlog:", err)
		os.Exit(2)
	}
	if l.failedAny() {
		os.Exit(1)
	}
}

func newLog() *log {
	return &log{lines: map[testKey][]string{}, dropped: map[testKey]int{}, failed: map[string][]testKey{},
		closing: map[string]string{}, started: map[string]bool{}}
}

// failedAny reports whether a test or package failed, or a package never ended.
func (l *log) failedAny() bool {
	return l.anyFail || len(l.started) > 0
}

// output writes to w and keeps the first error: after a failed write nothing more is
// written, and read or end returns the error (testlog's output is all it is for).
type output struct {
	w   io.Writer
	err error
}

func (o *output) print(s string) {
	if o.err == nil {
		_, o.err = io.WriteString(o.w, s)
	}
}

func (o *output) printf(format string, args ...any) {
	if o.err == nil {
		_, o.err = fmt.Fprintf(o.w, format, args...)
	}
}

// read copies the input to w as it comes; it stops at the first failed write.
func (l *log) read(r io.Reader, w io.Writer) error {
	out := &output{w: w}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 16*1024*1024)
	for sc.Scan() {
		line := sc.Bytes()
		var ev event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &ev) != nil {
			out.printf("%s\n", line)
		} else {
			l.add(ev, out)
		}
		if out.err != nil {
			return fmt.Errorf("writing the output: %w", out.err)
		}
	}
	return sc.Err()
}

func (l *log) add(ev event, w *output) {
	switch ev.Action {
	case "build-output":
		// Why a package did not build or load ("no Go files in ..."); go test's own
		// line says only "[setup failed]".
		w.print(ev.Output)
	case "build-fail":
		l.anyFail = true
	case "start":
		l.started[ev.Package] = true
	case "output":
		if ev.Test == "" && closingLine(ev.Package, ev.Output) {
			l.closing[ev.Package] += ev.Output
			return
		}
		w.print(ev.Output)
		if ev.Test != "" && !framing(ev.Output) {
			k := testKey{ev.Package, ev.Test}
			l.lines[k] = append(l.lines[k], strings.TrimRight(ev.Output, "\n"))
			if n := len(l.lines[k]); n > 4*keepLines {
				l.lines[k] = append([]string(nil), l.lines[k][n-keepLines:]...)
				l.dropped[k] += n - keepLines
			}
		}
	case "fail", "pass", "skip":
		if ev.Action == "fail" {
			l.anyFail = true
		}
		if ev.Test != "" {
			if ev.Action == "fail" {
				l.failed[ev.Package] = append(l.failed[ev.Package], testKey{ev.Package, ev.Test})
			}
			return
		}
		delete(l.started, ev.Package)
		l.summary(w, ev.Package)
		w.print(l.closing[ev.Package])
		delete(l.closing, ev.Package)
	}
}

// closingLine reports whether out is go test's last line for the package.
func closingLine(pkg, out string) bool {
	for _, p := range []string{"FAIL\t", "ok  \t"} {
		if strings.HasPrefix(out, p+pkg+"\t") || strings.HasPrefix(out, p+pkg+" ") {
			return true
		}
	}
	return false
}

// framing reports whether a line is go test's own bookkeeping, not a test's words.
func framing(s string) bool {
	t := strings.TrimLeft(s, " ")
	for _, p := range []string{"=== RUN", "=== PAUSE", "=== CONT", "=== NAME", "--- PASS", "--- FAIL", "--- SKIP"} {
		if strings.HasPrefix(t, p) {
			return true
		}
	}
	return false
}

// end finishes the output at the end of the input: the packages that never ended.
func (l *log) end(w io.Writer) error {
	out := &output{w: w}
	for pkg := range l.started {
		out.printf("\ntestlog: %s ended without a result (killed, or a timeout's panic above)\n", pkg)
		l.summary(out, pkg)
		out.print(l.closing[pkg])
	}
	if out.err != nil {
		return fmt.Errorf("writing the output: %w", out.err)
	}
	return nil
}

// summary says again what the package's failed tests said.
func (l *log) summary(w *output, pkg string) {
	failed := l.failed[pkg]
	if len(failed) == 0 {
		return
	}
	w.printf("\ntestlog: %d failed test(s) in %s; what each said:\n", len(failed), pkg)
	var said []testKey
	for _, k := range failed {
		if len(l.lines[k]) == 0 {
			w.printf("--- FAIL: %s (its subtests failed)\n", k.test)
		} else {
			said = append(said, k)
		}
	}
	for _, k := range said {
		lines := l.lines[k]
		w.printf("--- FAIL: %s\n", k.test)
		dropped := l.dropped[k]
		if len(lines) > keepLines {
			dropped += len(lines) - keepLines
			lines = lines[len(lines)-keepLines:]
		}
		if dropped > 0 {
			w.printf("    (%d earlier lines: see above)\n", dropped)
		}
		for _, s := range lines {
			w.print(s + "\n")
		}
	}
	w.print("\n")
}
