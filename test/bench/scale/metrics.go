package main

import (
	"bufio"
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
)

// writeVerbs are the verbs of apiserver_request_total that write.
var writeVerbs = map[string]bool{"POST": true, "PUT": true, "PATCH": true, "DELETE": true, "APPLY": true, "DELETECOLLECTION": true}

// writeKey names a kind of write: "PUT leases", "PATCH nodes/status".
type writeKey string

// writeCounts are the API server's write requests so far, by kind.
type writeCounts map[writeKey]float64

// scrapeWrites reads the API server's apiserver_request_total and sums its write verbs by
// verb, resource and subresource.
func scrapeWrites(ctx context.Context, cs kubernetes.Interface) (writeCounts, error) {
	all, err := scrapeRequests(ctx, cs)
	return writesOnly(all), err
}

// scrapeRequests is scrapeWrites for every verb, reads and watches too.
func scrapeRequests(ctx context.Context, cs kubernetes.Interface) (writeCounts, error) {
	body, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the API server's /metrics: %w", err)
	}
	return parseRequests(string(body))
}

// writesOnly keeps the write verbs of r.
func writesOnly[M ~map[writeKey]float64](r M) M {
	out := M{}
	for k, v := range r {
		if verb, _, _ := strings.Cut(string(k), " "); writeVerbs[verb] {
			out[k] = v
		}
	}
	return out
}

// parseRequests reads apiserver_request_total from the text exposition format, summed by
// verb, resource and subresource.
func parseRequests(text string) (writeCounts, error) {
	out := writeCounts{}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	const name = "apiserver_request_total{"
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		end := strings.LastIndexByte(line, '}')
		if end < 0 {
			return nil, fmt.Errorf("odd metric line %q", line)
		}
		labels := parseLabels(line[len(name):end])
		v, err := strconv.ParseFloat(strings.TrimSpace(line[end+1:]), 64)
		if err != nil {
			return nil, fmt.Errorf("odd metric value in %q: %w", line, err)
		}
		what := labels["resource"]
		if s := labels["subresource"]; s != "" {
			what += "/" + s
		}
		out[writeKey(labels["verb"]+" "+what)] += v
	}
	return out, sc.Err()
}

// parseLabels reads `a="x",b="y"` (values without escaped quotes, as these are).
func parseLabels(s string) map[string]string {
	out := map[string]string{}
	for s != "" {
		eq := strings.IndexByte(s, '=')
		if eq < 0 || eq+1 >= len(s) || s[eq+1] != '"' {
			break
		}
		key := s[:eq]
		rest := s[eq+2:]
		q := strings.IndexByte(rest, '"')
		if q < 0 {
			break
		}
		out[key] = rest[:q]
		s = strings.TrimPrefix(rest[q+1:], ",")
	}
	return out
}

// rates is b - a per second over d, by kind; kinds without writes are left out.
func rates(a, b writeCounts, d time.Duration) map[writeKey]float64 {
	out := map[writeKey]float64{}
	for k, v := range b {
		if r := (v - a[k]) / d.Seconds(); r > 0 {
			out[k] = r
		}
	}
	return out
}

func total(r map[writeKey]float64) float64 {
	t := 0.0
	for _, v := range r {
		t += v
	}
	return t
}

// top lists the kinds of r from the most written, "PUT leases 498.2/s".
func top(r map[writeKey]float64) []string {
	keys := make([]writeKey, 0, len(r))
	for k := range r {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return r[keys[i]] > r[keys[j]] })
	var out []string
	for _, k := range keys {
		out = append(out, fmt.Sprintf("%s %.1f/s", k, r[k]))
	}
	return out
}
