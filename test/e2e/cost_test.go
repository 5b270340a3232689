package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The agent's cost on a node beside the kubelet's (issue 14, item 4), read from their own
// /metrics through the API server's proxy: the Go process collectors' resident memory and
// CPU seconds. containerd serves no metrics here and is left out.

// procSample is one read of a process's metrics.
type procSample struct {
	at       time.Time
	rss, cpu float64 // bytes, seconds
}

// nodeCost samples the node's agent and kubelet.
type nodeCost struct {
	node                 string
	agentPath, kubelet   string
	agent0, kube0        procSample
	agentIdle, kubeIdle  procSample
	agentStorm, kubeStor procSample
}

// scrape reads process_resident_memory_bytes and process_cpu_seconds_total at path.
func scrape(ctx context.Context, path string) (procSample, error) {
	raw, err := suite.cs.CoreV1().RESTClient().Get().AbsPath(path).DoRaw(ctx)
	if err != nil {
		return procSample{}, err
	}
	s := procSample{at: time.Now(), rss: -1, cpu: -1}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		switch name {
		case "process_resident_memory_bytes":
			s.rss, _ = strconv.ParseFloat(strings.TrimSpace(value), 64)
		case "process_cpu_seconds_total":
			s.cpu, _ = strconv.ParseFloat(strings.TrimSpace(value), 64)
		}
	}
	if s.rss < 0 || s.cpu < 0 {
		return s, fmt.Errorf("%s: no process_resident_memory_bytes or process_cpu_seconds_total", path)
	}
	return s, nil
}

// startCost finds the node's agent and takes the first samples; nil (logged) when the
// metrics cannot be read: the figures are a report, not an assertion.
func startCost(ctx context.Context, t *testing.T, node string) *nodeCost {
	agents, err := suite.cs.CoreV1().Pods("coroner-system").List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/name=coroner-agent", FieldSelector: "spec.nodeName=" + node,
	})
	if err != nil || len(agents.Items) != 1 {
		t.Logf("%s: no agent cost figures (agent pod: %v, %d found)", node, err, len(agents.Items))
		return nil
	}
	c := &nodeCost{node: node,
		agentPath: fmt.Sprintf("/api/v1/namespaces/coroner-system/pods/%s:8090/proxy/metrics", agents.Items[0].Name),
		kubelet:   fmt.Sprintf("/api/v1/nodes/%s/proxy/metrics", node)}
	if c.agent0, err = scrape(ctx, c.agentPath); err == nil {
		c.kube0, err = scrape(ctx, c.kubelet)
	}
	if err != nil {
		t.Logf("%s: no agent cost figures: %v", node, err)
		return nil
	}
	return c
}

// idle takes the samples that end the idle period.
func (c *nodeCost) idle(ctx context.Context) error {
	var err error
	if c.agentIdle, err = scrape(ctx, c.agentPath); err == nil {
		c.kubeIdle, err = scrape(ctx, c.kubelet)
	}
	return err
}

// report takes the samples that end the storm and logs both periods.
func (c *nodeCost) report(ctx context.Context, t *testing.T, exits int) {
	var err error
	if c.agentStorm, err = scrape(ctx, c.agentPath); err == nil {
		c.kubeStor, err = scrape(ctx, c.kubelet)
	}
	if err != nil {
		t.Logf("%s: no agent cost figures: %v", c.node, err)
		return
	}
	pct := func(a, b procSample) float64 { return 100 * (b.cpu - a.cpu) / b.at.Sub(a.at).Seconds() }
	mib := func(s procSample) float64 { return s.rss / (1 << 20) }
	t.Logf("%s cost: agent RSS %.1f MiB idle, %.1f MiB after %d exits; CPU %.2f%% of a core idle (%v), %.2f%% during the exits (%v) | kubelet RSS %.1f / %.1f MiB, CPU %.2f%% / %.2f%%",
		c.node, mib(c.agentIdle), mib(c.agentStorm), exits,
		pct(c.agent0, c.agentIdle), c.agentIdle.at.Sub(c.agent0.at).Round(time.Second),
		pct(c.agentIdle, c.agentStorm), c.agentStorm.at.Sub(c.agentIdle.at).Round(time.Second),
		mib(c.kubeIdle), mib(c.kubeStor), pct(c.kube0, c.kubeIdle), pct(c.kubeIdle, c.kubeStor))
}
