package lab

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// progress prints Up's and Down's steps: a numbered title, indented details, and how long
// the step took; it keeps the timings for the summary.
type progress struct {
	w       io.Writer
	began   time.Time
	n       int
	total   int
	timings []Timing
}

func newProgress(w io.Writer, total int) *progress {
	return &progress{w: w, began: time.Now(), total: total}
}

// step runs f as the next step.
func (p *progress) step(title string, f func() error) error {
	p.n++
	fmt.Fprintf(p.w, "==> %d/%d %s\n", p.n, p.total, title)
	start := time.Now()
	err := f()
	d := time.Since(start)
	name := title
	if i := strings.IndexAny(name, ":("); i > 0 {
		name = strings.TrimSpace(name[:i])
	}
	p.timings = append(p.timings, Timing{Step: name, Seconds: d.Round(10 * time.Millisecond).Seconds()})
	if err != nil {
		fmt.Fprintf(p.w, "    FAILED after %s\n", seconds(d))
		return err
	}
	fmt.Fprintf(p.w, "    ok in %s\n", seconds(d))
	return nil
}

// say prints an indented detail line.
func (p *progress) say(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if msg == "" {
		fmt.Fprintln(p.w)
		return
	}
	fmt.Fprintf(p.w, "    %s\n", indentLines(msg, "    "))
}

func (p *progress) elapsed() time.Duration { return time.Since(p.began) }

func seconds(d time.Duration) string {
	return fmt.Sprintf("%.1fs", d.Seconds())
}

// indentLines indents every line after the first one.
func indentLines(s, indent string) string {
	s = strings.TrimRight(s, "\n")
	return strings.ReplaceAll(s, "\n", "\n"+indent)
}

// lineWriter is an io.Writer that prints every complete line through say.
type lineWriter struct {
	say func(string, ...any)
	buf []byte
}

func (l *lineWriter) Write(b []byte) (int, error) {
	l.buf = append(l.buf, b...)
	for {
		i := strings.IndexByte(string(l.buf), '\n')
		if i < 0 {
			return len(b), nil
		}
		l.say("%s", string(l.buf[:i]))
		l.buf = l.buf[i+1:]
	}
}

func (l *lineWriter) flush() {
	if len(l.buf) > 0 {
		l.say("%s", string(l.buf))
		l.buf = nil
	}
}
