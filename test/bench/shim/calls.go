package main

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
)

// callKey is what the calls are counted by: the HTTP method, as client-go's "method"
// label has it, and the response's status code ("<error>" when there was none).
type callKey struct{ method, code string }

// calls counts API requests by method and code.
type calls map[callKey]int64

func (c calls) sub(o calls) calls {
	d := calls{}
	for k, v := range c {
		if n := v - o[k]; n != 0 {
			d[k] = n
		}
	}
	for k, v := range o {
		if _, ok := c[k]; !ok {
			d[k] = -v
		}
	}
	return d
}

func (c calls) total() int64 {
	var n int64
	for _, v := range c {
		n += v
	}
	return n
}

// method counts the calls with one of the methods.
func (c calls) method(methods ...string) int64 {
	var n int64
	for k, v := range c {
		for _, m := range methods {
			if k.method == m {
				n += v
			}
		}
	}
	return n
}

// jobRecordPrefix marks the methods of coroner's JobRecord calls (counted in total, not
// under their plain method).
const jobRecordPrefix = "JOBRECORD "

// jobRecords counts coroner's JobRecord calls.
func (c calls) jobRecords() int64 {
	var n int64
	for k, v := range c {
		if strings.HasPrefix(k.method, jobRecordPrefix) {
			n += v
		}
	}
	return n
}

// code counts the calls answered with the status code.
func (c calls) code(code string) int64 {
	var n int64
	for k, v := range c {
		if k.code == code {
			n += v
		}
	}
	return n
}

// callCounter counts the requests of coroner's in-process controller: it wraps the
// transport of the controller's client (rest.Config.Wrap), so every HTTP attempt is
// counted once, watches and retries included, as client-go's rest_client_requests_total
// and rest_client_request_retries_total together count them.
type callCounter struct {
	mu sync.Mutex
	c  calls
}

func newCallCounter() *callCounter { return &callCounter{c: calls{}} }

func (cc *callCounter) wrap(rt http.RoundTripper) http.RoundTripper {
	return countingTransport{rt: rt, cc: cc}
}

func (cc *callCounter) snapshot(context.Context) (calls, error) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	s := calls{}
	for k, v := range cc.c {
		s[k] = v
	}
	return s, nil
}

type countingTransport struct {
	rt http.RoundTripper
	cc *callCounter
}

func (t countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.rt.RoundTrip(req)
	code := "<error>"
	if err == nil {
		code = strconv.Itoa(resp.StatusCode)
	}
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	if strings.Contains(req.URL.Path, "/jobrecords") {
		method = jobRecordPrefix + method // the record's cost, apart from the Job sync's
	}
	t.cc.mu.Lock()
	t.cc.c[callKey{method, code}]++
	t.cc.mu.Unlock()
	return resp, err
}

// parseRequestMetrics sums the samples of the named counters of a Prometheus text
// exposition by their method and code labels.
func parseRequestMetrics(body string, names ...string) (calls, map[string]bool, error) {
	c := calls{}
	found := map[string]bool{}
	for line := range strings.Lines(body) {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		brace := strings.IndexByte(line, '{')
		if brace < 0 {
			continue
		}
		name := line[:brace]
		want := false
		for _, n := range names {
			want = want || n == name
		}
		if !want {
			continue
		}
		end := strings.LastIndexByte(line, '}')
		if end < brace {
			return nil, nil, fmt.Errorf("bad sample %q", line)
		}
		labels, err := parseLabels(line[brace+1 : end])
		if err != nil {
			return nil, nil, fmt.Errorf("bad sample %q: %w", line, err)
		}
		fields := strings.Fields(line[end+1:])
		if len(fields) == 0 {
			return nil, nil, fmt.Errorf("bad sample %q: no value", line)
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return nil, nil, fmt.Errorf("bad sample %q: %w", line, err)
		}
		found[name] = true
		c[callKey{method: labels["method"], code: labels["code"]}] += int64(v)
	}
	return c, found, nil
}

// parseLabels parses `a="x",b="y"` with the text format's escapes.
func parseLabels(s string) (map[string]string, error) {
	labels := map[string]string{}
	for s = strings.TrimSpace(s); s != ""; {
		eq := strings.IndexByte(s, '=')
		if eq < 0 || len(s) < eq+2 || s[eq+1] != '"' {
			return nil, fmt.Errorf("bad labels at %q", s)
		}
		name := strings.TrimSpace(s[:eq])
		var val strings.Builder
		i := eq + 2
		for ; i < len(s) && s[i] != '"'; i++ {
			if s[i] == '\\' && i+1 < len(s) {
				i++
				switch s[i] {
				case 'n':
					val.WriteByte('\n')
				default:
					val.WriteByte(s[i])
				}
				continue
			}
			val.WriteByte(s[i])
		}
		if i >= len(s) {
			return nil, fmt.Errorf("unterminated label value at %q", s)
		}
		labels[name] = val.String()
		s = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(s[i+1:]), ","))
	}
	return labels, nil
}
