package chaos_test

import (
	"bytes"
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/cmd/coronerctl/chaos"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/test/harness"
)

// evictUndo is Evict's undo hint.
const evictUndo = "nothing to undo: the pod's controller replaces it (a bare pod is gone for good)"

// budgetMessage is the API server's message when a PodDisruptionBudget refuses an eviction.
const budgetMessage = "Cannot evict pod as it would violate the pod's disruption budget."

// createBudget creates a PodDisruptionBudget of minAvailable 1 for the pods labelled
// app=app and waits until the disruption controller has computed its status (it then allows
// no disruption: the pod is not Ready).
func createBudget(t *testing.T, env *harness.Env, cs kubernetes.Interface, ns, app string) *policyv1.PodDisruptionBudget {
	t.Helper()
	disruptionController(t, env)
	ctx := context.Background()
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: app},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MinAvailable: ptr.To(intstr.FromInt32(1)),
			Selector:     &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}},
		},
	}
	pdb, err := cs.PolicyV1().PodDisruptionBudgets(ns).Create(ctx, pdb, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating the PodDisruptionBudget: %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		cur, err := cs.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, pdb.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if cur.Status.ObservedGeneration >= cur.Generation {
			if cur.Status.DisruptionsAllowed != 0 || cur.Status.ExpectedPods != 1 {
				t.Fatalf("PodDisruptionBudget status = %+v, want 1 expected pod and no disruption allowed", cur.Status)
			}
			return cur
		}
		if time.Now().After(deadline) {
			t.Fatalf("the disruption controller did not process PodDisruptionBudget %s/%s", ns, pdb.Name)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// deleteBudgetAfter makes rec delete the budget once the API server has refused n
// evictions with 429.
func deleteBudgetAfter(t *testing.T, rec *recorder, cs kubernetes.Interface, pdb *policyv1.PodDisruptionBudget, n int) {
	refused := 0
	rec.hook = func(r request) {
		if r.Method != http.MethodPost || !evictionPath.MatchString(r.Path) || r.Code != http.StatusTooManyRequests {
			return
		}
		if refused++; refused == n {
			if err := cs.PolicyV1().PodDisruptionBudgets(pdb.Namespace).Delete(context.Background(), pdb.Name, metav1.DeleteOptions{}); err != nil {
				t.Errorf("deleting the PodDisruptionBudget: %v", err)
			}
		}
	}
}

func TestEvict(t *testing.T) {
	env := harness.Shared(t)
	cases := []struct {
		name    string
		pod     string // the pod asked for; the namespace holds foo, bound to a node
		budget  bool   // a PodDisruptionBudget covers foo
		refuse  int    // the budget is deleted after this many refusals (never when 0)
		user    string // impersonated, with only get on pods
		timeout time.Duration
		wantErr string
		// wantRequests is the number of eviction requests; wantEvicted whether foo ends
		// marked for deletion by the eviction.
		wantRequests int
		wantOut      []string
		wantEvicted  bool
	}{
		{
			name: "accepted", pod: "foo", wantRequests: 1, wantEvicted: true,
			wantOut: []string{"evict: requested eviction of NS/foo (node NS)\n"},
		},
		{
			name: "refused twice by a budget, then accepted", pod: "foo", budget: true, refuse: 2, wantRequests: 3, wantEvicted: true,
			wantOut: []string{
				"evict: NS/foo: eviction refused for now (" + budgetMessage + "); retrying every 1s\n",
				"evict: requested eviction of NS/foo (node NS)\n",
			},
		},
		{
			name: "refused until ctx ends", pod: "foo", budget: true, timeout: 2500 * time.Millisecond,
			wantErr: "evicting pod NS/foo: gave up (context deadline exceeded) while the eviction was refused: Cannot evict pod",
		},
		{name: "missing pod", pod: "bar", wantErr: "pod NS/bar not found"},
		{
			name: "refused for another reason", pod: "foo", user: "chaos-pod-reader", wantRequests: 1,
			wantErr: `evicting pod NS/foo: pods "foo" is forbidden: User "chaos-pod-reader" cannot create resource "pods/eviction" in API group "" in the namespace "NS"`,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ns := env.Namespace(t)
			admin := adminClient(env)
			ctx := context.Background()
			createPod(t, admin, ns, "foo", podSpec{node: ns, labels: map[string]string{"app": "foo"}})
			var cs kubernetes.Interface
			var rec *recorder
			if tc.user != "" {
				grantPodReader(t, env, admin, ns, tc.user)
				cs, rec = recordedClient(t, env, tc.user)
			} else {
				cs, rec = recordedClient(t, env)
			}
			if tc.budget {
				pdb := createBudget(t, env, admin, ns, "foo")
				if tc.refuse > 0 {
					deleteBudgetAfter(t, rec, admin, pdb, tc.refuse)
				}
			}
			if tc.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.timeout)
				defer cancel()
			}
			var out bytes.Buffer
			undo, err := chaos.Evict(ctx, cs, &out, ns, tc.pod)
			t.Logf("output:\n%s", out.String())
			wantErr := strings.ReplaceAll(tc.wantErr, "NS", ns)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), wantErr) {
					t.Fatalf("Evict error = %v, want one containing %q", err, wantErr)
				}
			} else {
				if err != nil {
					t.Fatalf("Evict: %v", err)
				}
				if undo != evictUndo {
					t.Errorf("undo = %q, want %q", undo, evictUndo)
				}
			}
			if tc.wantRequests > 0 {
				want := slices.Repeat([]string{ns + "/" + tc.pod}, tc.wantRequests)
				if got := rec.evictions(); !slices.Equal(got, want) {
					t.Errorf("eviction requests = %v, want %v", got, want)
				}
			}
			if want := strings.ReplaceAll(strings.Join(tc.wantOut, ""), "NS", ns); out.String() != want && tc.wantErr == "" {
				t.Errorf("output = %q, want %q", out.String(), want)
			}
			// The pod is bound to a node, so the API server deletes it gracefully: it stays,
			// terminating, until its kubelet is done, with the eviction's condition.
			foo, err := admin.CoreV1().Pods(ns).Get(context.Background(), "foo", metav1.GetOptions{})
			if err != nil {
				t.Fatalf("reading %s/foo: %v", ns, err)
			}
			evicted := foo.DeletionTimestamp != nil && hasCondition(foo, conditions.DisruptionTarget, conditions.ReasonEvictionByEvictionAPI)
			if evicted != tc.wantEvicted {
				t.Errorf("%s/foo evicted (deletionTimestamp %v, conditions %v) = %t, want %t", ns, foo.DeletionTimestamp, foo.Status.Conditions, evicted, tc.wantEvicted)
			}
		})
	}
}

// TestEvictedPodGoes checks, with the kubelet played, that an evicted pod bound to a node
// goes once its kubelet has finished it, and that an unbound pod goes at once.
func TestEvictedPodGoes(t *testing.T) {
	env := harness.Shared(t)
	ns := env.Namespace(t)
	admin := adminClient(env)
	createPod(t, admin, ns, "bound", podSpec{node: ns})
	unbound, err := admin.CoreV1().Pods(ns).Create(context.Background(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "unbound"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: image}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	playKubelet(t, admin, ns, kubeletDelete, false)
	var out bytes.Buffer
	if _, err := chaos.Evict(context.Background(), admin, &out, ns, unbound.Name); err != nil {
		t.Fatalf("Evict: %v", err)
	}
	if want := "evict: requested eviction of " + ns + "/unbound (not scheduled)\n"; out.String() != want {
		t.Errorf("output = %q, want %q", out.String(), want)
	}
	if hasPod(t, admin, ns, "unbound") {
		t.Errorf("%s/unbound, not scheduled, is still there after its eviction", ns)
	}
	if _, err := chaos.Evict(context.Background(), admin, &out, ns, "bound"); err != nil {
		t.Fatalf("Evict: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for hasPod(t, admin, ns, "bound") {
		if time.Now().After(deadline) {
			t.Fatalf("%s/bound still there 10s after its eviction", ns)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// grantPodReader lets the user get pods in the namespace, and nothing else.
func grantPodReader(t *testing.T, env *harness.Env, cs kubernetes.Interface, ns, user string) {
	t.Helper()
	ctx := context.Background()
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pod-reader"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}}},
	}
	if _, err := cs.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pod-reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}
	if _, err := cs.RbacV1().RoleBindings(ns).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// RBAC reads bindings through informers: wait until the user may get pods.
	as, _ := recordedClient(t, env, user)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := as.CoreV1().Pods(ns).Get(ctx, "foo", metav1.GetOptions{}); err == nil {
			return
		} else if time.Now().After(deadline) {
			t.Fatalf("the user %s still may not get pods: %v", user, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
