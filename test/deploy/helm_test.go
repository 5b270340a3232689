package deploy

import (
	"maps"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/pflag"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/coroner-dev/coroner/agent"
	"github.com/coroner-dev/coroner/shim"
)

// helmLabels are the labels the chart adds to every object, as Helm's charts do, and
// kustomize does not: set aside (after checking them) when the two are compared.
var helmLabels = []string{"helm.sh/chart", "app.kubernetes.io/instance", "app.kubernetes.io/managed-by"}

// helmTemplate renders the chart as release "coroner" in coroner-system.
func helmTemplate(t *testing.T, args ...string) map[string]*unstructured.Unstructured {
	t.Helper()
	args = append([]string{"template", "coroner", ChartDir, "--namespace", "coroner-system"}, args...)
	return objects(t, "helm "+strings.Join(args, " "), run(t, "helm", args...))
}

// withoutHelmLabels checks that every object carries Helm's labels and removes them.
// CustomResourceDefinitions are left alone: Helm installs the chart's crds/ as they are,
// untemplated (and never upgrades them).
func withoutHelmLabels(t *testing.T, objs map[string]*unstructured.Unstructured) {
	t.Helper()
	for key, u := range objs {
		if u.GetKind() == "CustomResourceDefinition" {
			continue
		}
		labels := u.GetLabels()
		for _, l := range helmLabels {
			if labels[l] == "" {
				t.Errorf("helm: %s has no label %s", key, l)
			}
			delete(labels, l)
		}
		u.SetLabels(labels)
	}
}

// TestHelmTemplateMatchesKustomize checks that the chart, with its default values,
// renders the objects of `kubectl kustomize deploy/base`: the same set, each equal field by
// field once Helm's own labels are set aside. The JobRecord CRD is in both (deploy/base and
// the chart's crds/, two copies of one file).
func TestHelmTemplateMatchesKustomize(t *testing.T) {
	_ = run(t, "helm", "lint", "--strict", ChartDir)
	got := helmTemplate(t, "--include-crds")
	want := objects(t, "kubectl kustomize deploy/base", run(t, "kubectl", "kustomize", "deploy/base"))
	withoutHelmLabels(t, got)
	if diff := cmp.Diff(slices.Sorted(maps.Keys(want)), slices.Sorted(maps.Keys(got))); diff != "" {
		t.Errorf("objects (-kustomize +helm):\n%s", diff)
	}
	for key, w := range want {
		if g, ok := got[key]; ok {
			if diff := cmp.Diff(w.Object, g.Object); diff != "" {
				t.Errorf("%s (-kustomize +helm):\n%s", key, diff)
			}
		}
	}
}

// TestHelmValues renders the chart with every setting changed from its default and checks
// that the values reach the objects, and that the containers' arguments are flags of
// coroner-agent and coroner-shim that pass their validation.
func TestHelmValues(t *testing.T) {
	objs := helmTemplate(t,
		"--set", "agent.image.repository=registry.example/coroner-agent,agent.image.tag=v1,agent.image.pullPolicy=Always",
		"--set", "agent.fencing.enabled=true,agent.fencing.fenceAfter=45s,agent.runtimeEndpoint=unix:///run/containerd/containerd.sock",
		"--set", "agent.extraArgs={--phase-grace=20s}",
		"--set", "shim.image.repository=registry.example/coroner-shim,shim.image.tag=v1,shim.replicas=3",
		"--set", "shim.recoverPods=managed,shim.zombieThreshold=30s,shim.fenceMargin=20s,shim.managedBy=example.com/shim",
		"--set", "shim.leaderElection.leaseName=other-shim,shim.leaderElection.leaseDuration=6s,shim.leaderElection.renewDeadline=4s,shim.leaderElection.retryPeriod=1s",
		"--set", "namespace.create=false,admissionPolicy.enabled=false,clusterNamePrefix=second-",
	)
	for key := range objs {
		switch {
		case strings.Contains(key, " Namespace "), strings.Contains(key, "ValidatingAdmissionPolicy"):
			t.Errorf("%s rendered although turned off", key)
		case strings.Contains(key, " ClusterRole") && !strings.Contains(key, " /second-coroner-"):
			t.Errorf("%s: cluster-scoped without clusterNamePrefix", key)
		}
	}
	role := objs["rbac.authorization.k8s.io/v1 Role coroner-system/coroner-shim"]
	if role == nil || !strings.Contains(mustJSON(t, role), `"resourceNames":["other-shim"]`) {
		t.Errorf("the shim's Role does not let it update the Lease other-shim: %v", role)
	}

	var ds appsv1.DaemonSet
	fromUnstructured(t, objs["apps/v1 DaemonSet coroner-system/coroner-agent"], &ds)
	a := ds.Spec.Template.Spec.Containers[0]
	if a.Image != "registry.example/coroner-agent:v1" || a.ImagePullPolicy != "Always" {
		t.Errorf("agent image %s (%s)", a.Image, a.ImagePullPolicy)
	}
	t.Setenv("NODE_NAME", "node-a") // the downward API's, as the kubelet sets it
	t.Setenv("POD_NAMESPACE", "coroner-system")
	podName := false
	for _, e := range a.Env {
		podName = podName || (e.Name == "POD_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name")
	}
	if !podName {
		t.Errorf("the agent's env %+v has no POD_NAME from metadata.name (fencing on the node Lease names its pod)", a.Env)
	}
	t.Setenv("POD_NAME", "coroner-agent-x7k2p")
	aopts := agent.NewOptions()
	parseFlags(t, "coroner-agent", aopts.AddFlags, a.Args, map[string]string{"NODE_NAME": "node-a"})
	if !aopts.Fencing || aopts.FenceAfter.String() != "45s" || aopts.RuntimeEndpoint != "unix:///run/containerd/containerd.sock" || aopts.PhaseGrace.String() != "20s" {
		t.Errorf("agent options: fencing %v after %v, endpoint %q, phase grace %v", aopts.Fencing, aopts.FenceAfter, aopts.RuntimeEndpoint, aopts.PhaseGrace)
	}
	if err := aopts.Complete(); err != nil {
		t.Fatal(err)
	}
	if err := aopts.Validate(); err != nil {
		t.Errorf("agent arguments %q: %v", a.Args, err)
	}

	var dep appsv1.Deployment
	fromUnstructured(t, objs["apps/v1 Deployment coroner-system/coroner-shim"], &dep)
	s := dep.Spec.Template.Spec.Containers[0]
	if s.Image != "registry.example/coroner-shim:v1" || *dep.Spec.Replicas != 3 {
		t.Errorf("shim image %s, %d replicas", s.Image, *dep.Spec.Replicas)
	}
	sopts := shim.NewOptions()
	parseFlags(t, "coroner-shim", sopts.AddFlags, s.Args, nil)
	if sopts.RecoverPods != "managed" || sopts.ZombieThreshold.String() != "30s" || sopts.FenceMargin.String() != "20s" ||
		sopts.ManagedBy != "example.com/shim" || sopts.LeaseName != "other-shim" || sopts.LeaseDuration.String() != "6s" ||
		sopts.RenewDeadline.String() != "4s" || sopts.RetryPeriod.String() != "1s" || !sopts.LeaderElect {
		t.Errorf("shim options from %q: %+v", s.Args, sopts)
	}
	if err := sopts.Validate(); err != nil {
		t.Errorf("shim arguments %q: %v", s.Args, err)
	}
}

// TestHelmShimPolicyFollowsTheRelease checks that the shim's admission policy holds the
// release's own shim (its ServiceAccount in the release's namespace) to the Jobs of its own
// shim.managedBy, under the release's cluster-scoped names.
func TestHelmShimPolicyFollowsTheRelease(t *testing.T) {
	objs := objects(t, "helm template second", run(t, "helm", "template", "second", ChartDir, "--namespace", "coroner-second",
		"--set", "agent.enabled=false,clusterNamePrefix=second-,shim.managedBy=example.com/second-shim"))
	var policy admissionregistrationv1.ValidatingAdmissionPolicy
	fromUnstructured(t, objs["admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy /second-coroner-shim-own-jobs"], &policy)
	if m := policy.Spec.MatchConditions; len(m) != 1 || m[0].Expression != "request.userInfo.username == 'system:serviceaccount:coroner-second:coroner-shim'" {
		t.Errorf("the policy matches %+v, want the ServiceAccount coroner-shim of coroner-second", m)
	}
	if i := slices.IndexFunc(policy.Spec.Variables, func(v admissionregistrationv1.Variable) bool { return v.Name == "managedBy" }); i < 0 || policy.Spec.Variables[i].Expression != "'example.com/second-shim'" {
		t.Errorf("the policy's managedBy is not the release's: %+v", policy.Spec.Variables)
	}
	var binding admissionregistrationv1.ValidatingAdmissionPolicyBinding
	fromUnstructured(t, objs["admissionregistration.k8s.io/v1 ValidatingAdmissionPolicyBinding /second-coroner-shim-own-jobs"], &binding)
	if binding.Spec.PolicyName != "second-coroner-shim-own-jobs" {
		t.Errorf("the binding binds %q", binding.Spec.PolicyName)
	}
}

// optInKinds are the kinds of the namespace opt-in (deploy/components/job-opt-in).
var optInKinds = []string{"MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"}

// optIn returns the objects of the namespace opt-in among objs.
func optIn(objs map[string]*unstructured.Unstructured) map[string]*unstructured.Unstructured {
	out := map[string]*unstructured.Unstructured{}
	for key, u := range objs {
		if u.GetAPIVersion() == "admissionregistration.k8s.io/v1" && slices.Contains(optInKinds, u.GetKind()) {
			out[key] = u
		}
	}
	return out
}

// TestHelmJobOptInMatchesKustomize checks that jobOptIn.enabled=true adds to the chart's
// default objects exactly the namespace opt-in of deploy/components/job-opt-in, as the lab
// overlay renders it (the MutatingAdmissionPolicy and binding coroner-job-opt-in), field by
// field once Helm's own labels are set aside; and that the chart's defaults leave it out,
// as the base does.
func TestHelmJobOptInMatchesKustomize(t *testing.T) {
	if n := len(optIn(helmTemplate(t))); n != 0 {
		t.Errorf("the chart renders %d opt-in objects by default, want none (jobOptIn.enabled is false)", n)
	}
	got := helmTemplate(t, "--set", "jobOptIn.enabled=true")
	withoutHelmLabels(t, got)
	want := optIn(objects(t, "kubectl kustomize deploy/overlays/lab", run(t, "kubectl", "kustomize", "deploy/overlays/lab")))
	wantKeys := []string{
		"admissionregistration.k8s.io/v1 MutatingAdmissionPolicy /coroner-job-opt-in",
		"admissionregistration.k8s.io/v1 MutatingAdmissionPolicyBinding /coroner-job-opt-in",
	}
	if diff := cmp.Diff(wantKeys, slices.Sorted(maps.Keys(want))); diff != "" {
		t.Fatalf("the lab overlay's opt-in objects (-want +got):\n%s", diff)
	}
	base := helmTemplate(t)
	if len(got) != len(base)+len(want) {
		t.Errorf("jobOptIn.enabled=true renders %d objects, want the %d defaults and the %d of the opt-in", len(got), len(base), len(want))
	}
	for key, w := range want {
		g, ok := got[key]
		if !ok {
			t.Errorf("jobOptIn.enabled=true does not render %s", key)
			continue
		}
		if diff := cmp.Diff(w.Object, g.Object); diff != "" {
			t.Errorf("%s (-kustomize +helm):\n%s", key, diff)
		}
	}
}

// TestHelmJobOptInValues checks that the opt-in follows the release (its cluster-scoped
// names, shim.managedBy, the label of jobOptIn.namespaceLabel), and that settings it cannot
// work with are refused with a message that names them.
func TestHelmJobOptInValues(t *testing.T) {
	objs := helmTemplate(t, "--set", "jobOptIn.enabled=true,clusterNamePrefix=second-,shim.managedBy=example.com/second-shim",
		"--set", "jobOptIn.namespaceLabel.key=example.com/batch,jobOptIn.namespaceLabel.value=second")
	var policy admissionregistrationv1.MutatingAdmissionPolicy
	fromUnstructured(t, objs["admissionregistration.k8s.io/v1 MutatingAdmissionPolicy /second-coroner-job-opt-in"], &policy)
	if m := policy.Spec.Mutations; len(m) != 1 || m[0].ApplyConfiguration == nil ||
		m[0].ApplyConfiguration.Expression != `Object{spec: Object.spec{managedBy: "example.com/second-shim"}}` {
		t.Errorf("the policy's mutations %+v, want managedBy example.com/second-shim", m)
	}
	var binding admissionregistrationv1.MutatingAdmissionPolicyBinding
	fromUnstructured(t, objs["admissionregistration.k8s.io/v1 MutatingAdmissionPolicyBinding /second-coroner-job-opt-in"], &binding)
	if binding.Spec.PolicyName != "second-coroner-job-opt-in" || binding.Spec.MatchResources == nil || binding.Spec.MatchResources.NamespaceSelector == nil ||
		!maps.Equal(binding.Spec.MatchResources.NamespaceSelector.MatchLabels, map[string]string{"example.com/batch": "second"}) {
		t.Errorf("the binding %+v, want policy second-coroner-job-opt-in on namespaces labelled example.com/batch=second", binding.Spec)
	}

	for _, tc := range []struct {
		name    string
		set     string
		wantErr string
	}{
		{"no shim", "jobOptIn.enabled=true,shim.enabled=false", "jobOptIn.enabled needs shim.enabled"},
		{"no label key", "jobOptIn.enabled=true,jobOptIn.namespaceLabel.key=", "jobOptIn.namespaceLabel.key"},
		{"no label value", "jobOptIn.enabled=true,jobOptIn.namespaceLabel.value=", "jobOptIn.namespaceLabel.value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(tool(t, "helm"), "template", "coroner", ChartDir, "--namespace", "coroner-system", "--set", tc.set)
			cmd.Dir = Root()
			out, err := cmd.CombinedOutput()
			if err == nil || !strings.Contains(string(out), tc.wantErr) {
				t.Errorf("helm template --set %s: %v, output:\n%s\nwant an error naming %q", tc.set, err, out, tc.wantErr)
			}
		})
	}
}

func parseFlags(t *testing.T, name string, add func(*pflag.FlagSet), args []string, vars map[string]string) {
	t.Helper()
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	add(fs)
	expanded := make([]string, len(args))
	for i, a := range args {
		for k, v := range vars {
			a = strings.ReplaceAll(a, "$("+k+")", v)
		}
		expanded[i] = a
	}
	if err := fs.Parse(expanded); err != nil {
		t.Errorf("%s %q: %v", name, args, err)
	}
}

func fromUnstructured(t *testing.T, u *unstructured.Unstructured, into any) {
	t.Helper()
	if u == nil {
		t.Fatalf("missing object for %T", into)
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, into, true); err != nil {
		t.Fatalf("%s: %v", u.GetName(), err)
	}
}

func mustJSON(t *testing.T, u *unstructured.Unstructured) string {
	t.Helper()
	b, err := u.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestHelmQuarantineValues checks shim.quarantine: off by default (no flag rendered, as in
// the kustomize base), and its values reach the shim's flags, which pass its validation;
// the node policy holds the release's shim. shim.avoidFailedNodes likewise.
func TestHelmQuarantineValues(t *testing.T) {
	shimArgs := func(objs map[string]*unstructured.Unstructured) *shim.Options {
		var dep appsv1.Deployment
		fromUnstructured(t, objs["apps/v1 Deployment coroner-system/coroner-shim"], &dep)
		args := dep.Spec.Template.Spec.Containers[0].Args
		o := shim.NewOptions()
		parseFlags(t, "coroner-shim", o.AddFlags, args, nil)
		if err := o.Validate(); err != nil {
			t.Errorf("shim arguments %q: %v", args, err)
		}
		return o
	}
	if o := shimArgs(helmTemplate(t)); o.Quarantine {
		t.Errorf("the quarantine is on by default")
	}
	if o := shimArgs(helmTemplate(t)); o.AvoidFailedNodes != "none" {
		t.Errorf("the avoidance of failed nodes is %q by default", o.AvoidFailedNodes)
	}
	if o := shimArgs(helmTemplate(t, "--set", "shim.avoidFailedNodes=preferred")); o.AvoidFailedNodes != "preferred" {
		t.Errorf("shim.avoidFailedNodes=preferred gave %q", o.AvoidFailedNodes)
	}
	objs := helmTemplate(t, "--set", "shim.quarantine.enabled=true,shim.quarantine.deaths=2,shim.quarantine.window=10m,shim.quarantine.for=2h,shim.quarantine.max=25%",
		"--set", "clusterNamePrefix=second-", "--namespace", "other-ns")
	var dep appsv1.Deployment
	fromUnstructured(t, objs["apps/v1 Deployment other-ns/coroner-shim"], &dep)
	o := shim.NewOptions()
	parseFlags(t, "coroner-shim", o.AddFlags, dep.Spec.Template.Spec.Containers[0].Args, nil)
	if err := o.Validate(); err != nil {
		t.Error(err)
	}
	if !o.Quarantine || o.QuarantineDeaths != 2 || o.QuarantineWindow.String() != "10m0s" || o.QuarantineFor.String() != "2h0m0s" || o.QuarantineMax != "25%" {
		t.Errorf("quarantine options: %v %d %v %v %q", o.Quarantine, o.QuarantineDeaths, o.QuarantineWindow, o.QuarantineFor, o.QuarantineMax)
	}
	var policy admissionregistrationv1.ValidatingAdmissionPolicy
	fromUnstructured(t, objs["admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy /second-coroner-shim-node-quarantine"], &policy)
	if len(policy.Spec.MatchConditions) != 1 || !strings.Contains(policy.Spec.MatchConditions[0].Expression, "'system:serviceaccount:other-ns:coroner-shim'") {
		t.Errorf("the node policy does not hold the release's shim: %+v", policy.Spec.MatchConditions)
	}
	var binding admissionregistrationv1.ValidatingAdmissionPolicyBinding
	fromUnstructured(t, objs["admissionregistration.k8s.io/v1 ValidatingAdmissionPolicyBinding /second-coroner-shim-node-quarantine"], &binding)
	if binding.Spec.PolicyName != "second-coroner-shim-node-quarantine" {
		t.Errorf("the node policy's binding names %q", binding.Spec.PolicyName)
	}
}
