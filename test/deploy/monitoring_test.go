package deploy

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// TestPromtoolRules runs `promtool check rules` and the rules' unit tests
// (`promtool test rules`: each alert fires after its "for" where it should, and stays
// quiet in the normal case beside it).
func TestPromtoolRules(t *testing.T) {
	out := run(t, "promtool", "check", "rules", RulesFile)
	t.Logf("%s", out)
	out = run(t, "promtool", "test", "rules", RulesTestFile)
	if !strings.Contains(string(out), "SUCCESS") {
		t.Errorf("promtool test rules: %s", out)
	}
}

// TestRulesTested checks that every alert is named by at least one unit test that
// expects it to fire.
func TestRulesTested(t *testing.T) {
	r, err := ReadRules(Root())
	if err != nil {
		t.Fatal(err)
	}
	var tests struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string `json:"alertname"`
				ExpAlerts []any  `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	if err := utilyaml.Unmarshal(readFile(t, RulesTestFile), &tests); err != nil {
		t.Fatal(err)
	}
	fires := map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			}
		}
	}
	for _, g := range r.Groups {
		for _, rule := range g.Rules {
			if rule.Alert != "" && !fires[rule.Alert] {
				t.Errorf("no test in %s expects %s to fire", RulesTestFile, rule.Alert)
			}
		}
	}
}

// TestDashboardQueries checks that every query of the dashboard is valid PromQL: promtool
// checks them as the expressions of recording rules.
func TestDashboardQueries(t *testing.T) {
	qs, err := Queries(Root())
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	b.WriteString("groups:\n- name: dashboard\n  rules:\n")
	n := 0
	for where, expr := range qs {
		if !strings.HasPrefix(where, "dashboard ") {
			continue
		}
		n++
		fmt.Fprintf(&b, "  - record: dashboard:query_%d\n    expr: %q\n", n, expr)
	}
	f := filepath.Join(t.TempDir(), "dashboard.rules.yaml")
	if err := os.WriteFile(f, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	out := run(t, "promtool", "check", "rules", f)
	if want := fmt.Sprintf("SUCCESS: %d rules found", n); !strings.Contains(string(out), want) {
		t.Errorf("promtool check rules on the dashboard's %d queries: %s", n, out)
	}
}

// TestUsedMetricsDefined checks that every metric the rules and the dashboard use is one
// coroner-agent or coroner-shim serves (or Prometheus's own up), and that each metric they
// serve has a panel or a rule.
func TestUsedMetricsDefined(t *testing.T) {
	used, err := UsedMetrics(Root())
	if err != nil {
		t.Fatal(err)
	}
	defined, err := DefinedMetrics()
	if err != nil {
		t.Fatal(err)
	}
	for name, where := range used {
		if name != "up" && !defined.All[name] {
			t.Errorf("%s (used by %s) is not a metric of agent/metrics or shim/metrics", name, strings.Join(where, ", "))
		}
	}
	for name := range defined.All {
		if strings.HasSuffix(name, "_sum") || strings.HasSuffix(name, "_count") && defined.All[strings.TrimSuffix(name, "_count")+"_bucket"] {
			continue // histograms: their _bucket series is enough
		}
		if used[name] == nil {
			t.Errorf("%s has neither a dashboard panel nor a rule", name)
		}
	}
	if !slices.Contains(used["coroner_leader"], "rule CoronerNoShimLeader") {
		t.Errorf("CoronerNoShimLeader does not use coroner_leader: %v", used["coroner_leader"])
	}
}

// TestMonitoringCopies checks that deploy/monitoring and the chart's monitoring agree: the
// PrometheusRule's spec is the rule file, the chart's copies of the rules and dashboard are
// the same, and the chart (monitoring on) renders the objects of `kubectl kustomize
// deploy/monitoring`.
func TestMonitoringCopies(t *testing.T) {
	for _, f := range []string{"coroner.rules.yaml", "coroner-dashboard.json"} {
		a, b := readFile(t, "deploy/monitoring/"+f), readFile(t, ChartDir+"/files/"+f)
		if !bytes.Equal(a, b) {
			t.Errorf("%s/files/%s differs from deploy/monitoring/%s: cp deploy/monitoring/%[2]s %[1]s/files/", ChartDir, f, f)
		}
	}
	var rules map[string]any
	if err := utilyaml.Unmarshal(readFile(t, RulesFile), &rules); err != nil {
		t.Fatal(err)
	}
	want := objects(t, "kubectl kustomize deploy/monitoring", run(t, "kubectl", "kustomize", "deploy/monitoring"))
	rule := want["monitoring.coreos.com/v1 PrometheusRule coroner-system/coroner"]
	if rule == nil {
		t.Fatalf("deploy/monitoring has no PrometheusRule coroner: %v", want)
	}
	if diff := cmp.Diff(rules, rule.Object["spec"]); diff != "" {
		t.Errorf("deploy/monitoring/prometheusrule.yaml's spec is not %s (-file +spec):\n%s", RulesFile, diff)
	}
	cm := want["v1 ConfigMap coroner-system/coroner-dashboard"]
	if cm == nil {
		t.Fatalf("deploy/monitoring has no ConfigMap coroner-dashboard")
	}
	if got, _, _ := unstructured.NestedString(cm.Object, "data", "coroner-dashboard.json"); got != string(readFile(t, DashboardFile)) {
		t.Errorf("the dashboard ConfigMap does not hold %s", DashboardFile)
	}

	got := helmTemplate(t, "--set", "monitoring.serviceMonitor.enabled=true,monitoring.prometheusRule.enabled=true,monitoring.dashboard.enabled=true")
	withoutHelmLabels(t, got)
	for key, w := range want {
		g := got[key]
		if g == nil {
			t.Errorf("the chart with monitoring on renders no %s", key)
			continue
		}
		if diff := cmp.Diff(w.Object, g.Object); diff != "" {
			t.Errorf("%s (-kustomize deploy/monitoring +helm):\n%s", key, diff)
		}
	}
	// Off by default.
	for key := range helmTemplate(t) {
		if strings.Contains(key, "monitoring.coreos.com") || strings.Contains(key, "coroner-dashboard") {
			t.Errorf("the chart renders %s with its default values", key)
		}
	}
}
