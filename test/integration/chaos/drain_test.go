package chaos_test

import (
	"bytes"
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/cmd/coronerctl/chaos"
	"github.com/coroner-dev/coroner/test/harness"
)

// createDaemonSet creates a DaemonSet (no controller runs: it makes no pods) and returns
// an owner reference to it, as its controller.
func createDaemonSet(t *testing.T, cs kubernetes.Interface, ns, name string) *metav1.OwnerReference {
	t.Helper()
	labels := map[string]string{"app": name}
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: image}}},
			},
		},
	}
	ds, err := cs.AppsV1().DaemonSets(ns).Create(context.Background(), ds, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating DaemonSet %s/%s: %v", ns, name, err)
	}
	return metav1.NewControllerRef(ds, appsv1.SchemeGroupVersion.WithKind("DaemonSet"))
}

// nodePatched reports whether rec sent a patch to the node.
func nodePatched(rec *recorder, node string) bool {
	return slices.ContainsFunc(rec.requests(), func(r request) bool {
		return r.Method == http.MethodPatch && r.Path == "/api/v1/nodes/"+node
	})
}

// TestDrain drains a node holding one pod of every kind: a ReplicaSet's pod refused once by
// a PodDisruptionBudget, a bare pod, a DaemonSet's pod, a mirror pod, a finished pod and a
// pod being deleted already; a pod on another node is not touched.
func TestDrain(t *testing.T) {
	env := harness.Shared(t)
	ns := env.Namespace(t)
	admin := adminClient(env)
	ctx := context.Background()
	node, other := ns+"-2", ns+"-3"
	createNode(t, admin, node, "4", false)
	createNode(t, admin, other, "4", false)

	rsRef := &metav1.OwnerReference{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-1234", UID: "0b5e3b5e-0000-4000-8000-000000000001", Controller: ptr.To(true)}
	createPod(t, admin, ns, "web", podSpec{node: node, labels: map[string]string{"app": "web"}, owner: rsRef})
	createPod(t, admin, ns, "bare", podSpec{node: node})
	createPod(t, admin, ns, "ds", podSpec{node: node, owner: createDaemonSet(t, admin, ns, "ds")})
	// An administrator may create a mirror pod (NodeRestriction limits only nodes); it must be
	// bound to a node.
	createPod(t, admin, ns, "static", podSpec{node: node, annotations: map[string]string{corev1.MirrorPodAnnotationKey: "hash"}})
	createPod(t, admin, ns, "done", podSpec{node: node, phase: corev1.PodSucceeded})
	createPod(t, admin, ns, "leaving", podSpec{node: node})
	createPod(t, admin, ns, "elsewhere", podSpec{node: other})
	// Deleted gracefully: bound to a node, it stays terminating until its kubelet is done.
	if err := admin.CoreV1().Pods(ns).Delete(ctx, "leaving", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	cs, rec := recordedClient(t, env)
	pdb := createBudget(t, env, admin, ns, "web")
	deleteBudgetAfter(t, rec, admin, pdb, 1)
	// The kubelet finishes the terminating pods once the first eviction is in, leaving too.
	playKubelet(t, admin, node, kubeletDelete, true)

	var out bytes.Buffer
	undo, err := chaos.Drain(ctx, cs, &out, node, chaos.DrainOptions{Timeout: 30 * time.Second})
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatalf("Drain: %v", err)
	}
	if want := "coronerctl chaos uncordon " + node; undo != want {
		t.Errorf("undo = %q, want %q", undo, want)
	}
	n, err := admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !n.Spec.Unschedulable {
		t.Errorf("%s is not cordoned", node)
	}
	if o, err := admin.CoreV1().Nodes().Get(ctx, other, metav1.GetOptions{}); err != nil || o.Spec.Unschedulable {
		t.Errorf("%s: %v, cordoned; want it untouched", other, err)
	}
	if want := []string{ns + "/bare", ns + "/web", ns + "/web"}; !slices.Equal(rec.evictions(), want) {
		t.Errorf("eviction requests = %v, want %v", rec.evictions(), want)
	}
	// Drain returned only once the evicted and the deleted pods were gone.
	for _, name := range []string{"web", "bare", "leaving"} {
		if hasPod(t, admin, ns, name) {
			t.Errorf("%s/%s still exists after Drain", ns, name)
		}
	}
	for _, name := range []string{"ds", "static", "done", "elsewhere"} {
		if !hasPod(t, admin, ns, name) {
			t.Errorf("%s/%s was removed; Drain must leave it", ns, name)
		}
	}
	// The API server lists the pods by namespace and name; the gone lines come in the order
	// the pods go.
	q := strings.ReplaceAll(ns, ".", `\.`)
	matchLines(t, out.String(), []string{
		`drain: cordoned ` + q + `-2`,
		`drain: skipping ` + q + `/done \(Succeeded already\)`,
		`drain: leaving ` + q + `/ds \(DaemonSet pod\)`,
		`drain: ` + q + `/leaving is being deleted already; waiting for it`,
		`drain: leaving ` + q + `/static \(mirror of a static pod\)`,
		`drain: evicting ` + q + `/bare`,
		`drain: evicting ` + q + `/web`,
		`drain: ` + q + `/web: eviction refused for now \(Cannot evict pod as it would violate the pod's disruption budget\.\); retrying every 1s`,
		`drain: ` + q + `/(bare|leaving|web) gone \(\d+\.\ds\)`,
		`drain: ` + q + `/(bare|leaving|web) gone \(\d+\.\ds\)`,
		`drain: ` + q + `/(bare|leaving|web) gone \(\d+\.\ds\)`,
		`drain: ` + q + `-2 drained: 2 pods evicted, 2 left \(DaemonSet or static\)`,
	})
	for _, name := range []string{"web", "bare", "leaving"} {
		if !strings.Contains(out.String(), "drain: "+ns+"/"+name+" gone (") {
			t.Errorf("no gone line for %s/%s", ns, name)
		}
	}
}

func TestDrainCases(t *testing.T) {
	env := harness.Shared(t)
	cases := []struct {
		name     string
		missing  bool // Drain a node that does not exist
		cordoned bool
		kubelet  bool // the kubelet is played
		mode     kubeletMode
		timeout  time.Duration
		wantErr  string
		wantUndo string // NODE stands for the node's name
		wantOut  []string
		// wantPatch is whether the node is patched, wantEvicted the eviction requests.
		wantPatch   bool
		wantEvicted int
	}{
		{
			name: "cordoned already", cordoned: true, kubelet: true, mode: kubeletDelete, wantEvicted: 1,
			wantUndo: "coronerctl chaos uncordon NODE",
			wantOut:  []string{"drain: NODE is cordoned already\n", "drain: NS/web gone ("},
		},
		{
			name: "evicted pod ends Failed and stays", kubelet: true, mode: kubeletFail, wantPatch: true, wantEvicted: 1,
			wantUndo: "coronerctl chaos uncordon NODE",
			wantOut:  []string{"drain: cordoned NODE\n", "drain: NS/web terminated, phase Failed ("},
		},
		{
			name: "evicted pod never goes", timeout: 2 * time.Second, wantPatch: true, wantEvicted: 1,
			wantUndo: "coronerctl chaos uncordon NODE",
			wantErr:  "1 pods still on node NODE after 2s: NS/web",
		},
		{name: "missing node", missing: true, wantErr: "node NODE not found"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ns := env.Namespace(t)
			admin := adminClient(env)
			node := ns + "-2"
			createNode(t, admin, node, "4", tc.cordoned)
			createPod(t, admin, ns, "web", podSpec{node: node})
			if tc.kubelet {
				playKubelet(t, admin, node, tc.mode, false)
			}
			target := node
			if tc.missing {
				target = ns + "-nope"
			}
			cs, rec := recordedClient(t, env)
			timeout := tc.timeout
			if timeout == 0 {
				timeout = 30 * time.Second
			}
			var out bytes.Buffer
			undo, err := chaos.Drain(context.Background(), cs, &out, target, chaos.DrainOptions{Timeout: timeout})
			t.Logf("output:\n%s", out.String())
			expand := func(s string) string {
				return strings.ReplaceAll(strings.ReplaceAll(s, "NODE", target), "NS", ns)
			}
			if tc.wantErr == "" && err != nil {
				t.Fatalf("Drain: %v", err)
			}
			if want := expand(tc.wantErr); tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), want)) {
				t.Fatalf("Drain error = %v, want one containing %q", err, want)
			}
			if want := expand(tc.wantUndo); undo != want {
				t.Errorf("undo = %q, want %q", undo, want)
			}
			for _, s := range tc.wantOut {
				if !strings.Contains(out.String(), expand(s)) {
					t.Errorf("output does not contain %q", expand(s))
				}
			}
			if patched := nodePatched(rec, node); patched != tc.wantPatch {
				t.Errorf("node patched = %t, want %t", patched, tc.wantPatch)
			}
			if got := len(rec.evictions()); got != tc.wantEvicted {
				t.Errorf("eviction requests = %v, want %d", rec.evictions(), tc.wantEvicted)
			}
			n, err := admin.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if want := tc.cordoned || tc.wantPatch; n.Spec.Unschedulable != want {
				t.Errorf("spec.unschedulable = %t, want %t", n.Spec.Unschedulable, want)
			}
		})
	}
}

func TestUncordon(t *testing.T) {
	env := harness.Shared(t)
	cases := []struct {
		name          string
		missing       bool
		cordoned      bool
		wantErr       string
		wantUndo      string
		wantOut       string
		wantCordoned  bool
		wantPatchSent bool
	}{
		{
			name: "cordoned", cordoned: true, wantPatchSent: true,
			wantUndo: "coronerctl chaos drain NODE", wantOut: "uncordon: uncordoned NODE\n",
		},
		{
			name:     "schedulable already",
			wantUndo: "nothing to undo: node NODE was schedulable already", wantOut: "uncordon: NODE is schedulable already\n",
		},
		{name: "missing node", missing: true, cordoned: true, wantErr: "node NODE not found", wantCordoned: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ns := env.Namespace(t)
			admin := adminClient(env)
			node := ns + "-2"
			createNode(t, admin, node, "4", tc.cordoned)
			target := node
			if tc.missing {
				target = ns + "-nope"
			}
			expand := func(s string) string { return strings.ReplaceAll(s, "NODE", target) }
			cs, rec := recordedClient(t, env)
			var out bytes.Buffer
			undo, err := chaos.Uncordon(context.Background(), cs, &out, target)
			if tc.wantErr != "" {
				if err == nil || err.Error() != expand(tc.wantErr) {
					t.Fatalf("Uncordon error = %v, want %q", err, expand(tc.wantErr))
				}
			} else if err != nil {
				t.Fatalf("Uncordon: %v", err)
			}
			if undo != expand(tc.wantUndo) || out.String() != expand(tc.wantOut) {
				t.Errorf("Uncordon = %q, output %q; want %q, output %q", undo, out.String(), expand(tc.wantUndo), expand(tc.wantOut))
			}
			got, err := admin.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got.Spec.Unschedulable != tc.wantCordoned {
				t.Errorf("spec.unschedulable = %t, want %t", got.Spec.Unschedulable, tc.wantCordoned)
			}
			if sent := rec.count(http.MethodPatch, "/nodes/") > 0; sent != tc.wantPatchSent {
				t.Errorf("patch sent = %t, want %t", sent, tc.wantPatchSent)
			}
		})
	}
}
