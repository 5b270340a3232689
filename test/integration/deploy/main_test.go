// Package deploy_test checks coroner's manifests (deploy/) against a real kube-apiserver
// v1.36.3 (test/harness):
//
//   - manifests_test.go: `kubectl kustomize` renders the base and the lab and kind overlays
//     (with the kubectl this repository builds); the images, pull policies, tolerations,
//     downward-API variables and host mounts are what the lab and kind need; every
//     argument of the agent's and the shim's containers is a flag of coroner-agent and
//     coroner-shim and passes their validation; the base is accepted by the API server with
//     server-side apply and strict field validation, the overlays with a server-side dry
//     run, and the admission policies' CEL type-checks (kube-controller-manager's
//     validatingadmissionpolicy-status-controller reports no warning).
//   - rbac_test.go: least privilege, by SubjectAccessReviews for both service accounts.
//   - admission_test.go: the ValidatingAdmissionPolicies keep the agent to its own node
//     and the shim to its own Jobs, with real service account tokens: a TokenRequest bound
//     to a pod on node-a gives the node-name claim, and with it the agent may write pods on
//     node-a and not on node-b; the shim may write the status of a Job with its managedBy
//     and that Job's pods, and not a bare pod's.
//   - optin_test.go: the namespace opt-in (components/job-opt-in, a MutatingAdmissionPolicy
//     and its binding) gives Jobs created without managedBy in a labelled namespace
//     spec.managedBy coroner.dev/shim, and leaves every other Job as it was created.
//   - check_test.go: `coronerctl check` finds exactly what the API server rejects, with
//     the same field paths and messages.
//   - explain_test.go: `coronerctl explain` against the real API server (selectors, the
//     events field selector).
//
// The base is applied once per run (deployed) and shared by the tests; the Nodes node-a and
// node-b are created by the admission test.
package deploy_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/coroner-dev/coroner/test/harness"
	"github.com/coroner-dev/coroner/test/host"
)

func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }

const (
	// namespace is coroner's namespace in deploy/base.
	namespace = "coroner-system"
	// policyName is the agent's ValidatingAdmissionPolicy (and binding) of deploy/base.
	policyName = "coroner-agent-own-node"
	// shimPolicyName is the shim's.
	shimPolicyName = "coroner-shim-own-jobs"
	// nodePolicyName is the shim's on Nodes (the quarantine taint only).
	nodePolicyName = "coroner-shim-node-quarantine"
	// fieldManager is the server-side apply field manager of these tests.
	fieldManager = "coroner-deploy-test"
)

// kubectlPath returns the kubectl that `make tools` builds next to the harness binaries.
func kubectlPath(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("CORONER_BIN_DIR")
	if dir == "" {
		root := repoRoot(t)
		dir = filepath.Join(root, "_output", "bin")
	}
	p := filepath.Join(dir, "kubectl")
	if _, err := os.Stat(p); err != nil {
		if os.Getenv("CORONER_REQUIRE_HARNESS") == "1" {
			t.Fatalf("kubectl not built at %s; run make tools", p)
		}
		t.Skipf("kubectl not built at %s; run make tools", p)
	}
	return p
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := host.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// render runs `kubectl kustomize deploy/<dir>` and returns its YAML.
func render(t *testing.T, dir string) []byte {
	t.Helper()
	cmd := exec.Command(kubectlPath(t), "kustomize", filepath.Join(repoRoot(t), "deploy", dir))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl kustomize deploy/%s: %v\n%s", dir, err, stderr.String())
	}
	return out
}

// documents splits rendered YAML into unstructured objects.
func documents(t *testing.T, yaml []byte) []*unstructured.Unstructured {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(yaml), 4096)
	var out []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			return out
		} else if err != nil {
			t.Fatalf("decoding the rendered manifests: %v", err)
		}
		if len(m) > 0 {
			out = append(out, &unstructured.Unstructured{Object: m})
		}
	}
}

// typed converts the rendered objects to client-go's types, keyed "Kind/name".
func typed(t *testing.T, objs []*unstructured.Unstructured) map[string]runtime.Object {
	t.Helper()
	out := map[string]runtime.Object{}
	for _, u := range objs {
		if u.GetKind() == "CustomResourceDefinition" {
			// client-go's scheme has no apiextensions types: kept as it is.
			out[u.GetKind()+"/"+u.GetName()] = u
			continue
		}
		obj, err := scheme.Scheme.New(u.GroupVersionKind())
		if err != nil {
			t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
		}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, obj, true); err != nil {
			t.Fatalf("%s %s does not convert strictly to its type: %v", u.GetKind(), u.GetName(), err)
		}
		out[u.GetKind()+"/"+u.GetName()] = obj
	}
	return out
}

// applier applies objects with server-side apply and strict field validation, and
// collects the API server's warnings.
type applier struct {
	dyn      dynamic.Interface
	mapper   *restmapper.DeferredDiscoveryRESTMapper
	mu       sync.Mutex
	warnings []string
}

func (a *applier) HandleWarningHeader(code int, agent, text string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.warnings = append(a.warnings, text)
}

func newApplier(t *testing.T, env *harness.Env) *applier {
	t.Helper()
	a := &applier{}
	cfg := rest.CopyConfig(env.Config)
	cfg.WarningHandler = a
	client := kubernetes.NewForConfigOrDie(cfg)
	a.mapper = restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(client.Discovery()))
	a.dyn = dynamic.NewForConfigOrDie(cfg)
	return a
}

// apply server-side applies every object in order (dry run when dryRun) and returns the
// errors by object.
func (a *applier) apply(ctx context.Context, objs []*unstructured.Unstructured, dryRun bool) []error {
	var errs []error
	for _, u := range objs {
		gvk := u.GroupVersionKind()
		mapping, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s %s: %w", gvk.Kind, u.GetName(), err))
			continue
		}
		var ri dynamic.ResourceInterface = a.dyn.Resource(mapping.Resource)
		if mapping.Scope.Name() == "namespace" {
			ri = a.dyn.Resource(mapping.Resource).Namespace(u.GetNamespace())
		} else if u.GetNamespace() != "" {
			errs = append(errs, fmt.Errorf("%s %s is cluster-scoped but the manifest gives it namespace %q", gvk.Kind, u.GetName(), u.GetNamespace()))
			continue
		}
		body, err := u.MarshalJSON()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		opts := metav1.PatchOptions{FieldManager: fieldManager, Force: ptrTo(true), FieldValidation: "Strict"}
		if dryRun {
			opts.DryRun = []string{metav1.DryRunAll}
		}
		if _, err := ri.Patch(ctx, u.GetName(), types.ApplyPatchType, body, opts); err != nil {
			errs = append(errs, fmt.Errorf("%s %s/%s: %w", gvk.Kind, u.GetNamespace(), u.GetName(), err))
		}
	}
	return errs
}

func ptrTo[T any](v T) *T { return &v }

var (
	deployOnce sync.Once
	deployErr  error
)

// deployed applies the rendered base once per run and waits until the admission policy
// is enforced; tests that need coroner's objects call it first.
func deployed(t *testing.T) *harness.Env {
	t.Helper()
	env := harness.Shared(t)
	yaml := render(t, "")
	deployOnce.Do(func() {
		ctx := context.Background()
		a := newApplier(t, env)
		if errs := a.apply(ctx, documents(t, yaml), false); len(errs) > 0 {
			deployErr = fmt.Errorf("applying deploy/: %w", errors.Join(errs...))
			return
		}
		if len(a.warnings) > 0 {
			deployErr = fmt.Errorf("the API server warned about deploy/: %q", a.warnings)
			return
		}
		deployErr = waitForPolicy(ctx, kubernetes.NewForConfigOrDie(env.Config))
	})
	if deployErr != nil {
		t.Fatal(deployErr)
	}
	return env
}

// waitForPolicy checks that the policies and their bindings are stored. The admission
// plugin reads them through informers, so a request right after the apply may not be
// checked yet: the admission tests wait for the first denial before they assert anything.
func waitForPolicy(ctx context.Context, admin kubernetes.Interface) error {
	for _, name := range []string{policyName, shimPolicyName} {
		if _, err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, name, metav1.GetOptions{}); err != nil {
			return err
		}
		if _, err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Get(ctx, name, metav1.GetOptions{}); err != nil {
			return err
		}
	}
	return nil
}

// eventually retries f until it returns nil or the timeout passes, and returns its last
// error.
func eventually(timeout time.Duration, f func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// isForbiddenBy reports whether err is a 403 whose message contains every part.
func isForbiddenBy(err error, parts ...string) bool {
	if !apierrors.IsForbidden(err) {
		return false
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			return false
		}
	}
	return true
}
