// Command testlog reads `go test -json` on standard input, prints the usual verbose
// output as it comes, and at the end prints again, test by test, what each failed test
// said. A long suite of parallel tests (the e2e suite runs for minutes with 8 at once)
// interleaves its tests' lines, and a CI log shows only its tail: the summary puts the
// reason of a failure where the tail is read.
//
//	go test -json -v ./test/e2e/ 2>&1 | go run ./test/testlog
//
// It exits 1 if a test or a package failed (or the input ended without a package's
// result), 0 otherwise. Lines that are not JSON (a build error) pass through unchanged.
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
	failed  []testKey
	started map[string]bool // packages with a start and no result yet
	pkgFail bool
}

func main() {
	l := newLog()
	if err := l.read(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "testlog:", err)
		os.Exit(2)
	}
	l.summary(os.Stdout)
	if l.failedAny() {
		os.Exit(1)
	}
}

// failedAny reports whether a test or package failed, or a package never ended.
func (l *log) failedAny() bool {
	return l.pkgFail || len(l.failed) > 0 || len(l.started) > 0
}

func newLog() *log {
	return &log{lines: map[testKey][]string{}, dropped: map[testKey]int{}, started: map[string]bool{}}
}

func (l *log) read(r io.Reader, w io.Writer) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 16*1024*1024)
	for sc.Scan() {
		line := sc.Bytes()
		var ev event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &ev) != nil {
			fmt.Fprintf(w, "%s\n", line)
			continue
		}
		l.add(ev, w)
	}
	return sc.Err()
}

func (l *log) add(ev event, w io.Writer) {
	switch ev.Action {
	case "start":
		l.started[ev.Package] = true
	case "output":
		io.WriteString(w, ev.Output)
		if ev.Test != "" && !framing(ev.Output) {
			k := testKey{ev.Package, ev.Test}
			l.lines[k] = append(l.lines[k], strings.TrimRight(ev.Output, "\n"))
			if n := len(l.lines[k]); n > 4*keepLines {
				l.lines[k] = append([]string(nil), l.lines[k][n-keepLines:]...)
				l.dropped[k] += n - keepLines
			}
		}
	case "fail":
		if ev.Test == "" {
			l.pkgFail = true
			delete(l.started, ev.Package)
		} else {
			l.failed = append(l.failed, testKey{ev.Package, ev.Test})
		}
	case "pass", "skip":
		if ev.Test == "" {
			delete(l.started, ev.Package)
		}
	}
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

func (l *log) summary(w io.Writer) {
	for pkg := range l.started {
		fmt.Fprintf(w, "\ntestlog: %s ended without a result (killed, or a timeout's panic above)\n", pkg)
	}
	var said []testKey
	for _, k := range l.failed {
		if len(l.lines[k]) > 0 {
			said = append(said, k)
		}
	}
	if len(l.failed) == 0 {
		return
	}
	fmt.Fprintf(w, "\ntestlog: %d failed test(s); what each said:\n", len(l.failed))
	for _, k := range l.failed {
		if len(l.lines[k]) == 0 {
			fmt.Fprintf(w, "--- FAIL: %s (its subtests failed)\n", k.test)
		}
	}
	for _, k := range said {
		lines := l.lines[k]
		fmt.Fprintf(w, "--- FAIL: %s\n", k.test)
		if len(lines) > keepLines {
			l.dropped[k] += len(lines) - keepLines
			lines = lines[len(lines)-keepLines:]
		}
		if d := l.dropped[k]; d > 0 {
			fmt.Fprintf(w, "    (%d earlier lines: see above)\n", d)
		}
		for _, s := range lines {
			fmt.Fprintln(w, s)
		}
	}
}
