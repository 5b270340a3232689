package shim_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/coroner-dev/coroner/test/harness"
)

// TestPodwireMatchesClientGo reads one pod, written by two field managers, through the
// shim's client (shim/podwire) and through client-go's, from the API server: a Get and the
// events of a watch decode to the same pods but for managedFields, which the shim's client
// leaves out.
func TestPodwireMatchesClientGo(t *testing.T) {
	t.Parallel()
	env := harness.Shared(t)
	ns := env.Namespace(t)
	theirs, ours := newClient(env, "coroner-podwire-test"), newShimClients(t, env, 0).Kube
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	watchWith := func(c kubernetes.Interface) watch.Interface {
		w, err := c.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(w.Stop)
		return w
	}
	wTheirs, wOurs := watchWith(theirs), watchWith(ours)

	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "wire", Namespace: ns, Labels: map[string]string{"a": "b"},
			Annotations: map[string]string{"c": "d"}, Finalizers: []string{"coroner.dev/test"}},
		Spec: corev1.PodSpec{NodeName: "node-a", Containers: []corev1.Container{{Name: "c", Image: "busybox",
			Env: []corev1.EnvVar{{Name: "X", Value: "1"}}}}},
	}
	created, err := theirs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{FieldManager: "creator"})
	if err != nil {
		t.Fatal(err)
	}
	status := `{"status":{"phase":"Running","conditions":[{"type":"Ready","status":"True"}],"containerStatuses":[{"name":"c","image":"busybox","imageID":"","ready":true,"restartCount":0,"state":{"running":{"startedAt":"2026-11-29T09:00:00Z"}}}]}}`
	if _, err := theirs.CoreV1().Pods(ns).Patch(ctx, created.Name, types.StrategicMergePatchType, []byte(status), metav1.PatchOptions{FieldManager: "kubelet-ish"}, "status"); err != nil {
		t.Fatal(err)
	}
	// The finalizer goes, so that the namespace can.
	defer func() {
		_, _ = theirs.CoreV1().Pods(ns).Patch(context.Background(), created.Name, types.JSONPatchType, []byte(`[{"op":"remove","path":"/metadata/finalizers"}]`), metav1.PatchOptions{})
	}()

	want, err := theirs.CoreV1().Pods(ns).Get(ctx, created.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(want.ManagedFields) < 2 {
		t.Fatalf("client-go's pod has %d managedFields entries, want the two writers'", len(want.ManagedFields))
	}
	got, err := ours.CoreV1().Pods(ns).Get(ctx, created.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	noMF := func(p *corev1.Pod) *corev1.Pod {
		p = p.DeepCopy()
		p.ManagedFields = nil
		return p
	}
	if diff := cmp.Diff(noMF(want), got); diff != "" {
		t.Errorf("Get (-client-go's, managedFields dropped, +podwire's):\n%s", diff)
	}

	next := func(w watch.Interface) *corev1.Pod {
		select {
		case ev := <-w.ResultChan():
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				t.Fatalf("watch event %s: %T, want a pod", ev.Type, ev.Object)
			}
			return p
		case <-ctx.Done():
			t.Fatal("no watch event")
			return nil
		}
	}
	for i, what := range []string{"created", "status written"} {
		a, b := next(wTheirs), next(wOurs)
		if len(a.ManagedFields) == 0 {
			t.Errorf("event %d (%s): client-go's pod has no managedFields", i, what)
		}
		if diff := cmp.Diff(noMF(a), b); diff != "" {
			t.Errorf("watch event %d (%s) (-client-go's, managedFields dropped, +podwire's):\n%s", i, what, diff)
		}
	}
}
