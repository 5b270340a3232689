package controller

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"

	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/shim/metrics"
)

func newRecordsForTest(t *testing.T, max int, objs ...runtime.Object) (*records, *dynamicfake.FakeDynamicClient, *metrics.Metrics) {
	t.Helper()
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{v1alpha1.GroupVersionResource: v1alpha1.Kind + "List"}, objs...)
	m := metrics.New(prometheus.NewRegistry())
	return newRecords(RecordsConfig{Client: dyn, MaxPods: max}, m), dyn, m
}

func stored(t *testing.T, dyn *dynamicfake.FakeDynamicClient, name string) *v1alpha1.JobRecord {
	t.Helper()
	u, err := dyn.Resource(v1alpha1.GroupVersionResource).Namespace("ns").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	o, err := fromUnstructured(u)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func entry(name string, o v1alpha1.Outcome, s int) v1alpha1.Entry {
	return v1alpha1.Entry{Name: name, Phase: corev1.PodFailed, Outcome: o, Recorded: metav1.NewTime(time.Date(2026, 11, 27, 12, 0, s, 0, time.UTC))}
}

// TestRecordsWrite: the first entries create the Job's record, owned by it; later ones are
// merged in; the bound holds; an earlier Job's record of the same name is replaced.
func TestRecordsWrite(t *testing.T) {
	ctx := context.Background()
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "j", UID: "uid-2"}}
	earlier := v1alpha1.New("ns", "j", "uid-1")
	earlier.Set(v1alpha1.Record{Entries: []v1alpha1.Entry{entry("old", v1alpha1.OutcomeFailed, 0)}}, 10)
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(earlier)
	if err != nil {
		t.Fatal(err)
	}
	r, dyn, mt := newRecordsForTest(t, 2, &unstructured.Unstructured{Object: m})

	if err := r.write(ctx, "ns/j", job, []v1alpha1.Entry{entry("a", v1alpha1.OutcomeSucceeded, 1)}); err != nil {
		t.Fatal(err)
	}
	got := stored(t, dyn, "j")
	if got.JobUID != "uid-2" || len(got.Pods) != 1 || got.OwnerReferences[0].UID != "uid-2" || got.OwnerReferences[0].Kind != "Job" {
		t.Fatalf("record = %+v, want this Job's, owned by it, with a", got)
	}
	if err := r.write(ctx, "ns/j", job, []v1alpha1.Entry{entry("b", v1alpha1.OutcomeFailed, 2), entry("c", v1alpha1.OutcomeDeleted, 3)}); err != nil {
		t.Fatal(err)
	}
	got = stored(t, dyn, "j")
	sameAsServer(t, r, "ns/j", got)
	if _, hasA := got.Pods["a"]; hasA || len(got.Pods) != 2 || got.Dropped[v1alpha1.OutcomeSucceeded] != 1 || got.MaxPods != 2 {
		t.Errorf("record = %+v, want b and c, a dropped as the oldest success", got)
	}
	// Nothing new: no write.
	before := len(dyn.Actions())
	if err := r.write(ctx, "ns/j", job, []v1alpha1.Entry{entry("b", v1alpha1.OutcomeFailed, 9)}); err != nil {
		t.Fatal(err)
	}
	if n := len(dyn.Actions()) - before; n != 0 {
		t.Errorf("%d API calls for an unchanged entry, want none", n)
	}
	if v := testutil.ToFloat64(mt.JobRecordWrites.WithLabelValues("delete", metrics.ResultSuccess)); v != 1 {
		t.Errorf("deletes of an earlier Job's record = %v, want 1", v)
	}
	if v := testutil.ToFloat64(mt.JobRecordEntries.WithLabelValues(string(v1alpha1.OutcomeFailed))); v != 1 {
		t.Errorf("failed entries written = %v, want 1", v)
	}
	if v := testutil.ToFloat64(mt.JobRecordBytes.WithLabelValues("patch")); v <= 0 {
		t.Errorf("patch bytes = %v", v)
	}

	// A leader change: the new shim knows nothing, reads the record, and merges.
	r2 := newRecords(RecordsConfig{Client: dyn, MaxPods: 2}, nil)
	if err := r2.write(ctx, "ns/j", job, []v1alpha1.Entry{entry("d", v1alpha1.OutcomeFailed, 4)}); err != nil {
		t.Fatal(err)
	}
	got = stored(t, dyn, "j")
	sameAsServer(t, r2, "ns/j", got)
	if len(got.Pods) != 2 || got.Dropped[v1alpha1.OutcomeDeleted] != 1 || got.Dropped[v1alpha1.OutcomeSucceeded] != 1 {
		t.Errorf("record = %+v, want b and d, c dropped as the oldest deletion", got)
	}
}

// sameAsServer checks that what r keeps of the record after its write is what the server
// stores: the entries, the drops, the bound and the resourceVersion the next patch is
// conditioned on.
func sameAsServer(t *testing.T, r *records, key string, server *v1alpha1.JobRecord) {
	t.Helper()
	r.mu.Lock()
	kept := r.stored[key]
	r.mu.Unlock()
	if kept == nil {
		t.Fatalf("%s: nothing kept after the write", key)
	}
	if kept.ResourceVersion != server.ResourceVersion || kept.MaxPods != server.MaxPods ||
		!equality.Semantic.DeepEqual(kept.Pods, server.Pods) || !maps.Equal(kept.Dropped, server.Dropped) {
		t.Errorf("%s: kept %+v, the server has %+v", key, kept, server)
	}
}

// TestRecordsOff: without a client nothing is written and nothing fails.
func TestRecordsOff(t *testing.T) {
	r := newRecords(RecordsConfig{}, nil)
	if err := r.write(context.Background(), "ns/j", &batchv1.Job{}, []v1alpha1.Entry{entry("a", v1alpha1.OutcomeFailed, 0)}); err != nil {
		t.Errorf("write = %v", err)
	}
}

// TestRecordRetriable: a write that may succeed when tried again holds the sync back; a
// refusal lets the Job go on without its record.
func TestRecordRetriable(t *testing.T) {
	gr := schema.GroupResource{Group: v1alpha1.Group, Resource: v1alpha1.Resource}
	terminating := apierrors.NewForbidden(gr, "j", errors.New("unable to create new content in namespace ns because it is being terminated"))
	terminating.ErrStatus.Details.Causes = []metav1.StatusCause{{Type: corev1.NamespaceTerminatingCause}}
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"conflict", apierrors.NewConflict(gr, "j", errors.New("changed")), true},
		{"exists already", apierrors.NewAlreadyExists(gr, "j"), true},
		{"too many requests", apierrors.NewTooManyRequests("busy", 1), true},
		{"server timeout", apierrors.NewServerTimeout(gr, "patch", 1), true},
		{"internal error", apierrors.NewInternalError(errors.New("etcd")), true},
		{"no answer", fmt.Errorf("writing: %w", errors.New("connection refused")), true},
		{"namespace terminating", fmt.Errorf("creating: %w", terminating), false},
		{"forbidden", apierrors.NewForbidden(gr, "j", errors.New("RBAC")), false},
		{"not served", apierrors.NewNotFound(gr, "j"), false},
		{"too large", apierrors.NewRequestEntityTooLargeError("limit is 3145728"), false},
		{"invalid", apierrors.NewBadRequest("invalid"), false},
		{"unreadable", fmt.Errorf("%w ns/j: bad", errUnreadable), false},
	} {
		if got := recordRetriable(tc.err); got != tc.want {
			t.Errorf("%s: recordRetriable(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
	if !apierrors.HasStatusCause(fmt.Errorf("creating: %w", terminating), corev1.NamespaceTerminatingCause) {
		t.Error("the namespace's termination is not seen through wrapping")
	}
}
