package controller

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	events "k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/informers"
	"github.com/coroner-dev/coroner/shim/metrics"
)

const (
	testNS      = "ns"
	batchPeriod = time.Second
)

// queued is one call on a fakeQueue.
type queued struct {
	Key         string
	After       time.Duration
	RateLimited bool
}

// fakeQueue records Add, AddAfter and AddRateLimited instead of queueing; the other
// methods of the interface are not used by the code under test.
type fakeQueue struct {
	workqueue.TypedRateLimitingInterface[string]
	mu     sync.Mutex
	calls  []queued
	forgot []string
}

func (q *fakeQueue) Add(key string) { q.record(queued{Key: key}) }
func (q *fakeQueue) AddAfter(key string, d time.Duration) {
	q.record(queued{Key: key, After: d})
}
func (q *fakeQueue) AddRateLimited(key string) { q.record(queued{Key: key, RateLimited: true}) }
func (q *fakeQueue) Forget(key string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.forgot = append(q.forgot, key)
}
func (q *fakeQueue) record(c queued) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.calls = append(q.calls, c)
}
func (q *fakeQueue) Calls() []queued {
	q.mu.Lock()
	defer q.mu.Unlock()
	return slices.Clone(q.calls)
}

// fixture is a Controller on a fake clientset whose informers are not started: the test
// puts objects in the informer stores itself.
type fixture struct {
	c        *Controller
	client   *fake.Clientset
	queue    *fakeQueue
	orphans  *fakeQueue
	strays   *fakeQueue
	recorder *events.FakeRecorder
	clock    *clocktesting.FakeClock
	registry *prometheus.Registry
}

// newFixture builds the fixture; objs go into the fake clientset only.
func newFixture(t *testing.T, objs ...runtime.Object) *fixture {
	t.Helper()
	f := &fixture{
		client:   fake.NewClientset(objs...),
		queue:    &fakeQueue{},
		orphans:  &fakeQueue{},
		strays:   &fakeQueue{},
		recorder: events.NewFakeRecorder(1000),
		clock:    clocktesting.NewFakeClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)),
		registry: prometheus.NewRegistry(),
	}
	f.c = New(context.Background(), f.client, informers.New(f.client, informers.Config{}), Config{
		BatchPeriod: batchPeriod,
		Clock:       f.clock,
		Recorder:    f.recorder,
		Metrics:     metrics.New(f.registry),
	})
	f.c.queue = f.queue
	f.c.orphanQueue = f.orphans
	f.c.strayQueue = f.strays
	return f
}

// inCache puts objects in the informer stores (Jobs and Pods).
func (f *fixture) inCache(t *testing.T, objs ...runtime.Object) {
	t.Helper()
	for _, o := range objs {
		var err error
		switch o := o.(type) {
		case *batchv1.Job:
			err = f.c.inf.Jobs.GetIndexer().Add(o)
		case *corev1.Pod:
			err = f.c.inf.Pods.GetIndexer().Add(o)
		default:
			t.Fatalf("inCache: unexpected %T", o)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// events drains the fake recorder.
func (f *fixture) events() []string {
	var out []string
	for {
		select {
		case e := <-f.recorder.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// newJob is a Job named name in testNS, managed by coroner unless managedBy says
// otherwise ("" for none).
func newJob(name string, managedBy ...string) *batchv1.Job {
	mb := conditions.ManagedBy
	if len(managedBy) > 0 {
		mb = managedBy[0]
	}
	uid := types.UID(name + "-uid")
	j := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS, UID: uid, ResourceVersion: "10", Generation: 1},
		Spec: batchv1.JobSpec{
			Parallelism:  ptr.To[int32](1),
			Completions:  ptr.To[int32](1),
			BackoffLimit: ptr.To[int32](6),
			Selector:     &metav1.LabelSelector{MatchLabels: map[string]string{batchv1.ControllerUidLabel: string(uid)}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{batchv1.ControllerUidLabel: string(uid), batchv1.JobNameLabel: name}},
				Spec: corev1.PodSpec{
					RestartPolicy: corev1.RestartPolicyNever,
					Containers:    []corev1.Container{{Name: "main", Image: "busybox"}},
				},
			},
		},
	}
	if mb != "" {
		j.Spec.ManagedBy = &mb
	}
	return j
}

// newPod is a pod of job (nil: no controller) with the tracking finalizer, in phase,
// labelled as the shim labels its pods.
func newPod(name string, job *batchv1.Job, phase corev1.PodPhase) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: testNS, UID: types.UID(name + "-uid"), ResourceVersion: "1",
			Finalizers: []string{batchv1.JobTrackingFinalizer},
			Labels:     map[string]string{conditions.ManagedPodLabel: "true"},
		},
		Status: corev1.PodStatus{Phase: phase},
	}
	if job != nil {
		p.Labels[batchv1.ControllerUidLabel] = string(job.UID)
		p.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(job, batchv1.SchemeGroupVersion.WithKind("Job"))}
	} else {
		p.Labels[batchv1.ControllerUidLabel] = "gone-uid"
	}
	return p
}

func withoutFinalizer(p *corev1.Pod) *corev1.Pod {
	p = p.DeepCopy()
	p.Finalizers = nil
	p.ResourceVersion += "1"
	return p
}

func beingDeleted(p *corev1.Pod) *corev1.Pod {
	p = p.DeepCopy()
	p.DeletionTimestamp = ptr.To(metav1.NewTime(time.Date(2026, 3, 1, 11, 0, 0, 0, time.UTC)))
	p.ResourceVersion += "1"
	return p
}

func finished(j *batchv1.Job, t batchv1.JobConditionType) *batchv1.Job {
	j = j.DeepCopy()
	j.Status.Conditions = append(j.Status.Conditions, batchv1.JobCondition{Type: t, Status: corev1.ConditionTrue})
	return j
}
