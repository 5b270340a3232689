package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coroner-dev/coroner/test/deploy"
	"github.com/coroner-dev/coroner/test/lab"
)

// coronerNamespace is where the lab deploys coroner (deploy/overlays/lab).
const coronerNamespace = "coroner-system"

// TestPrometheusScrapesTheLab runs a real Prometheus (test/tools/build.sh prometheus) on
// this machine, which reaches the lab's pod IPs through the host's routes, with the
// Kubernetes service discovery the ServiceMonitor of deploy/monitoring amounts to: the
// endpoints of the Services coroner-agent-metrics and coroner-shim-metrics, job = the
// Service's name, and coroner's alert rules loaded. It waits until every agent and every
// shim replica is a target that is up, runs a managed Job whose index 1 fails once (so
// that the shim's labelled counters and histograms have something to count), then checks
// through the query API that:
//   - every metric the rules and the Grafana dashboard use is in Prometheus; a labelled
//     counter or histogram that only appears with its first event (a node failure's
//     recovery, say) may be missing, and is named in the log;
//   - exactly one shim replica reports coroner_leader 1, and only it serves the Job
//     metrics;
//   - every alert rule evaluates without error on the real series.
func TestPrometheusScrapesTheLab(t *testing.T) {
	if suite.skip != "" {
		t.Skip(suite.skip)
	}
	notOnKind(t, "the pods' addresses of kind are not routed from this machine")
	bin := filepath.Join(suite.cfg.BinDir, "prometheus")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%s is not built: test/tools/build.sh prometheus", bin)
	}
	ctx, ns := setup(t, 6*time.Minute)
	root := deploy.Root()
	used, err := deploy.UsedMetrics(root)
	if err != nil {
		t.Fatal(err)
	}
	defined, err := deploy.DefinedMetrics()
	if err != nil {
		t.Fatal(err)
	}

	prom := startPrometheus(ctx, t, bin, filepath.Join(root, deploy.RulesFile))

	// Every agent and shim pod must become a target that is up.
	want := map[string]int{}
	for job, name := range map[string]string{"coroner-agent-metrics": "coroner-agent", "coroner-shim-metrics": "coroner-shim"} {
		pods, err := suite.cs.CoreV1().Pods(coronerNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + name})
		if err != nil {
			t.Fatal(err)
		}
		// A pod being deleted has left the Service's endpoints: it is no target. (A lab
		// reused across redeploys can hold one stuck terminating on a node; that is said,
		// not counted.)
		n := 0
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil {
				t.Logf("%s pod %s on %s is being deleted: not a target", name, p.Name, p.Spec.NodeName)
				continue
			}
			n++
		}
		if n == 0 {
			t.Fatalf("no %s pod in %s", name, coronerNamespace)
		}
		want[job] = n
	}
	var targets []promTarget
	err = lab.Poll(ctx, 2*time.Minute, fmt.Sprintf("targets up %v", want), func() (bool, error) {
		var res struct {
			ActiveTargets []promTarget `json:"activeTargets"`
		}
		if err := prom.get(ctx, "/api/v1/targets?state=active", &res); err != nil {
			return false, nil
		}
		targets = res.ActiveTargets
		up := map[string]int{}
		for _, tg := range targets {
			if tg.Health == "up" {
				up[tg.Labels["job"]]++
			}
		}
		return maps.Equal(up, want), nil
	})
	if err != nil {
		t.Fatalf("%v; targets: %+v", err, targets)
	}
	t.Logf("Prometheus scrapes %d targets: %v", len(targets), want)

	// A managed Job whose index 1 fails once, then succeeds.
	j := withFailureCount(onNode(job("scraped", ns).Indexed().Completions(2).Parallelism(2).BackoffLimitPerIndex(1).
		Command("sh", "-c", `[ "$JOB_COMPLETION_INDEX" != 1 ] || [ "$FAILURES" != 0 ] || exit 1`).Obj(), quietNode))
	createJob(ctx, t, j)
	if c := finished(waitFinished(ctx, t, ns, j.Name, 2*time.Minute)); c.Type != batchv1.JobComplete {
		t.Fatalf("Job %s finished %s (%s), want Complete", j.Name, c.Type, c.Reason)
	}

	// Until a scrape after the Job's end has the Job metrics of its finish.
	present := map[string]bool{}
	err = lab.Poll(ctx, time.Minute, "the finished Job in the shim's metrics", func() (bool, error) {
		var err error
		if present, err = prom.names(ctx); err != nil {
			return false, nil
		}
		return present["coroner_jobs_finished_total"], nil
	})
	if err != nil {
		t.Errorf("%v (metrics present: %v)", err, slices.Sorted(maps.Keys(present)))
	}
	var late []string
	for _, name := range slices.Sorted(maps.Keys(used)) {
		switch {
		case present[name]:
		case !defined.All[name] && name != "up":
			t.Errorf("%s, used by %s, is no metric of coroner's", name, strings.Join(used[name], ", "))
		case defined.AtStart[name] || name == "up":
			t.Errorf("%s, used by %s, is served from the start but Prometheus has no series of it", name, strings.Join(used[name], ", "))
		default:
			late = append(late, name)
		}
	}
	t.Logf("%d of the %d metrics the rules and dashboard use are in Prometheus", len(used)-len(late), len(used))
	if len(late) > 0 {
		t.Logf("not observed yet in this lab (labelled, created with their first event): %s", strings.Join(late, ", "))
	}

	// One leader, and the Job metrics from it alone.
	leaders, err := prom.query(ctx, `coroner_leader{job="coroner-shim-metrics"} == 1`)
	if err != nil {
		t.Fatal(err)
	}
	if len(leaders) != 1 {
		t.Fatalf("%d shim replicas say they lead: %v", len(leaders), leaders)
	}
	servers, err := prom.query(ctx, `count by (instance) (coroner_managed_jobs{job="coroner-shim-metrics"})`)
	if err != nil {
		t.Fatal(err)
	}
	if len(servers) != 1 || servers[0].Metric["instance"] != leaders[0].Metric["instance"] {
		t.Errorf("coroner_managed_jobs is served by %v, want the leader %s alone", servers, leaders[0].Metric["instance"])
	}

	// The alert rules evaluate on the real series without error.
	var rules struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Name      string `json:"name"`
				Health    string `json:"health"`
				LastError string `json:"lastError"`
				State     string `json:"state"`
			} `json:"rules"`
		} `json:"groups"`
	}
	err = lab.Poll(ctx, time.Minute, "every rule evaluated", func() (bool, error) {
		if err := prom.get(ctx, "/api/v1/rules", &rules); err != nil {
			return false, nil
		}
		n := 0
		for _, g := range rules.Groups {
			for _, r := range g.Rules {
				if r.Health == "unknown" {
					return false, nil
				}
				n++
			}
		}
		return n > 0, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Health != "ok" {
				t.Errorf("rule %s: %s %s", r.Name, r.Health, r.LastError)
			}
			if r.State == "firing" {
				t.Logf("alert %s is firing in the lab", r.Name)
			}
		}
	}
}

type promTarget struct {
	Labels    map[string]string `json:"labels"`
	ScrapeURL string            `json:"scrapeUrl"`
	Health    string            `json:"health"`
	LastError string            `json:"lastError"`
}

type promSample struct {
	Metric map[string]string `json:"metric"`
}

// promServer is a Prometheus this test started.
type promServer struct{ base string }

// startPrometheus runs prometheus on a free local port with the lab's service discovery
// and the rules file, until the test ends, and waits until it is ready.
func startPrometheus(ctx context.Context, t *testing.T, bin, rules string) *promServer {
	t.Helper()
	dir := t.TempDir()
	config := fmt.Sprintf(`global:
  scrape_interval: 5s
  evaluation_interval: 5s
rule_files: [%q]
scrape_configs:
- job_name: coroner
  kubernetes_sd_configs:
  - role: endpointslice
    kubeconfig_file: %q
    namespaces:
      names: [%s]
  relabel_configs:
  - source_labels: [__meta_kubernetes_service_name]
    regex: coroner-(agent|shim)-metrics
    action: keep
  - source_labels: [__meta_kubernetes_endpointslice_port_name]
    regex: metrics
    action: keep
  - source_labels: [__meta_kubernetes_service_name]
    target_label: job
  - source_labels: [__meta_kubernetes_pod_node_name]
    target_label: node
  - source_labels: [__meta_kubernetes_pod_name]
    target_label: pod
`, rules, suite.kubeconfig, coronerNamespace)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	logf, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+addr)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		logf.Close()
		if t.Failed() {
			if b, err := os.ReadFile(logf.Name()); err == nil {
				t.Logf("prometheus log:\n%s", b)
			}
		}
	})
	p := &promServer{base: "http://" + addr}
	err = lab.Poll(ctx, time.Minute, "prometheus ready at "+addr, func() (bool, error) {
		resp, err := http.Get(p.base + "/-/ready")
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// get decodes the data of a Prometheus API answer into v.
func (p *promServer) get(ctx context.Context, path string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.base+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	var env struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(body, &env); err != nil {
		return fmt.Errorf("%s: %v: %s", path, err, body)
	}
	if env.Status != "success" {
		return fmt.Errorf("%s: %s", path, env.Error)
	}
	return json.Unmarshal(env.Data, v)
}

// query runs an instant query and returns its vector.
func (p *promServer) query(ctx context.Context, q string) ([]promSample, error) {
	var res struct {
		ResultType string       `json:"resultType"`
		Result     []promSample `json:"result"`
	}
	if err := p.get(ctx, "/api/v1/query?query="+url.QueryEscape(q), &res); err != nil {
		return nil, err
	}
	if res.ResultType != "vector" {
		return nil, fmt.Errorf("%s: result type %s", q, res.ResultType)
	}
	return res.Result, nil
}

// names returns the metric names of the coroner targets' series now in Prometheus.
func (p *promServer) names(ctx context.Context) (map[string]bool, error) {
	res, err := p.query(ctx, `count by (__name__) ({job=~"coroner-(agent|shim)-metrics"})`)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, s := range res {
		out[s.Metric["__name__"]] = true
	}
	return out, nil
}
