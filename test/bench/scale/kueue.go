package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/coroner-dev/coroner/test/harness"
	"github.com/coroner-dev/coroner/test/host"
	"github.com/coroner-dev/coroner/test/pki"
)

// Kueue, as test/tools/build.sh builds it (kueue_version there: its manager into
// <bin-dir>/platforms/kueue); its CRDs are read from the same version of its module.
const (
	kueueModule  = "sigs.k8s.io/kueue"
	kueueVersion = "v0.17.0"
	// kueueSafeToDelete opts a pod in to Kueue's failure recovery (FailureRecoveryPolicy,
	// KEP-6757: pkg/controller/failurerecovery reads constants.SafeToForcefullyDeleteAnnotationKey).
	// Any pod that carries it, managed by Kueue or not.
	kueueSafeToDelete = "kueue.x-k8s.io/safe-to-forcefully-delete"
	// kueueNamespace is Kueue's own namespace (its configuration's default).
	kueueNamespace = "kueue-system"
	// kueueMetricsCerts is where Kueue's manager reads its metrics serving certificate
	// when its internal certificate management is off: hard-coded in cmd/kueue/main.go
	// (read at start even when the metrics server is disabled).
	kueueMetricsCerts = "/etc/kueue/metrics/certs"
	// kueueQPS is Kueue's client rate: its published configuration's (clientConnection).
	kueueQPS = 50
)

// kueueConfig is Kueue's manager configuration for a host process: the module's
// config/components/manager/controller_manager_config.yaml (as test/platforms/kueue
// installs it in a cluster: same controller concurrency and client rate), with
// FailureRecoveryPolicy on, and what a process outside a cluster needs: no leader election,
// no internal certificate management (it wants its webhook Secret and Service), the
// visibility API server off (an aggregated API), the metrics server off, the webhook
// server on 127.0.0.1 with certificates of ours (controller-runtime starts it whatever
// happens; no webhook configuration is registered with the API server, so nothing calls it),
// the health probes on healthAddr. Only the batch/job integration: the Jobs here carry no
// queue name, so Kueue admits none of them; its failure recovery acts on every pod with
// kueueSafeToDelete.
func kueueConfig(webhookPort int, certDir, healthAddr string) string {
	return fmt.Sprintf(`apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: %s
health:
  healthProbeBindAddress: %s
metrics:
  bindAddress: "0"
webhook:
  host: 127.0.0.1
  port: %d
  certDir: %s
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
controller:
  groupKindConcurrency:
    Job.batch: 5
    Pod: 5
    Workload.kueue.x-k8s.io: 5
    LocalQueue.kueue.x-k8s.io: 1
    Cohort.kueue.x-k8s.io: 1
    ClusterQueue.kueue.x-k8s.io: 1
    ResourceFlavor.kueue.x-k8s.io: 1
clientConnection:
  qps: %d
  burst: %d
featureGates:
  FailureRecoveryPolicy: true
  VisibilityOnDemand: false
integrations:
  frameworks:
  - batch/job
`, kueueNamespace, healthAddr, webhookPort, certDir, kueueQPS, 2*kueueQPS)
}

// startKueue runs Kueue's manager as a host process against env, through counter's
// counting proxy (its requests beside the shim's), after applying its CRDs (its
// controllers watch their kinds), and waits until its failure recovery controller runs.
// cleanup removes the metrics certificates it wrote under /etc (nothing when they were
// there already); call it after the process stopped.
func startKueue(ctx context.Context, env *harness.Env, binDir string, counter *writeCounter) (p *host.Process, cleanup func(), err error) {
	cleanup = func() {}
	bin := filepath.Join(binDir, "platforms", "kueue")
	if _, err := os.Stat(bin); err != nil {
		return nil, cleanup, fmt.Errorf("%w: run `test/tools/build.sh kueue` first", err)
	}
	mod, err := host.ModuleDir(ctx, kueueModule+"@"+kueueVersion)
	if err != nil {
		return nil, cleanup, err
	}
	if err := applyCRDs(ctx, env, filepath.Join(mod, "config", "components", "crd", "bases"), 2*time.Minute); err != nil {
		return nil, cleanup, fmt.Errorf("applying Kueue's CRDs: %w", err)
	}
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		return nil, cleanup, err
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: kueueNamespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, cleanup, err
	}

	// One serving certificate, for the webhook server and the metrics certificate watcher.
	ca, err := pki.NewCA("bench-scale-kueue-ca", 24*time.Hour)
	if err != nil {
		return nil, cleanup, err
	}
	serving, err := ca.Issue(pki.CertRequest{CommonName: "kueue", IPs: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"}, Server: true})
	if err != nil {
		return nil, cleanup, err
	}
	certDir := filepath.Join(env.Dir, "kueue-certs")
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		return nil, cleanup, err
	}
	if _, _, err := serving.WriteFiles(certDir, "tls"); err != nil {
		return nil, cleanup, err
	}
	if cleanup, err = metricsCerts(serving); err != nil {
		return nil, cleanup, err
	}

	kubeconfig, err := proxyKubeconfig(ctx, env, "kueue", counter)
	if err != nil {
		return nil, cleanup, err
	}
	webhookAddr, err := freeAddr()
	if err != nil {
		return nil, cleanup, err
	}
	healthAddr, err := freeAddr()
	if err != nil {
		return nil, cleanup, err
	}
	_, port, _ := net.SplitHostPort(webhookAddr)
	webhookPort, err := strconv.Atoi(port)
	if err != nil {
		return nil, cleanup, err
	}
	cfgPath := filepath.Join(env.Dir, "kueue-config.yaml")
	if err := os.WriteFile(cfgPath, []byte(kueueConfig(webhookPort, certDir, healthAddr)), 0o644); err != nil {
		return nil, cleanup, err
	}
	cmd := exec.Command(bin, "--config="+cfgPath, "--kubeconfig="+kubeconfig)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	if p, err = host.StartCommand(env.Dir, "kueue", cmd); err != nil {
		return nil, cleanup, err
	}
	if err := waitKueue(ctx, p, healthAddr, 3*time.Minute); err != nil {
		p.Stop(10 * time.Second)
		return nil, cleanup, fmt.Errorf("%w\nKueue's log:\n%s", err, p.LogTail(3000))
	}
	return p, cleanup, nil
}

// metricsCerts writes kp where Kueue's manager reads its metrics certificate, unless a
// certificate is there already (then it is used as it is). cleanup removes what it
// created.
func metricsCerts(kp pki.KeyPair) (cleanup func(), err error) {
	cleanup = func() {}
	if _, err := os.Stat(filepath.Join(kueueMetricsCerts, "tls.crt")); err == nil {
		return cleanup, nil
	}
	// The first missing directory on the way: removing it removes all that was created.
	top := ""
	for d := kueueMetricsCerts; d != "/" && d != "."; d = filepath.Dir(d) {
		if _, err := os.Stat(d); errors.Is(err, os.ErrNotExist) {
			top = d
		}
	}
	if err := os.MkdirAll(kueueMetricsCerts, 0o755); err != nil {
		return cleanup, err
	}
	certFile, keyFile, err := kp.WriteFiles(kueueMetricsCerts, "tls")
	cleanup = func() {
		if top != "" {
			_ = os.RemoveAll(top)
			return
		}
		_ = os.Remove(certFile)
		_ = os.Remove(keyFile)
	}
	return cleanup, err
}

// waitKueue waits until Kueue's manager answers its readiness probe (its webhook server
// listens) and its failure recovery controller has started its workers (its caches of
// pods and nodes are synced), or it exits.
func waitKueue(ctx context.Context, p *host.Process, healthAddr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	hc := &http.Client{Timeout: 2 * time.Second}
	for {
		if done, err := p.Exited(); done {
			return fmt.Errorf("kueue exited: %v", err)
		}
		ready := false
		if resp, err := hc.Get("http://" + healthAddr + "/readyz"); err == nil {
			ready = resp.StatusCode == http.StatusOK
			_ = resp.Body.Close()
		}
		if ready && recoveryStarted(p.LogTail(4<<20)) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %v: Kueue ready %v, its failure recovery controller not started", timeout, ready)
		}
		if err := sleep(ctx, time.Second); err != nil {
			return err
		}
	}
}

// recoveryStarted says whether Kueue's log shows its failure recovery's pod termination
// controller starting its workers. Its log lines name it by its logger (ControllerName in
// pkg/controller/failurerecovery: Kueue gives it a log constructor of its own), not by its
// controller name (pod_termination_controller); either is taken.
func recoveryStarted(log string) bool {
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, "Starting workers") &&
			(strings.Contains(line, "failure-recovery-pod-termination-controller") || strings.Contains(line, "pod_termination_controller")) {
			return true
		}
	}
	return false
}

// applyCRDs applies every CustomResourceDefinition in dir server-side (Kueue's workloads
// CRD is too big for a client-side apply's annotation) and waits until all are
// established.
func applyCRDs(ctx context.Context, env *harness.Env, dir string, timeout time.Duration) error {
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		return err
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		return fmt.Errorf("no CRDs in %s (%v)", dir, err)
	}
	crds := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	var names []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		var crd unstructured.Unstructured
		// One document each, after a leading "---".
		if err := yaml.Unmarshal([]byte(strings.TrimPrefix(strings.TrimSpace(string(b)), "---")), &crd.Object); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		body, err := json.Marshal(crd.Object)
		if err != nil {
			return err
		}
		if _, err := dyn.Resource(crds).Patch(ctx, crd.GetName(), types.ApplyPatchType, body,
			metav1.PatchOptions{FieldManager: "bench-scale", Force: ptr.To(true)}); err != nil {
			return fmt.Errorf("applying %s: %w", crd.GetName(), err)
		}
		names = append(names, crd.GetName())
	}
	return waitFor(ctx, timeout, func() (bool, string) {
		for _, n := range names {
			got, err := dyn.Resource(crds).Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			if !established(got) {
				return false, fmt.Sprintf("CRD %s not established", n)
			}
		}
		return true, ""
	})
}

func established(crd *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
	for _, c := range conds {
		if m, _ := c.(map[string]any); m["type"] == "Established" && m["status"] == "True" {
			return true
		}
	}
	return false
}
