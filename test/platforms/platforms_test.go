package platforms

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/yaml"
)

func TestNamed(t *testing.T) {
	for _, tc := range []struct {
		list    string
		want    []string
		wantErr bool
	}{
		{list: "all", want: []string{"kueue", "jobset"}},
		{list: "", want: []string{"kueue", "jobset"}},
		{list: "jobset", want: []string{"jobset"}},
		{list: "kueue, jobset", want: []string{"kueue", "jobset"}},
		{list: "kueue,volcano", wantErr: true},
	} {
		ps, err := Named(tc.list)
		if (err != nil) != tc.wantErr {
			t.Errorf("%q: err %v", tc.list, err)
			continue
		}
		var got []string
		for _, p := range ps {
			got = append(got, p.Name)
		}
		if !tc.wantErr && strings.Join(got, ",") != strings.Join(tc.want, ",") {
			t.Errorf("%q: %v, want %v", tc.list, got, tc.want)
		}
	}
}

// TestRender renders each platform from its real module (the module proxy, or the module
// cache) through the overlay with our kubectl's kustomize, and checks what the overlay
// promises: the manager's image is the one built here and never pulled, the module's own
// objects otherwise (its CRDs, webhooks, namespace), and Kueue's configuration with
// FailureRecoveryPolicy and waitForPodsReady.
func TestRender(t *testing.T) {
	c, err := New()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(c.BinDir, "kubectl")); err != nil {
		t.Fatalf("kubectl is built by make tools: %v", err)
	}
	c.Out, c.ManagerNode = t.TempDir(), "node-a"
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for _, p := range All {
		t.Run(p.Name, func(t *testing.T) {
			out, err := c.Render(ctx, p)
			if err != nil {
				t.Fatal(err)
			}
			objs := decode(t, out)
			kinds := map[string]int{}
			var dep *appsv1.Deployment
			var cm *corev1.ConfigMap
			for _, o := range objs {
				kinds[o.GetKind()]++
				switch {
				case o.GetKind() == "Deployment" && o.GetName() == p.Deployment:
					dep = &appsv1.Deployment{}
					convert(t, o, dep)
				case o.GetKind() == "ConfigMap" && strings.HasSuffix(o.GetName(), "manager-config"):
					cm = &corev1.ConfigMap{}
					convert(t, o, cm)
				}
				// (Kueue's visibility API reads the API server's authentication settings
				// through a RoleBinding in kube-system.)
				if ns := o.GetNamespace(); ns != "" && ns != p.Namespace && ns != "kube-system" {
					t.Errorf("%s %s in namespace %s, want %s", o.GetKind(), o.GetName(), ns, p.Namespace)
				}
			}
			if kinds["CustomResourceDefinition"] == 0 || kinds["MutatingWebhookConfiguration"] != 1 || kinds["ValidatingWebhookConfiguration"] != 1 {
				t.Errorf("want the module's CRDs and webhooks; kinds %v", kinds)
			}
			if dep == nil {
				t.Fatalf("no Deployment %s among %v", p.Deployment, kinds)
			}
			if got := dep.Spec.Template.Spec.NodeSelector["kubernetes.io/hostname"]; got != "node-a" {
				t.Errorf("manager's node selector %v, want kubernetes.io/hostname=node-a", dep.Spec.Template.Spec.NodeSelector)
			}
			mgr := dep.Spec.Template.Spec.Containers[0]
			if mgr.Image != p.Image || mgr.ImagePullPolicy != corev1.PullIfNotPresent || mgr.Command[0] != "/manager" {
				t.Errorf("manager: image %s (%s), command %v; want %s, IfNotPresent, /manager", mgr.Image, mgr.ImagePullPolicy, mgr.Command, p.Image)
			}
			if p.Name == "kueue" {
				if cm == nil {
					t.Fatal("no manager ConfigMap")
				}
				cfg := cm.Data["controller_manager_config.yaml"]
				for _, want := range []string{"FailureRecoveryPolicy: true", "waitForPodsReady:", "timeout: 40s", `- "batch/job"`, `- "jobset.x-k8s.io/jobset"`} {
					if !strings.Contains(cfg, want) {
						t.Errorf("Kueue's configuration lacks %q:\n%s", want, cfg)
					}
				}
			}
		})
	}
}

func decode(t *testing.T, b []byte) []*unstructured.Unstructured {
	t.Helper()
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if err.Error() == "EOF" {
				return objs
			}
			t.Fatal(err)
		}
		if m != nil {
			objs = append(objs, &unstructured.Unstructured{Object: m})
		}
	}
}

func convert(t *testing.T, o *unstructured.Unstructured, into any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, into); err != nil {
		t.Fatal(err)
	}
}

// TestUnavailableAPIServices reads a real list: testdata/apiservices-403.json is `kubectl
// get apiservices -o json` from the process lab (2026-11-27, Kueue v0.17.0 installed,
// before the lab's API server had the front proxy's flags: Kueue's visibility API
// answered 403), cut to one local APIService and Kueue's two.
func TestUnavailableAPIServices(t *testing.T) {
	list, err := os.ReadFile("testdata/apiservices-403.json")
	if err != nil {
		t.Fatal(err)
	}
	down, err := unavailableAPIServices(list, "kueue-system")
	if err != nil {
		t.Fatal(err)
	}
	if len(down) != 2 || !strings.HasPrefix(down[0], "v1beta1.visibility.kueue.x-k8s.io (FailedDiscoveryCheck: ") ||
		!strings.Contains(down[1], ": 403") {
		t.Errorf("unavailable in kueue-system: %q; want both visibility versions, with the 403", down)
	}
	if down, err := unavailableAPIServices(list, "jobset-system"); err != nil || len(down) != 0 {
		t.Errorf("unavailable in jobset-system (serves none): %q, %v", down, err)
	}
	avail := strings.ReplaceAll(string(list), `"status": "False"`, `"status": "True"`)
	if down, err := unavailableAPIServices([]byte(avail), "kueue-system"); err != nil || len(down) != 0 {
		t.Errorf("all Available: %q, %v", down, err)
	}
	if _, err := unavailableAPIServices([]byte("not json"), "kueue-system"); err == nil {
		t.Error("a list that is not JSON: no error")
	}
}
