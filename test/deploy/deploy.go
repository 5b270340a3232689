// Package deploy checks what coroner ships for operators beside the kustomize base: the
// Helm chart (deploy/helm/coroner) renders the same objects as `kubectl kustomize
// deploy/base` (with jobOptIn.enabled, plus those of the namespace opt-in component,
// deploy/components/job-opt-in), and the monitoring (deploy/monitoring: ServiceMonitor,
// alert rules with their promtool unit tests, Grafana dashboard) agrees with the chart's
// copy and names only metrics that coroner's binaries define. Its tests run helm, promtool and kubectl built
// by test/tools/build.sh (`test/tools/build.sh helm promtool kubectl`); they skip when a
// tool is missing, and fail instead when CORONER_REQUIRE_DEPLOY_TOOLS=1.
//
// This file holds what test/e2e's Prometheus test uses too: where the repository and the
// tools are, and the metric names the rules and the dashboard use.
package deploy

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	agentmetrics "github.com/coroner-dev/coroner/agent/metrics"
	"github.com/coroner-dev/coroner/cri"
	shimmetrics "github.com/coroner-dev/coroner/shim/metrics"
	"github.com/coroner-dev/coroner/test/host"
)

// Paths of the monitoring files, relative to the repository's root.
const (
	RulesFile     = "deploy/monitoring/coroner.rules.yaml"
	RulesTestFile = "deploy/monitoring/coroner.rules_test.yaml"
	DashboardFile = "deploy/monitoring/coroner-dashboard.json"
	ChartDir      = "deploy/helm/coroner"
)

// Root returns the repository's root directory: the one that holds the working
// directory (a test's is its package's). Not from runtime.Caller: the Makefile builds
// with -trimpath, which leaves no absolute source paths.
func Root() string {
	root, err := host.RepoRoot()
	if err != nil {
		return "."
	}
	return root
}

// Tool returns the path of a tool test/tools/build.sh builds ($CORONER_BIN_DIR, else
// _output/bin), or an error naming the command that builds it.
func Tool(name string) (string, error) {
	dir := os.Getenv("CORONER_BIN_DIR")
	if dir == "" {
		dir = filepath.Join(Root(), "_output", "bin")
	}
	p := filepath.Join(dir, name)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("%s is not built at %s: run test/tools/build.sh %s", name, p, name)
	}
	return p, nil
}

// Rules is a Prometheus rule file.
type Rules struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert  string `json:"alert,omitempty"`
			Record string `json:"record,omitempty"`
			Expr   string `json:"expr"`
		} `json:"rules"`
	} `json:"groups"`
}

// ReadRules reads the alert rules of deploy/monitoring.
func ReadRules(root string) (*Rules, error) {
	b, err := os.ReadFile(filepath.Join(root, RulesFile))
	if err != nil {
		return nil, err
	}
	var r Rules
	if err := utilyaml.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", RulesFile, err)
	}
	if len(r.Groups) == 0 {
		return nil, fmt.Errorf("%s: no rule groups", RulesFile)
	}
	return &r, nil
}

// dashboard is the part of a Grafana dashboard that holds queries.
type dashboard struct {
	Panels []struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

// Queries returns every PromQL expression of the rules and the dashboard, each with where
// it is used ("rule CoronerAgentDown", "dashboard panel Leader").
func Queries(root string) (map[string]string, error) {
	r, err := ReadRules(root)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, g := range r.Groups {
		for _, rule := range g.Rules {
			out["rule "+rule.Alert+rule.Record] = rule.Expr
		}
	}
	b, err := os.ReadFile(filepath.Join(root, DashboardFile))
	if err != nil {
		return nil, err
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("%s: %w", DashboardFile, err)
	}
	n := 0
	for _, p := range d.Panels {
		for i, t := range p.Targets {
			if t.Expr == "" {
				return nil, fmt.Errorf("%s: panel %q target %d has no expr", DashboardFile, p.Title, i)
			}
			out[fmt.Sprintf("dashboard panel %s #%d", p.Title, i)] = t.Expr
			n++
		}
	}
	if n == 0 {
		return nil, errors.New(DashboardFile + ": no queries")
	}
	return out, nil
}

// coronerName matches coroner's metric names; selected matches any metric name written
// with a selector ("up{...}").
var (
	coronerName = regexp.MustCompile(`\bcoroner_[a-z0-9_]+\b`)
	selected    = regexp.MustCompile(`\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{`)
)

// MetricNames returns the metric names a PromQL expression uses: every coroner_* name,
// and every name written with a label selector (such as up{job="..."}). Histogram series
// keep their suffix (_bucket, _count, _sum).
func MetricNames(expr string) []string {
	var names []string
	names = append(names, coronerName.FindAllString(expr, -1)...)
	for _, m := range selected.FindAllStringSubmatch(expr, -1) {
		names = append(names, m[1])
	}
	sort.Strings(names)
	return slices.Compact(names)
}

// UsedMetrics returns every metric name the rules and the dashboard use, each with the
// places that use it.
func UsedMetrics(root string) (map[string][]string, error) {
	qs, err := Queries(root)
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	for where, expr := range qs {
		for _, n := range MetricNames(expr) {
			out[n] = append(out[n], where)
		}
	}
	for n := range out {
		sort.Strings(out[n])
	}
	return out, nil
}

// Defined holds the metric names coroner's binaries serve (besides the Go and process
// collectors' go_* and process_*), as Prometheus stores them: a histogram as its _bucket,
// _count and _sum series.
type Defined struct {
	// All is every name the agent's and the shim's metrics packages register.
	All map[string]bool
	// AtStart are the names served before anything happened: plain counters and gauges.
	// The others (labelled counters and histograms) appear with their first observation.
	AtStart map[string]bool
}

// fqName reads a metric's name out of its Desc (Desc has no accessor for it).
var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

// DefinedMetrics registers the agent's and the shim's metrics on fresh registries and
// lists their names, with those of the agent's runtime watcher (package cri). The shim's Job metrics are listed as the leader serves them.
func DefinedMetrics() (*Defined, error) {
	d := &Defined{All: map[string]bool{}, AtStart: map[string]bool{}}
	agentReg, shimReg := prometheus.NewRegistry(), prometheus.NewRegistry()
	am, sm := agentmetrics.New(agentReg), shimmetrics.New(shimReg)
	for _, m := range []any{am, sm} {
		v := reflect.ValueOf(m).Elem()
		for i := range v.NumField() {
			f := v.Field(i)
			if !f.CanInterface() {
				continue // unexported
			}
			c, ok := f.Interface().(prometheus.Collector)
			if !ok {
				continue
			}
			ch := make(chan *prometheus.Desc, 4)
			go func() {
				c.Describe(ch)
				close(ch)
			}()
			for desc := range ch {
				match := fqName.FindStringSubmatch(desc.String())
				if match == nil {
					return nil, fmt.Errorf("no name in %s", desc)
				}
				switch c.(type) {
				case prometheus.Histogram, *prometheus.HistogramVec:
					for _, s := range []string{"_bucket", "_count", "_sum"} {
						d.All[match[1]+s] = true
					}
				default:
					d.All[match[1]] = true
				}
			}
		}
	}
	for _, reg := range []*prometheus.Registry{agentReg, shimReg} {
		mfs, err := reg.Gather()
		if err != nil {
			return nil, err
		}
		for _, mf := range mfs {
			if !d.All[mf.GetName()] {
				return nil, fmt.Errorf("%s is served but was not found among the metrics' fields", mf.GetName())
			}
			d.AtStart[mf.GetName()] = true
		}
	}
	// The agent's container runtime watcher (cri.Watcher.Collector): its descriptions only,
	// so a zero Watcher does. runtime_info is served while the runtime is connected.
	ch := make(chan *prometheus.Desc, 8)
	go func() {
		new(cri.Watcher).Collector(agentmetrics.Namespace, agentmetrics.Subsystem).Describe(ch)
		close(ch)
	}()
	for desc := range ch {
		match := fqName.FindStringSubmatch(desc.String())
		if match == nil {
			return nil, fmt.Errorf("no name in %s", desc)
		}
		d.All[match[1]] = true
		d.AtStart[match[1]] = !strings.HasSuffix(match[1], "_runtime_info")
	}
	if len(d.All) == 0 || len(d.AtStart) == 0 {
		return nil, errors.New("no metrics found")
	}
	return d, nil
}
