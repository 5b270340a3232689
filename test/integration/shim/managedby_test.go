package shim_test

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim"
	"github.com/coroner-dev/coroner/shim/controller"
	"github.com/coroner-dev/coroner/test/harness"
	"github.com/coroner-dev/coroner/test/wrappers"
)

// TestOnlyManagedJobsAreTouched (S1): coroner, with its default managedBy value, runs the
// Job handed to it and never touches a Job without managedBy, one for another
// controller, or one that names the built-in controller: no pods, an empty status and the
// same resourceVersion seconds after coroner ran its own Job.
func TestOnlyManagedJobsAreTouched(t *testing.T) {
	if builtinTarget {
		t.Skip("a property of coroner's controller")
	}
	t.Parallel()
	withoutBuiltin(t) // else the built-in controller would run the Job without managedBy
	env := harness.Shared(t)
	client := newClient(env, "coroner-shim-integration-test")
	ns := env.Namespace(t)
	ctx := context.Background()
	// Config.ManagedBy left empty: the default, conditions.ManagedBy.
	startShim(t, newShimClients(t, env, 0).Kube, shim.Config{Jobs: controller.Config{BatchPeriod: batchPeriod, Backoff: fastBackoff, Workers: 2}})

	create := func(w *wrappers.JobWrapper) *batchv1.Job {
		j, err := client.BatchV1().Jobs(ns).Create(ctx, w.Obj(), metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("creating Job %s: %v", w.Name, err)
		}
		return j
	}
	untouched := []*batchv1.Job{
		create(wrappers.MakeJob("unmanaged", ns)),
		create(wrappers.MakeJob("other", ns).ManagedBy("example.com/other-controller")),
		create(wrappers.MakeJob("builtin", ns).ManagedBy(conditions.BuiltInJobControllerName)),
	}
	mine := create(wrappers.MakeJob("mine", ns).ManagedBy(conditions.ManagedBy))

	var minePods int
	waitFor(t, settle, "coroner to start its own Job (a pod and a startTime)", func() (bool, error) {
		j, err := client.BatchV1().Jobs(ns).Get(ctx, mine.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		pods, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		minePods = len(pods.Items)
		return j.Status.StartTime != nil && minePods == 1, nil
	}, func() string { return fmt.Sprintf("%d pods in the namespace", minePods) })

	// For three more seconds, time coroner would need to act on the others had it a
	// reason to, they stay exactly as created and get no pods.
	check := func() (string, error) {
		for _, want := range untouched {
			got, err := client.BatchV1().Jobs(ns).Get(ctx, want.Name, metav1.GetOptions{})
			if err != nil {
				return "", err
			}
			if got.ResourceVersion != want.ResourceVersion || !reflect.DeepEqual(got.Status, batchv1.JobStatus{}) {
				return fmt.Sprintf("Job %s (managedBy %s) was written: resourceVersion %s -> %s, status %+v",
					want.Name, strPtr(want.Spec.ManagedBy), want.ResourceVersion, got.ResourceVersion, got.Status), nil
			}
		}
		pods, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return "", err
		}
		for _, p := range pods.Items {
			if ref := metav1.GetControllerOf(&p); ref == nil || ref.UID != mine.UID {
				return fmt.Sprintf("pod %s belongs to %+v, want only pods of the Job handed to coroner", p.Name, ref), nil
			}
		}
		return "", nil
	}
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
		msg, err := check()
		if err != nil {
			t.Fatal(err)
		}
		if msg != "" {
			t.Fatal(msg)
		}
	}
}
