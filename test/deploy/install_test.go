package deploy

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/test/harness"
	"github.com/coroner-dev/coroner/test/wrappers"
)

func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }

// TestHelmInstall installs the chart with Helm into a real kube-apiserver (the harness's;
// no kubelets, so no pod runs), as an operator would: the API server accepts every object
// (the admission policy's CEL included), an upgrade changes what the values say (with
// jobOptIn.enabled, a Job created in a labelled namespace is handed to coroner-shim), a second
// release beside it (another namespace, only a shim with its own managedBy, Lease and
// cluster-scoped names: how CI can install the chart into the lab beside the coroner
// deployed with kustomize) does not collide with the first, and uninstall removes both.
func TestHelmInstall(t *testing.T) {
	helm := tool(t, "helm") // before the harness: skip without the tool
	env := harness.Shared(t)
	ctx := context.Background()
	cs := kubernetes.NewForConfigOrDie(env.Config)
	h := func(args ...string) string {
		t.Helper()
		args = append(args, "--kubeconfig", env.Kubeconfig)
		return string(runTool(t, helm, args...))
	}

	// The release's namespace must exist before Helm stores the release in it; the chart's
	// Namespace (with the Pod Security labels the agent needs) then takes it over.
	out := h("install", "coroner", ChartDir, "--namespace", "coroner-system", "--create-namespace", "--take-ownership")
	t.Logf("helm install:\n%s", out)
	ns, err := cs.CoreV1().Namespaces().Get(ctx, "coroner-system", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ns.Labels["pod-security.kubernetes.io/enforce"] != "privileged" || ns.Labels["app.kubernetes.io/managed-by"] != "Helm" {
		t.Errorf("namespace coroner-system labels %v, want the chart's", ns.Labels)
	}
	for _, get := range []func() error{
		func() error {
			_, err := cs.AppsV1().DaemonSets("coroner-system").Get(ctx, "coroner-agent", metav1.GetOptions{})
			return err
		},
		func() error {
			_, err := cs.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, "coroner-agent-own-node", metav1.GetOptions{})
			return err
		},
		func() error {
			_, err := cs.CoreV1().Services("coroner-system").Get(ctx, "coroner-shim-metrics", metav1.GetOptions{})
			return err
		},
	} {
		if err := get(); err != nil {
			t.Errorf("after helm install: %v", err)
		}
	}

	h("upgrade", "coroner", ChartDir, "--namespace", "coroner-system", "--set", "shim.replicas=3,agent.fencing.enabled=true,agent.fencing.fenceAfter=45s,jobOptIn.enabled=true")
	dep, err := cs.AppsV1().Deployments("coroner-system").Get(ctx, "coroner-shim", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if *dep.Spec.Replicas != 3 {
		t.Errorf("after helm upgrade --set shim.replicas=3: %d replicas", *dep.Spec.Replicas)
	}
	ds, err := cs.AppsV1().DaemonSets("coroner-system").Get(ctx, "coroner-agent", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if args := strings.Join(ds.Spec.Template.Spec.Containers[0].Args, " "); !strings.Contains(args, "--fencing --fence-after=45s") {
		t.Errorf("after helm upgrade with fencing: agent args %s", args)
	}

	// The namespace opt-in, turned on by the upgrade: the API server hands a Job created
	// without managedBy in a labelled namespace to coroner-shim, and no other.
	if got := optInManagedBy(t, cs, map[string]string{"coroner.dev/jobs": "managed"}, "coroner.dev/shim"); got != "coroner.dev/shim" {
		t.Errorf("after helm upgrade with jobOptIn: a Job in a labelled namespace has managedBy %q, want coroner.dev/shim", got)
	}
	if got := optInManagedBy(t, cs, nil, ""); got != "" {
		t.Errorf("after helm upgrade with jobOptIn: a Job in an unlabelled namespace has managedBy %q, want none", got)
	}

	h("install", "second", ChartDir, "--namespace", "coroner-second", "--create-namespace", "--take-ownership",
		"--set", "agent.enabled=false,admissionPolicy.enabled=false,clusterNamePrefix=second-",
		"--set", "shim.managedBy=example.com/second-shim,shim.leaderElection.leaseName=second-shim")
	if _, err := cs.RbacV1().ClusterRoles().Get(ctx, "second-coroner-shim", metav1.GetOptions{}); err != nil {
		t.Errorf("second release: %v", err)
	}
	if _, err := cs.AppsV1().DaemonSets("coroner-second").Get(ctx, "coroner-agent", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("second release with agent.enabled=false: DaemonSet: %v", err)
	}

	h("uninstall", "second", "--namespace", "coroner-second")
	h("uninstall", "coroner", "--namespace", "coroner-system")
	if _, err := cs.RbacV1().ClusterRoles().Get(ctx, "coroner-shim", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("after helm uninstall: ClusterRole coroner-shim: %v", err)
	}
	if _, err := cs.RbacV1().ClusterRoles().Get(ctx, "second-coroner-shim", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("after helm uninstall: ClusterRole second-coroner-shim: %v", err)
	}
	if _, err := cs.AdmissionregistrationV1().MutatingAdmissionPolicies().Get(ctx, "coroner-job-opt-in", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("after helm uninstall: MutatingAdmissionPolicy coroner-job-opt-in: %v", err)
	}
}

// optInManagedBy creates a namespace with the labels and dry-runs the creation of a Job
// without managedBy in it until the Job comes back with managedBy want ("" for none; the
// API server's admission reads policies and namespace labels through informers, so a
// change takes a moment), or 30 s have passed; it returns the last managedBy seen.
func optInManagedBy(t *testing.T, cs kubernetes.Interface, labels map[string]string, want string) string {
	t.Helper()
	ctx := context.Background()
	ns, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "helm-opt-in-", Labels: labels}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cs.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{}) }()
	var got string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		job, err := cs.BatchV1().Jobs(ns.Name).Create(ctx, wrappers.MakeJob("probe", ns.Name).Obj(), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			t.Fatalf("dry-run of a Job in namespace %s: %v", ns.Name, err)
		}
		got = ptr.Deref(job.Spec.ManagedBy, "")
		if got == want || time.Now().After(deadline) {
			return got
		}
	}
}
