package shim

import (
	"context"
	"errors"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/informers"
)

// TestControllersRun runs both controllers on their shared informers against a fake
// API server: the informers sync (HasSynced), each informer is watched once however many
// controllers read it, and Run returns once its context is cancelled: nil, or an error
// wrapping context.Canceled when a controller had not yet seen the caches synced (its
// wait polls).
func TestControllersRun(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// A managed Job and its pod from a shim older than the label coroner.dev/managed.
	managedBy := conditions.ManagedBy
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "j", Namespace: "ns", UID: "job-uid"},
		Spec: batchv1.JobSpec{ManagedBy: &managedBy}}
	old := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "old", Namespace: "ns", UID: "old-uid",
		Labels:          map[string]string{batchv1.ControllerUidLabel: "job-uid"},
		OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(job, batchv1.SchemeGroupVersion.WithKind("Job"))}}}
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}}, job, old)
	c := NewControllers(ctx, client, Config{Informers: informers.Config{AgentNamespace: "agents"}})
	if c.HasSynced() {
		t.Fatal("HasSynced before Run")
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for !c.HasSynced() {
		if time.Now().After(deadline) {
			t.Fatal("the informers did not sync within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	watches := map[string]int{}
	for _, a := range client.Actions() {
		if a.GetVerb() == "watch" {
			watches[a.GetResource().Resource+" in "+a.GetNamespace()]++
		}
	}
	// Jobs, the managed Jobs' pods, Nodes, Leases: one watch each, shared by the Job
	// controller and the recoverer (no node is tainted unreachable: no node's pods).
	want := map[string]int{"jobs in ": 1, "pods in ": 1, "nodes in ": 1, "leases in agents": 1}
	for k, n := range want {
		if watches[k] != n {
			t.Errorf("%d watches of %s, want %d (all: %v)", watches[k], k, n, watches)
		}
	}
	if len(watches) != len(want) {
		t.Errorf("watches %v, want %v", watches, want)
	}
	// The old pod was labelled before the caches started, so it is in the pod cache.
	if _, ok, _ := c.informers.Pods.GetStore().GetByKey("ns/old"); !ok {
		t.Errorf("the managed Job's unlabelled pod is not in the pod cache")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("Run = %v after its context was cancelled, want nil or context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10s of its context being cancelled")
	}
}
