package deploy_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"

	"github.com/coroner-dev/coroner/agent"
	"github.com/coroner-dev/coroner/shim"
)

const (
	agentImage = "docker.io/coroner/coroner-agent:dev"
	shimImage  = "docker.io/coroner/coroner-shim:dev"
)

// rendered is one kustomization's output, typed.
type rendered struct {
	objs  map[string]runtime.Object
	agent *appsv1.DaemonSet
	shim  *appsv1.Deployment
}

func renderTyped(t *testing.T, dir string) rendered {
	t.Helper()
	objs := typed(t, documents(t, render(t, dir)))
	r := rendered{objs: objs}
	var ok bool
	if r.agent, ok = objs["DaemonSet/coroner-agent"].(*appsv1.DaemonSet); !ok {
		t.Fatalf("deploy/%s renders no DaemonSet coroner-agent", dir)
	}
	if r.shim, ok = objs["Deployment/coroner-shim"].(*appsv1.Deployment); !ok {
		t.Fatalf("deploy/%s renders no Deployment coroner-shim", dir)
	}
	return r
}

func container(t *testing.T, spec *corev1.PodSpec, name string) *corev1.Container {
	t.Helper()
	for i := range spec.Containers {
		if spec.Containers[i].Name == name {
			return &spec.Containers[i]
		}
	}
	t.Fatalf("no container %q", name)
	return nil
}

// expandArgs expands $(VAR) references in container args the way the kubelet does, for
// the variables given.
func expandArgs(args []string, vars map[string]string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		for k, v := range vars {
			a = strings.ReplaceAll(a, "$("+k+")", v)
		}
		out[i] = a
	}
	return out
}

// TestRenderedManifests checks what the base and the overlays render, without an API
// server: names, images, pull policies, scheduling, downward API, mounts, and that the
// containers' arguments are valid flags of the binaries as they are today.
func TestRenderedManifests(t *testing.T) {
	for _, tc := range []struct {
		dir             string
		pullPolicy      corev1.PullPolicy
		runtimeEndpoint string
		runtimeHostPath string
		runtimeMountRO  bool
		shortLeases     bool
		shimTolerates   bool
		fenceAfter      time.Duration // 0: fencing off
		optIn           bool          // the namespace opt-in (components/job-opt-in)
	}{
		// The base discovers the runtime's socket among the usual places, mounted read-only.
		{dir: "", pullPolicy: corev1.PullIfNotPresent, runtimeEndpoint: "auto", runtimeHostPath: "/run/containerd", runtimeMountRO: true},
		{dir: "overlays/kind", pullPolicy: corev1.PullIfNotPresent, runtimeEndpoint: "unix:///run/containerd/containerd.sock", runtimeHostPath: "/run/containerd", runtimeMountRO: true, fenceAfter: 30 * time.Second, optIn: true},
		{dir: "overlays/lab", pullPolicy: corev1.PullNever, runtimeEndpoint: "unix:///run/coroner-lab/node-a/containerd.sock", runtimeHostPath: "/run/coroner-lab", shortLeases: true, shimTolerates: true, fenceAfter: 30 * time.Second, optIn: true},
	} {
		t.Run("deploy/"+tc.dir, func(t *testing.T) {
			r := renderTyped(t, tc.dir)
			for key, obj := range r.objs {
				m, err := metaOf(obj)
				if err != nil {
					t.Fatal(err)
				}
				switch {
				case strings.HasPrefix(key, "Namespace/"), strings.HasPrefix(key, "Cluster"), strings.HasPrefix(key, "CustomResourceDefinition/"), strings.HasPrefix(key, "ValidatingAdmissionPolicy"),
					strings.HasPrefix(key, "MutatingAdmissionPolicy"):
					if m.GetNamespace() != "" {
						t.Errorf("%s is cluster-scoped but has namespace %q", key, m.GetNamespace())
					}
				case (strings.HasPrefix(key, "Role/") || strings.HasPrefix(key, "RoleBinding/")) && strings.HasSuffix(key, "-node-lease"):
					// Reading the kubelets' Leases (fencing on the node Lease) is granted there.
					if m.GetNamespace() != "kube-node-lease" {
						t.Errorf("%s is in namespace %q, want kube-node-lease", key, m.GetNamespace())
					}
				case m.GetNamespace() != namespace:
					t.Errorf("%s is in namespace %q, want %s", key, m.GetNamespace(), namespace)
				}
			}
			if _, ok := r.objs["Namespace/"+namespace].(*corev1.Namespace); !ok {
				t.Errorf("no Namespace %s", namespace)
			}

			// The agent: everywhere, with its node's name, the runtime socket, kmsg and cgroups.
			ds := r.agent.Spec.Template.Spec
			a := container(t, &ds, "agent")
			if a.Image != agentImage || a.ImagePullPolicy != tc.pullPolicy {
				t.Errorf("agent image %s (%s), want %s (%s)", a.Image, a.ImagePullPolicy, agentImage, tc.pullPolicy)
			}
			if !slices.ContainsFunc(ds.Tolerations, func(tol corev1.Toleration) bool {
				return tol.Operator == corev1.TolerationOpExists && tol.Key == "" && tol.Effect == ""
			}) {
				t.Errorf("the agent does not tolerate every taint: %+v", ds.Tolerations)
			}
			if ds.ServiceAccountName != "coroner-agent" {
				t.Errorf("agent service account %q", ds.ServiceAccountName)
			}
			wantEnvField(t, a, "NODE_NAME", "spec.nodeName")
			wantEnvField(t, a, "POD_NAMESPACE", "metadata.namespace")
			if a.Resources.Requests.Cpu().IsZero() || a.Resources.Requests.Memory().IsZero() || a.Resources.Limits.Memory().IsZero() {
				t.Errorf("agent resources %+v: want cpu and memory requests and a memory limit", a.Resources)
			}
			// Guaranteed QoS, so that a node OOM does not take the agent first.
			if !a.Resources.Requests.Cpu().Equal(*a.Resources.Limits.Cpu()) || !a.Resources.Requests.Memory().Equal(*a.Resources.Limits.Memory()) {
				t.Errorf("agent resources %+v: want requests equal to limits (Guaranteed QoS)", a.Resources)
			}
			if a.SecurityContext == nil || a.SecurityContext.Privileged == nil || !*a.SecurityContext.Privileged {
				t.Errorf("agent is not privileged (needed for /dev/kmsg)")
			}
			wantHostMount(t, &ds, a, tc.runtimeHostPath, tc.runtimeMountRO)
			wantHostMount(t, &ds, a, "/dev/kmsg", true)
			wantHostMount(t, &ds, a, "/sys/fs/cgroup", true)
			if len(a.Command) != 1 || a.Command[0] != "/coroner-agent" {
				t.Errorf("agent command %q, want [/coroner-agent]", a.Command)
			}
			t.Setenv("NODE_NAME", "node-a")
			// The agent's pod name (fencing on the node Lease names it): the downward API's.
			wantPodNameEnv(t, a)
			t.Setenv("POD_NAME", "coroner-agent-x7k2p")
			opts := agent.NewOptions()
			fs := pflag.NewFlagSet("coroner-agent", pflag.ContinueOnError)
			fs.SetOutput(discard{})
			opts.AddFlags(fs)
			if err := fs.Parse(expandArgs(a.Args, map[string]string{"NODE_NAME": "node-a"})); err != nil {
				t.Errorf("agent args %q: %v", a.Args, err)
			} else if err := errors.Join(opts.Complete(), opts.Validate()); err != nil {
				t.Errorf("agent args %q do not validate: %v", a.Args, err)
			}
			if opts.RuntimeEndpoint != tc.runtimeEndpoint || opts.NodeName != "node-a" {
				t.Errorf("agent runtime endpoint %q on node %q, want %q on node-a", opts.RuntimeEndpoint, opts.NodeName, tc.runtimeEndpoint)
			}
			wantPort(t, a, "metrics", opts.MetricsAddress)
			// Fencing (A6): off unless the operator opts in; on in the lab and on kind.
			if on := tc.fenceAfter != 0; opts.Fencing != on || (on && opts.FenceAfter != tc.fenceAfter) {
				t.Errorf("agent fencing %v after %v, want on: %v after %v", opts.Fencing, opts.FenceAfter, on, tc.fenceAfter)
			}

			// The shim: two replicas, leader election, probes on the health port.
			if r.shim.Spec.Replicas == nil || *r.shim.Spec.Replicas != 2 {
				t.Errorf("shim replicas %v, want 2", r.shim.Spec.Replicas)
			}
			ps := r.shim.Spec.Template.Spec
			s := container(t, &ps, "shim")
			if s.Image != shimImage || s.ImagePullPolicy != tc.pullPolicy {
				t.Errorf("shim image %s (%s), want %s (%s)", s.Image, s.ImagePullPolicy, shimImage, tc.pullPolicy)
			}
			if ps.ServiceAccountName != "coroner-shim" {
				t.Errorf("shim service account %q", ps.ServiceAccountName)
			}
			if len(s.Command) != 1 || s.Command[0] != "/coroner-shim" {
				t.Errorf("shim command %q, want [/coroner-shim]", s.Command)
			}
			wantEnvField(t, s, "POD_NAMESPACE", "metadata.namespace")
			t.Setenv("POD_NAMESPACE", namespace)
			sopts := shim.NewOptions()
			sfs := pflag.NewFlagSet("coroner-shim", pflag.ContinueOnError)
			sfs.SetOutput(discard{})
			sopts.AddFlags(sfs)
			if err := sfs.Parse(s.Args); err != nil {
				t.Errorf("shim args %q: %v", s.Args, err)
			} else if err := sopts.Validate(); err != nil {
				t.Errorf("shim args %q do not validate: %v", s.Args, err)
			}
			if !sopts.LeaderElect || sopts.LeaseNamespace != namespace || sopts.LeaseName != "coroner-shim" {
				t.Errorf("shim leader election %v on Lease %s/%s, want on %s/coroner-shim", sopts.LeaderElect, sopts.LeaseNamespace, sopts.LeaseName, namespace)
			}
			if short := sopts.LeaseDuration < 10*time.Second; short != tc.shortLeases {
				t.Errorf("shim lease duration %v; want short timings: %v", sopts.LeaseDuration, tc.shortLeases)
			}
			wantPort(t, s, "metrics", sopts.MetricsAddress)
			wantPort(t, s, "health", sopts.HealthAddress)
			if s.ReadinessProbe == nil || s.ReadinessProbe.HTTPGet == nil || s.ReadinessProbe.HTTPGet.Path != "/readyz" ||
				s.LivenessProbe == nil || s.LivenessProbe.HTTPGet == nil || s.LivenessProbe.HTTPGet.Path != "/healthz" {
				t.Errorf("shim probes: readiness %+v, liveness %+v", s.ReadinessProbe, s.LivenessProbe)
			}
			tolerates := slices.ContainsFunc(ps.Tolerations, func(tol corev1.Toleration) bool { return tol.Operator == corev1.TolerationOpExists && tol.Key == "" })
			if tolerates != tc.shimTolerates {
				t.Errorf("shim tolerates every taint: %v, want %v", tolerates, tc.shimTolerates)
			}

			// The metrics Services select the pods and name their metrics ports.
			for _, svc := range []struct {
				name     string
				selector map[string]string
			}{{"coroner-agent-metrics", r.agent.Spec.Template.Labels}, {"coroner-shim-metrics", r.shim.Spec.Template.Labels}} {
				s, ok := r.objs["Service/"+svc.name].(*corev1.Service)
				if !ok {
					t.Errorf("no Service %s", svc.name)
					continue
				}
				for k, v := range s.Spec.Selector {
					if svc.selector[k] != v {
						t.Errorf("Service %s selector %v does not select the pods (labels %v)", svc.name, s.Spec.Selector, svc.selector)
					}
				}
				if len(s.Spec.Ports) != 1 || s.Spec.Ports[0].TargetPort.StrVal != "metrics" {
					t.Errorf("Service %s ports %+v, want the metrics port", svc.name, s.Spec.Ports)
				}
			}

			for _, name := range []string{policyName, shimPolicyName, nodePolicyName} {
				if _, ok := r.objs["ValidatingAdmissionPolicy/"+name].(*admissionregistrationv1.ValidatingAdmissionPolicy); !ok {
					t.Errorf("no ValidatingAdmissionPolicy %s", name)
				}
				if b, ok := r.objs["ValidatingAdmissionPolicyBinding/"+name].(*admissionregistrationv1.ValidatingAdmissionPolicyBinding); !ok ||
					b.Spec.PolicyName != name || !slices.Contains(b.Spec.ValidationActions, admissionregistrationv1.Deny) {
					t.Errorf("no binding of %s with action Deny", name)
				}
			}
			wantOptIn(t, r.objs, tc.optIn)
		})
	}
}

// wantOptIn checks the namespace opt-in's policy and binding: absent (want false), or a
// policy that sets spec.managedBy coroner.dev/shim on CREATE of a batch/v1 Job without
// one, failing closed, and a binding that selects the namespaces labelled
// coroner.dev/jobs=managed (the selector in the binding, so that other bindings of the
// same policy may select other namespaces).
func wantOptIn(t *testing.T, objs map[string]runtime.Object, want bool) {
	t.Helper()
	p, hasPolicy := objs["MutatingAdmissionPolicy/"+optInName].(*admissionregistrationv1.MutatingAdmissionPolicy)
	b, hasBinding := objs["MutatingAdmissionPolicyBinding/"+optInName].(*admissionregistrationv1.MutatingAdmissionPolicyBinding)
	if !want {
		if hasPolicy || hasBinding {
			t.Errorf("the namespace opt-in is rendered (policy %v, binding %v); it is a component to add", hasPolicy, hasBinding)
		}
		return
	}
	if !hasPolicy || !hasBinding {
		t.Fatalf("the namespace opt-in is not rendered: policy %v, binding %v", hasPolicy, hasBinding)
	}
	s := p.Spec
	if s.FailurePolicy == nil || *s.FailurePolicy != admissionregistrationv1.Fail || s.ReinvocationPolicy != admissionregistrationv1.NeverReinvocationPolicy {
		t.Errorf("opt-in policy: failurePolicy %v, reinvocationPolicy %q; want Fail, Never", s.FailurePolicy, s.ReinvocationPolicy)
	}
	if mc := s.MatchConstraints; mc == nil || len(mc.ResourceRules) != 1 || mc.NamespaceSelector != nil ||
		!slices.Equal(mc.ResourceRules[0].APIGroups, []string{"batch"}) || !slices.Equal(mc.ResourceRules[0].Resources, []string{"jobs"}) ||
		!slices.Equal(mc.ResourceRules[0].Operations, []admissionregistrationv1.OperationType{admissionregistrationv1.Create}) {
		t.Errorf("opt-in policy matches %+v; want CREATE of batch jobs, no namespace selector", mc)
	}
	if len(s.MatchConditions) != 1 || s.MatchConditions[0].Expression != "!has(object.spec.managedBy)" {
		t.Errorf("opt-in policy match conditions %+v", s.MatchConditions)
	}
	if len(s.Mutations) != 1 || s.Mutations[0].PatchType != admissionregistrationv1.PatchTypeApplyConfiguration || s.Mutations[0].ApplyConfiguration == nil ||
		!strings.Contains(s.Mutations[0].ApplyConfiguration.Expression, `managedBy: "coroner.dev/shim"`) {
		t.Errorf("opt-in policy mutations %+v", s.Mutations)
	}
	if b.Spec.PolicyName != optInName || b.Spec.MatchResources == nil || b.Spec.MatchResources.NamespaceSelector == nil ||
		len(b.Spec.MatchResources.NamespaceSelector.MatchLabels) != 1 || b.Spec.MatchResources.NamespaceSelector.MatchLabels[optInLabel] != optInValue ||
		len(b.Spec.MatchResources.NamespaceSelector.MatchExpressions) != 0 {
		t.Errorf("opt-in binding %+v; want policy %s, namespaces labelled %s=%s", b.Spec, optInName, optInLabel, optInValue)
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

func metaOf(obj runtime.Object) (metav1.Object, error) {
	m, ok := obj.(metav1.Object)
	if !ok {
		return nil, errors.New("object without metadata")
	}
	return m, nil
}

func wantEnvField(t *testing.T, c *corev1.Container, name, fieldPath string) {
	t.Helper()
	for _, e := range c.Env {
		if e.Name == name {
			if e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != fieldPath {
				t.Errorf("container %s: $%s is not from %s: %+v", c.Name, name, fieldPath, e)
			}
			return
		}
	}
	t.Errorf("container %s has no $%s", c.Name, name)
}

// wantHostMount checks that the container mounts the hostPath path at the same place.
func wantHostMount(t *testing.T, spec *corev1.PodSpec, c *corev1.Container, path string, readOnly bool) {
	t.Helper()
	for _, v := range spec.Volumes {
		if v.HostPath == nil || v.HostPath.Path != path {
			continue
		}
		for _, m := range c.VolumeMounts {
			if m.Name == v.Name {
				if m.MountPath != path || m.ReadOnly != readOnly {
					t.Errorf("hostPath %s mounted at %s (read-only %v), want at %s (read-only %v)", path, m.MountPath, m.ReadOnly, path, readOnly)
				}
				return
			}
		}
	}
	t.Errorf("container %s does not mount the host's %s", c.Name, path)
}

// wantPort checks that the container declares the named port of a ":port" address.
func wantPort(t *testing.T, c *corev1.Container, name, addr string) {
	t.Helper()
	_, port, _ := strings.Cut(addr, ":")
	for _, p := range c.Ports {
		if p.Name == name {
			if port != "" && port != strconv.Itoa(int(p.ContainerPort)) {
				t.Errorf("container %s port %s is %d but the binary listens on %s", c.Name, name, p.ContainerPort, addr)
			}
			return
		}
	}
	t.Errorf("container %s declares no port %s", c.Name, name)
}

// TestManifestsApply applies the base to the API server (server-side apply, strict field
// validation, no warnings), checks the objects are there, dry-runs the overlays over it,
// and lets kube-controller-manager's status controller type-check the admission policy.
func TestManifestsApply(t *testing.T) {
	env := deployed(t)
	ctx := context.Background()
	client := kubernetes.NewForConfigOrDie(env.Config)

	objs := documents(t, render(t, ""))
	if len(objs) < 15 {
		t.Fatalf("the base renders %d objects, fewer than expected", len(objs))
	}
	a := newApplier(t, env)
	for _, u := range objs {
		gvk := u.GroupVersionKind()
		mapping, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatal(err)
		}
		ri := a.dyn.Resource(mapping.Resource)
		var err2 error
		if u.GetNamespace() != "" {
			_, err2 = ri.Namespace(u.GetNamespace()).Get(ctx, u.GetName(), metav1.GetOptions{})
		} else {
			_, err2 = ri.Get(ctx, u.GetName(), metav1.GetOptions{})
		}
		if err2 != nil {
			t.Errorf("%s %s not stored: %v", gvk.Kind, u.GetName(), err2)
		}
	}

	for _, dir := range []string{"overlays/lab", "overlays/kind"} {
		if errs := a.apply(ctx, documents(t, render(t, dir)), true); len(errs) > 0 {
			t.Errorf("deploy/%s: server-side dry run: %v", dir, errors.Join(errs...))
		}
	}
	if len(a.warnings) > 0 {
		t.Errorf("the API server warned: %q", a.warnings)
	}

	stop, err := env.StartControllerManager("validatingadmissionpolicy-status-controller")
	if err != nil {
		t.Fatalf("starting kube-controller-manager: %v", err)
	}
	defer stop()
	for _, name := range []string{policyName, shimPolicyName, nodePolicyName} {
		var policy *admissionregistrationv1.ValidatingAdmissionPolicy
		err = eventually(60*time.Second, func() error {
			p, err := client.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if p.Status.ObservedGeneration != p.Generation || p.Status.TypeChecking == nil {
				return errors.New("not type-checked yet")
			}
			policy = p
			return nil
		})
		if err != nil {
			t.Errorf("policy %s: %v", name, err)
			continue
		}
		for _, w := range policy.Status.TypeChecking.ExpressionWarnings {
			t.Errorf("policy %s: type-checking warning at %s: %s", name, w.FieldRef, w.Warning)
		}
	}
}

// wantPodNameEnv checks that the agent's container gets $POD_NAME from its pod's
// metadata.name (--pod-name's default).
func wantPodNameEnv(t *testing.T, c *corev1.Container) {
	t.Helper()
	for _, e := range c.Env {
		if e.Name == "POD_NAME" {
			if e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "metadata.name" {
				t.Errorf("POD_NAME %+v, want from the field metadata.name", e)
			}
			return
		}
	}
	t.Errorf("the agent has no POD_NAME in its env %+v", c.Env)
}
