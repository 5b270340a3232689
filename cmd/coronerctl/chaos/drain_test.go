package chaos

import (
	"bytes"
	"context"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"
)

// ownedBy makes the pod controlled by an object of the kind.
func ownedBy(apiVersion, kind string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: apiVersion, Kind: kind, Name: "owner", UID: "owner-uid", Controller: ptr.To(true)}}
	}
}

// asMirror makes the pod a static pod's mirror.
func asMirror(p *corev1.Pod) {
	p.Annotations = map[string]string{corev1.MirrorPodAnnotationKey: "hash"}
}

// asDeleting gives the pod a deletionTimestamp.
func asDeleting(p *corev1.Pod) {
	p.DeletionTimestamp = &metav1.Time{Time: time.Now()}
}

func TestPlanDrain(t *testing.T) {
	cases := []struct {
		name string
		pod  *corev1.Pod
		want drainAction
	}{
		{"bare pod", fakePod("default", "a", "n"), drainEvict},
		{"ReplicaSet pod", fakePod("default", "a", "n", ownedBy("apps/v1", "ReplicaSet")), drainEvict},
		{"Job pod", fakePod("default", "a", "n", ownedBy("batch/v1", "Job")), drainEvict},
		{"DaemonSet pod", fakePod("default", "a", "n", ownedBy("apps/v1", "DaemonSet")), drainLeaveDaemonSet},
		{"another group's DaemonSet", fakePod("default", "a", "n", ownedBy("example.com/v1", "DaemonSet")), drainEvict},
		{"mirror pod", fakePod("kube-system", "a", "n", asMirror), drainLeaveMirror},
		{"succeeded pod", fakePod("default", "a", "n", withPhase(corev1.PodSucceeded)), drainSkipTerminal},
		{"failed pod", fakePod("default", "a", "n", withPhase(corev1.PodFailed)), drainSkipTerminal},
		{"pending pod", fakePod("default", "a", "n", withPhase(corev1.PodPending)), drainEvict},
		{"pod being deleted", fakePod("default", "a", "n", asDeleting), drainAwait},
		{"failed DaemonSet pod", fakePod("default", "a", "n", ownedBy("apps/v1", "DaemonSet"), withPhase(corev1.PodFailed)), drainLeaveDaemonSet},
		{"failed pod being deleted", fakePod("default", "a", "n", asDeleting, withPhase(corev1.PodFailed)), drainSkipTerminal},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			steps := planDrain([]corev1.Pod{*tc.pod})
			if len(steps) != 1 {
				t.Fatalf("planDrain gave %d steps, want 1", len(steps))
			}
			if steps[0].action != tc.want {
				t.Errorf("action = %d, want %d", steps[0].action, tc.want)
			}
		})
	}
}

// drainPods are the pods of TestFakeDrain: lab-node-2 holds one of every kind, lab-node-3 one.
func drainPods() []runtime.Object {
	return []runtime.Object{
		fakeNode("lab-node-2", "4"), fakeNode("lab-node-3", "4"),
		fakePod("default", "web", "lab-node-2", ownedBy("apps/v1", "ReplicaSet")),
		fakePod("default", "bare", "lab-node-2"),
		fakePod("kube-system", "ds", "lab-node-2", ownedBy("apps/v1", "DaemonSet")),
		fakePod("kube-system", "static", "lab-node-2", asMirror),
		fakePod("default", "done", "lab-node-2", withPhase(corev1.PodSucceeded)),
		fakePod("default", "leaving", "lab-node-2", asDeleting),
		fakePod("default", "elsewhere", "lab-node-3"),
	}
}

func TestFakeDrain(t *testing.T) {
	fastClusterTimings(t)
	cs := fake.NewClientset(drainPods()...)
	// Evicted pods go 30ms after their eviction; web is refused once by a budget.
	f := &fakeEvictions{cs: cs, refuse: map[string]int{"web": 1}, deleteAfter: 30 * time.Millisecond}
	f.install(t)
	// Someone else deletes the pod that was being deleted, 40ms from now.
	leaving := time.AfterFunc(40*time.Millisecond, func() { _ = cs.Tracker().Delete(podResource, "default", "leaving") })
	t.Cleanup(func() { leaving.Stop() })

	var out bytes.Buffer
	undo, err := Drain(context.Background(), cs, &out, "lab-node-2", DrainOptions{Timeout: 5 * time.Second})
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatalf("Drain: %v", err)
	}
	if want := "coronerctl chaos uncordon lab-node-2"; undo != want {
		t.Errorf("undo = %q, want %q", undo, want)
	}
	node, err := cs.CoreV1().Nodes().Get(context.Background(), "lab-node-2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !node.Spec.Unschedulable {
		t.Error("lab-node-2 is not cordoned")
	}
	if want := []string{"default/bare", "default/web", "default/web"}; !slices.Equal(f.evictionRequests(), want) {
		t.Errorf("eviction requests = %v, want %v", f.evictionRequests(), want)
	}
	// Drain returned only once the evicted and the deleted pods were gone.
	for _, name := range []string{"web", "bare", "leaving"} {
		if fakeHasPod(t, cs, "default", name) {
			t.Errorf("default/%s still exists after Drain", name)
		}
	}
	for _, key := range [][2]string{{"kube-system", "ds"}, {"kube-system", "static"}, {"default", "done"}, {"default", "elsewhere"}} {
		if !fakeHasPod(t, cs, key[0], key[1]) {
			t.Errorf("%s/%s was removed; Drain must leave it", key[0], key[1])
		}
	}
	// The fake lists pods by namespace and name; the gone lines come in the order the pods go.
	wantLines := []string{
		`drain: cordoned lab-node-2`,
		`drain: skipping default/done \(Succeeded already\)`,
		`drain: default/leaving is being deleted already; waiting for it`,
		`drain: leaving kube-system/ds \(DaemonSet pod\)`,
		`drain: leaving kube-system/static \(mirror of a static pod\)`,
		`drain: evicting default/bare`,
		`drain: evicting default/web`,
		`drain: default/web: eviction refused for now \(Cannot evict pod .*\); retrying every 10ms`,
		`drain: default/(bare|leaving|web) gone \(\d+\.\ds\)`,
		`drain: default/(bare|leaving|web) gone \(\d+\.\ds\)`,
		`drain: default/(bare|leaving|web) gone \(\d+\.\ds\)`,
		`drain: lab-node-2 drained: 2 pods evicted, 2 left \(DaemonSet or static\)`,
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != len(wantLines) {
		t.Fatalf("got %d lines, want %d", len(lines), len(wantLines))
	}
	for i, pattern := range wantLines {
		if !regexp.MustCompile("^" + pattern + "$").MatchString(lines[i]) {
			t.Errorf("line %d = %q, want a match of %q", i, lines[i], pattern)
		}
	}
	for _, name := range []string{"web", "bare", "leaving"} {
		if !strings.Contains(out.String(), "drain: default/"+name+" gone (") {
			t.Errorf("no gone line for default/%s", name)
		}
	}
}

func TestFakeDrainCases(t *testing.T) {
	fastClusterTimings(t)
	cases := []struct {
		name        string
		node        string
		cordoned    bool
		deleteAfter time.Duration
		finish      bool
		wantErr     string
		wantUndo    string
		wantOut     []string
		wantPatch   bool
	}{
		{
			name: "cordoned already", node: "lab-node-2", cordoned: true,
			wantUndo: "coronerctl chaos uncordon lab-node-2",
			wantOut:  []string{"drain: lab-node-2 is cordoned already\n", "drain: default/web gone ("},
		},
		{
			name: "evicted pod ends Failed and stays", node: "lab-node-2", finish: true, wantPatch: true,
			wantUndo: "coronerctl chaos uncordon lab-node-2",
			wantOut:  []string{"drain: cordoned lab-node-2\n", "drain: default/web terminated, phase Failed ("},
		},
		{
			name: "evicted pod never goes", node: "lab-node-2", deleteAfter: -1, wantPatch: true,
			wantUndo: "coronerctl chaos uncordon lab-node-2",
			wantErr:  "1 pods still on node lab-node-2 after 50ms: default/web",
		},
		{name: "missing node", node: "nope", wantErr: "node nope not found"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			node := fakeNode("lab-node-2", "4")
			node.Spec.Unschedulable = tc.cordoned
			cs := fake.NewClientset(node, fakePod("default", "web", "lab-node-2"))
			f := &fakeEvictions{cs: cs, deleteAfter: tc.deleteAfter, finish: tc.finish}
			f.install(t)
			var out bytes.Buffer
			undo, err := Drain(context.Background(), cs, &out, tc.node, DrainOptions{Timeout: 50 * time.Millisecond})
			t.Logf("output:\n%s", out.String())
			if tc.wantErr == "" && err != nil {
				t.Fatalf("Drain: %v", err)
			}
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("Drain error = %v, want one containing %q", err, tc.wantErr)
			}
			if undo != tc.wantUndo {
				t.Errorf("undo = %q, want %q", undo, tc.wantUndo)
			}
			for _, s := range tc.wantOut {
				if !strings.Contains(out.String(), s) {
					t.Errorf("output does not contain %q", s)
				}
			}
			patched := false
			for _, a := range cs.Actions() {
				if a.GetVerb() == "patch" && a.GetResource().Resource == "nodes" {
					patched = true
				}
			}
			if patched != tc.wantPatch {
				t.Errorf("node patched = %t, want %t", patched, tc.wantPatch)
			}
		})
	}
}

func TestFakeUncordon(t *testing.T) {
	cases := []struct {
		name          string
		node          string
		cordoned      bool
		wantErr       string
		wantUndo      string
		wantOut       string
		wantCordoned  bool
		wantPatchSent bool
	}{
		{
			name: "cordoned", node: "lab-node-2", cordoned: true, wantPatchSent: true,
			wantUndo: "coronerctl chaos drain lab-node-2", wantOut: "uncordon: uncordoned lab-node-2\n",
		},
		{
			name: "schedulable already", node: "lab-node-2",
			wantUndo: "nothing to undo: node lab-node-2 was schedulable already", wantOut: "uncordon: lab-node-2 is schedulable already\n",
		},
		{name: "missing node", node: "nope", cordoned: true, wantErr: "node nope not found", wantCordoned: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			node := fakeNode("lab-node-2", "4")
			node.Spec.Unschedulable = tc.cordoned
			cs := fake.NewClientset(node)
			var out bytes.Buffer
			undo, err := Uncordon(context.Background(), cs, &out, tc.node)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("Uncordon error = %v, want %q", err, tc.wantErr)
				}
			} else if err != nil {
				t.Fatalf("Uncordon: %v", err)
			}
			if undo != tc.wantUndo || out.String() != tc.wantOut {
				t.Errorf("Uncordon = %q, output %q; want %q, output %q", undo, out.String(), tc.wantUndo, tc.wantOut)
			}
			got, err := cs.CoreV1().Nodes().Get(context.Background(), "lab-node-2", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got.Spec.Unschedulable != tc.wantCordoned {
				t.Errorf("spec.unschedulable = %t, want %t", got.Spec.Unschedulable, tc.wantCordoned)
			}
			sent := slices.ContainsFunc(cs.Actions(), func(a k8stesting.Action) bool { return a.GetVerb() == "patch" })
			if sent != tc.wantPatchSent {
				t.Errorf("patch sent = %t, want %t", sent, tc.wantPatchSent)
			}
		})
	}
}
