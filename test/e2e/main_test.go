// Package e2e is coroner's end-to-end suite (requirement L3): on the lab's real kubelets
// and containerd, with coroner deployed from deploy/overlays/lab, it runs Jobs whose pods
// die for real (exit codes, the kernel's OOM killer, the kubelet's eviction, the
// scheduler's preemption, a drain) and checks what coroner's agent stamped on the pods and
// what its shim decided; it takes nodes off the network and kills a kubelet with
// `coronerctl chaos`; and it checks the admission policy stops an agent that patches a pod
// of another node. Where coroner must behave like the built-in Job controller, the same
// Job runs under both (the built-in one runs in the lab's kube-controller-manager) and the
// outcomes are compared.
//
// It needs root and takes a few minutes, so it runs only with CORONER_E2E=1 (`make e2e`).
// It uses the lab that is up, or brings one up (without the demo) and takes it down at
// the end (CORONER_E2E_KEEP=1 keeps it).
//
// Tests that disturb a node run one after the other in TestDisruptions, on lab-node-2 and
// lab-node-3, while the others run in parallel on lab-node-1. With the VM node lab-node-4
// in the lab (LAB_VM=1), the OOM, exit and eviction cases run on it too (nodes_test.go),
// and TestVMDisruptions takes it for a node OOM and a partition.
package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	kindlab "github.com/coroner-dev/coroner/test/kind"
	"github.com/coroner-dev/coroner/test/lab"
)

// The nodes' roles in the suite. On kind (CORONER_E2E_CLUSTER=kind) the two workers take
// them: coroner-worker the quiet one, coroner-worker2 the disturbed one.
var (
	quietNode = "lab-node-1" // the parallel tests, which disturb no node
	oomNode   = "lab-node-2" // node OOM, then a killed kubelet
	busyNode  = "lab-node-3" // preemption, drain, then a partition
)

var suite struct {
	skip    string // why the suite does not run, when it does not
	cfg     lab.Config
	rest    *rest.Config
	cs      kubernetes.Interface
	ownsLab bool // this run brought the lab up (and takes it down)
	vm      bool // the lab has the VM node (nodes_test.go)
	// kind: the suite runs on the kind cluster of test/kind (make kind-lab, then
	// make e2e-kind), not on the lab; kc is that cluster.
	kind bool
	kc   kindlab.Config
	// kubeconfig is the cluster's kubeconfig, the lab's or kind's.
	kubeconfig string
}

// onKind reports whether the suite runs on the kind cluster.
func onKind() bool { return os.Getenv("CORONER_E2E_CLUSTER") == "kind" }

// notOnKind skips a case that has no meaning on the kind cluster, saying why.
func notOnKind(t *testing.T, why string) {
	t.Helper()
	if suite.kind {
		t.Skip("not on kind: " + why)
	}
}

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	if os.Getenv("CORONER_E2E") != "1" {
		suite.skip = "the e2e suite runs on the lab (root, a few minutes): set CORONER_E2E=1 (make e2e)"
		return m.Run()
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "e2e: the lab needs root")
		return 1
	}
	cfg, err := lab.DefaultConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	cfg.Out = os.Stderr
	suite.cfg = cfg
	suite.kubeconfig = cfg.Kubeconfig()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	if onKind() {
		return runOnKind(ctx, m)
	}
	up, err := cfg.IsUp(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	if up {
		fmt.Fprintln(os.Stderr, "e2e: using the lab that is up")
	} else {
		start := time.Now()
		upCfg := cfg
		upCfg.SkipDemo = true
		upCfg.VM = lab.VMFromEnv() || requireVM()
		if err := lab.Up(ctx, upCfg); err != nil {
			fmt.Fprintln(os.Stderr, "e2e: lab up:", err)
			return 1
		}
		suite.ownsLab = true
		fmt.Fprintf(os.Stderr, "e2e: lab up in %v\n", time.Since(start).Round(100*time.Millisecond))
	}
	if suite.rest, err = cfg.RESTConfig(); err == nil {
		suite.cs, err = kubernetes.NewForConfig(suite.rest)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}

	if _, err := suite.cs.CoreV1().Nodes().Get(ctx, vmNode, metav1.GetOptions{}); err == nil {
		suite.vm = true
		fmt.Fprintf(os.Stderr, "e2e: the VM node %s is in the lab: the OOM, exit, eviction and fencing cases run on it too\n", vmNode)
	} else {
		fmt.Fprintf(os.Stderr, "e2e: no VM node %s in the lab: its cases skip (LAB_VM=1 runs them)\n", vmNode)
	}

	code := m.Run()

	if code != 0 {
		// What the lab looked like at the end, for the CI log.
		out, _ := cfg.Kubectl(context.Background(), nil, "get", "nodes,pods", "-A", "-o", "wide")
		fmt.Fprintf(os.Stderr, "e2e: failed; the lab at the end:\n%s\nlogs: %s\n", out, filepath.Join(cfg.Dir, "logs"))
	}
	if suite.ownsLab && os.Getenv("CORONER_E2E_KEEP") != "1" {
		if err := lab.Down(context.Background(), cfg); err != nil {
			fmt.Fprintln(os.Stderr, "e2e: lab down:", err)
			return 1
		}
	}
	return code
}

// setup skips the test when the suite does not run, and returns a context bounded by
// timeout and a namespace of the test's own, deleted at the end unless the test failed.
func setup(t *testing.T, timeout time.Duration) (context.Context, string) {
	t.Helper()
	if suite.skip != "" {
		t.Skip(suite.skip)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	name := "e2e-" + strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	if len(name) > 63 {
		name = name[:63]
	}
	name = strings.TrimRight(name, "-")
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := lab.FreshNamespace(ctx, suite.cs, ns, 2*time.Minute); err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("namespace %s kept for a look", name)
			return
		}
		_ = suite.cs.CoreV1().Namespaces().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	return ctx, name
}

// coronerctl runs the coronerctl built into _output/bin (make e2e builds it) against the
// lab and returns its output.
func coronerctl(ctx context.Context, t *testing.T, args ...string) string {
	t.Helper()
	bin := filepath.Join(suite.cfg.BinDir, "coronerctl")
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+suite.kubeconfig)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("coronerctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Logf("coronerctl %s:\n%s", strings.Join(args, " "), out)
	return string(out)
}

// runOnKind runs the suite on the kind cluster that is up (make kind-lab): the nodes'
// roles go to its workers; there is no VM node.
func runOnKind(ctx context.Context, m *testing.M) int {
	kc, err := kindlab.New()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	suite.kind, suite.kc, suite.kubeconfig = true, kc, kc.Kubeconfig()
	quietNode, oomNode, busyNode = kc.Cluster+"-worker", kc.Cluster+"-worker2", kc.Cluster+"-worker2"
	if suite.rest, err = clientcmd.BuildConfigFromFlags("", suite.kubeconfig); err == nil {
		suite.cs, err = kubernetes.NewForConfig(suite.rest)
	}
	if err == nil {
		_, err = suite.cs.CoreV1().Nodes().Get(ctx, oomNode, metav1.GetOptions{})
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: the kind cluster %s is not up (make kind-lab): %v\n", kc.Cluster, err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "e2e: on the kind cluster %s (%s): %s quiet, %s disturbed\n", kc.Cluster, suite.kubeconfig, quietNode, oomNode)
	code := m.Run()
	if code != 0 {
		out, _ := kubectl(context.Background(), "get", "nodes,pods", "-A", "-o", "wide")
		fmt.Fprintf(os.Stderr, "e2e: failed; the kind cluster at the end:\n%s\n", out)
	}
	return code
}

// kubectl runs the lab's kubectl against the suite's cluster.
func kubectl(ctx context.Context, args ...string) ([]byte, error) {
	return kubectlCmd(ctx, args...).CombinedOutput()
}

// kubectlCmd is the command kubectl runs, for a caller that gives it stdin.
func kubectlCmd(ctx context.Context, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, filepath.Join(suite.cfg.BinDir, "kubectl"), append([]string{"--kubeconfig=" + suite.kubeconfig}, args...)...)
}
