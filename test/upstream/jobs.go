package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
)

// jobCensus is what a pass's Jobs in the e2e namespaces had in spec.managedBy: the proof
// that the coroner pass handed every Job to coroner and the built-in pass none.
type jobCensus struct {
	// ManagedBy counts the Jobs by their spec.managedBy ("" when unset).
	ManagedBy map[string]int `json:"managedBy"`
	// Wrong lists the Jobs whose managedBy was not the pass's, as namespace/name=value.
	Wrong []string `json:"wrong,omitempty"`
	Total int      `json:"total"`
}

// jobWatcher watches every Job of the cluster during a pass and records, once per Job
// created since it started, its managedBy, when the Job's namespace is one of the e2e
// framework's (labelled e2e-framework: job).
type jobWatcher struct {
	cs      kubernetes.Interface
	since   metav1.Time
	want    string // the managedBy every Job of the pass must have ("" for the built-in controller)
	stop    context.CancelFunc
	done    sync.WaitGroup
	nsCache cache.Indexer

	mu     sync.Mutex
	seen   map[types.UID]bool
	census jobCensus
	errs   []string
}

func watchJobs(ctx context.Context, cs kubernetes.Interface, want string) (*jobWatcher, error) {
	ctx, cancel := context.WithCancel(ctx)
	w := &jobWatcher{
		cs:     cs,
		since:  metav1.NewTime(time.Now().Truncate(time.Second)),
		want:   want,
		stop:   cancel,
		seen:   map[types.UID]bool{},
		census: jobCensus{ManagedBy: map[string]int{}},
	}
	f := informers.NewSharedInformerFactory(cs, 0)
	nsInf := f.Core().V1().Namespaces().Informer()
	w.nsCache = nsInf.GetIndexer()
	jobInf := f.Batch().V1().Jobs().Informer()
	_, err := jobInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { w.observe(ctx, obj) },
		UpdateFunc: func(_, obj any) { w.observe(ctx, obj) },
	})
	if err != nil {
		cancel()
		return nil, err
	}
	f.Start(ctx.Done())
	for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
		if !ok {
			cancel()
			return nil, fmt.Errorf("the informer of %v did not sync", typ)
		}
	}
	w.done.Add(1)
	go func() { defer w.done.Done(); <-ctx.Done(); f.Shutdown() }()
	return w, nil
}

func (w *jobWatcher) observe(ctx context.Context, obj any) {
	j, ok := obj.(*batchv1.Job)
	if !ok || j.CreationTimestamp.Before(&w.since) {
		return
	}
	w.mu.Lock()
	if w.seen[j.UID] {
		w.mu.Unlock()
		return
	}
	w.seen[j.UID] = true
	w.mu.Unlock()
	e2e, err := w.e2eNamespace(ctx, j.Namespace)
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		w.errs = append(w.errs, fmt.Sprintf("job %s/%s: namespace: %v", j.Namespace, j.Name, err))
		return
	}
	if !e2e {
		return
	}
	mb := ptr.Deref(j.Spec.ManagedBy, "")
	w.census.ManagedBy[mb]++
	w.census.Total++
	if mb != w.want {
		w.census.Wrong = append(w.census.Wrong, fmt.Sprintf("%s/%s=%q", j.Namespace, j.Name, mb))
	}
}

// e2eNamespace reports whether the namespace carries the e2e framework's label for the
// Job specs. The informer's cache has it unless the Job's event came first.
func (w *jobWatcher) e2eNamespace(ctx context.Context, name string) (bool, error) {
	var labels map[string]string
	if obj, ok, _ := w.nsCache.GetByKey(name); ok {
		labels = obj.(metav1.Object).GetLabels()
	} else {
		ns, err := w.cs.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, fmt.Errorf("%s is gone, its labels unknown", name)
		}
		if err != nil {
			return false, err
		}
		labels = ns.Labels
	}
	return labels[e2eNamespaceLabel] == e2eNamespaceBase, nil
}

// finish stops the watch and returns the census; errs are Jobs it could not classify.
func (w *jobWatcher) finish() (jobCensus, []string) {
	w.stop()
	w.done.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	c := w.census
	slices.Sort(c.Wrong)
	return c, slices.Clone(w.errs)
}
