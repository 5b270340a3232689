package informers

import (
	"slices"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/conditions"
)

func testJob(name, managedBy string) *batchv1.Job {
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name)},
		Spec:       batchv1.JobSpec{ManagedBy: ptr.To(managedBy)},
	}
}

func podOf(name string, job *batchv1.Job, node string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name), Labels: map[string]string{},
			Finalizers: []string{batchv1.JobTrackingFinalizer}},
		Spec: corev1.PodSpec{NodeName: node},
	}
	if job != nil {
		p.Labels[batchv1.ControllerUidLabel] = string(job.UID)
		p.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(job, batchv1.SchemeGroupVersion.WithKind("Job"))}
	}
	return p
}

// TestInformersDropManagedFields checks the transform of the Job and pod caches.
func TestInformersDropManagedFields(t *testing.T) {
	p := podOf("p1", testJob("ours", "coroner.dev/shim"), "")
	p.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate}}
	out, err := stripManagedFields(p)
	if err != nil {
		t.Fatal(err)
	}
	if got := out.(*corev1.Pod); got.ManagedFields != nil || got.Name != "p1" || len(got.Finalizers) != 1 {
		t.Errorf("stripManagedFields = %+v, want the pod without managedFields only", got.ObjectMeta)
	}
	tomb := cache.DeletedFinalStateUnknown{Key: "ns/p1", Obj: p}
	if out, err := stripManagedFields(tomb); err != nil || out != any(tomb) {
		t.Errorf("stripManagedFields(tombstone) = %v, %v; want it unchanged", out, err)
	}
}

// TestIndexes checks the indexes New puts on the pod informers, and CachedJobOf.
func TestIndexes(t *testing.T) {
	i := New(fake.NewClientset(), Config{})
	if i.AgentNamespace != DefaultAgentNamespace {
		t.Errorf("AgentNamespace %q, want the default %q", i.AgentNamespace, DefaultAgentNamespace)
	}
	job := testJob("j", "coroner.dev/shim")
	own := podOf("own", job, "node-1")
	orphan := podOf("orphan", nil, "node-1")
	orphan.Labels[batchv1.ControllerUidLabel] = string(job.UID)
	other := podOf("other", nil, "node-2")
	other.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "rs", UID: "rs", Controller: ptr.To(true)}}
	for _, p := range []*corev1.Pod{own, orphan, other} {
		if err := i.Pods.GetIndexer().Add(p); err != nil {
			t.Fatal(err)
		}
	}
	if err := i.Jobs.GetIndexer().Add(job); err != nil {
		t.Fatal(err)
	}
	names := func(index, key string) []string {
		objs, err := i.Pods.GetIndexer().ByIndex(index, key)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, o := range objs {
			out = append(out, o.(*corev1.Pod).Name)
		}
		slices.Sort(out)
		return out
	}
	for _, tc := range []struct {
		index, key string
		want       []string
	}{
		{ControllerUIDIndex, string(job.UID), []string{"own"}},
		{OrphanUIDIndex, string(job.UID), []string{"orphan"}},
		{NodeNameIndex, "node-1", []string{"orphan", "own"}},
		{NodeNameIndex, "node-2", []string{"other"}},
	} {
		if got := names(tc.index, tc.key); !slices.Equal(got, tc.want) {
			t.Errorf("%s %s: %v, want %v", tc.index, tc.key, got, tc.want)
		}
	}
	if got := i.CachedJobOf(own); got != job {
		t.Errorf("CachedJobOf(own) = %v, want the Job", got)
	}
	replaced := own.DeepCopy()
	replaced.OwnerReferences[0].UID = "another"
	for _, p := range []*corev1.Pod{orphan, other, replaced} {
		if got := i.CachedJobOf(p); got != nil {
			t.Errorf("CachedJobOf(%s) = %v, want nil", p.Name, got.Name)
		}
	}
	if !IsManagedBy(job, "coroner.dev/shim") || IsManagedBy(job, "example.com/other") || IsManagedBy(nil, "coroner.dev/shim") {
		t.Error("IsManagedBy does not compare spec.managedBy")
	}
}

// TestPodsSelectsManagedPods: Pods holds the pods labelled coroner.dev/managed but the
// counted ones; another controller's Job's pod and a bare pod are not watched at all.
func TestPodsSelectsManagedPods(t *testing.T) {
	job := testJob("j", "coroner.dev/shim")
	builtIn := testJob("b", "")
	live := podOf("live", job, "n1")
	live.Labels[conditions.ManagedPodLabel] = "true"
	counted := live.DeepCopy()
	counted.Name, counted.UID = "counted", "uid-counted"
	counted.Labels[conditions.CountedLabel] = "true"
	counted.Finalizers = nil
	counted.Status.Phase = corev1.PodSucceeded
	theirs := podOf("theirs", builtIn, "n1")
	bare := podOf("bare", nil, "n1")
	inf := New(fake.NewClientset(job, builtIn, live, counted, theirs, bare), Config{})
	stop := make(chan struct{})
	defer func() { close(stop); inf.Shutdown() }()
	inf.Start(stop)
	if !cache.WaitForCacheSync(stop, inf.Pods.HasSynced) {
		t.Fatal("caches did not sync")
	}
	k := inf.Pods.GetStore().ListKeys()
	slices.Sort(k)
	if !slices.Equal(k, []string{"ns/live"}) {
		t.Errorf("Pods holds %q, want ns/live", k)
	}
	sel, err := labels.Parse(JobPodSelector)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []*corev1.Pod{live, counted, theirs, bare} {
		if got, want := sel.Matches(labels.Set(p.Labels)), p == live; got != want {
			t.Errorf("selector %q matches %s: %v, want %v", sel, p.Name, got, want)
		}
	}
}

// TestNodePods: the informer of a node's pods asks for that node's pods only (a field
// selector: the fake clientset does not apply it, so the request is what is checked), in
// OtherPodsNamespace, and keeps stubs (StripForRecovery).
func TestNodePods(t *testing.T) {
	p := podOf("p", nil, "n1")
	p.Spec.Containers = []corev1.Container{{Name: "main", Image: "busybox"}}
	client := fake.NewClientset(p)
	inf := New(client, Config{OtherPodsNamespace: "ns"})
	node := inf.NodePods("n1")
	stop := make(chan struct{})
	defer close(stop)
	go node.Run(stop)
	if !cache.WaitForCacheSync(stop, node.HasSynced) {
		t.Fatal("the node's pod informer did not sync")
	}
	// The watch follows the list, soon after the informer has synced.
	var verbs []string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		verbs = verbs[:0]
		for _, a := range client.Actions() {
			verbs = append(verbs, a.GetVerb())
		}
		if slices.Contains(verbs, "watch") {
			break
		}
	}
	verbs = nil
	for _, a := range client.Actions() {
		if a.GetResource().Resource != "pods" {
			continue
		}
		var fields string
		switch a := a.(type) {
		case k8stesting.ListAction:
			fields = a.GetListRestrictions().Fields.String()
		case k8stesting.WatchAction:
			fields = a.GetWatchRestrictions().Fields.String()
		}
		verbs = append(verbs, a.GetVerb())
		if fields != "spec.nodeName=n1" || a.GetNamespace() != "ns" {
			t.Errorf("%s pods in %q with fields %q, want spec.nodeName=n1 in ns", a.GetVerb(), a.GetNamespace(), fields)
		}
	}
	if !slices.Contains(verbs, "list") || !slices.Contains(verbs, "watch") {
		t.Errorf("requests %v, want a list and a watch", verbs)
	}
	obj, ok, err := node.GetStore().GetByKey("ns/p")
	if err != nil || !ok {
		t.Fatalf("the pod is not in the node's informer: %v", err)
	}
	if got := obj.(*corev1.Pod); len(got.Spec.Containers) != 0 || got.Name != "p" {
		t.Errorf("cached %+v, want the stub of StripForRecovery", got)
	}
}
