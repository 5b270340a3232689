package controller

// The JobRecords: the stories of the pods that left each Job, for coronerctl explain
// (package shim/record). A sync writes the entries of its plan (jobsync.Plan.Leaving)
// beside its pod creations and status write, and deletes no pod and removes no
// finalizer before the write is done; when it failed in a way a retry may mend
// (recordRetriable) the pods stay for the next sync, which records them again: a pod is
// not gone before its entry is stored, unless the record cannot be written at all.

import (
	"context"
	"errors"
	"fmt"
	"sync"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/metadata"
	"k8s.io/klog/v2"

	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/shim/metrics"
	"github.com/coroner-dev/coroner/shim/record"
)

// DefaultRecordMaxPods is the default bound of a JobRecord's entries, MaxRecordMaxPods the
// largest allowed: an entry takes about 330 bytes of JSON (shim/record's TestPatchSize)
// and about 300 as stored (TestExplainThousandPods; the CRD makes the pods map atomic for
// field management, so managedFields no longer list every entry's fields, which took 510
// bytes an entry), so 2,000 take about 600 KB and 2,500 about 750 KB, well under etcd's
// 1.5 MiB request limit.
const (
	DefaultRecordMaxPods = 2000
	MaxRecordMaxPods     = 2500
)

// RecordsConfig is where the JobRecords go.
type RecordsConfig struct {
	// Client writes them; nil: no records (explain then says the story is incomplete).
	Client dynamic.Interface
	// Metadata, when set, sends the records' patches, whose answer is then only the
	// record's metadata (the API server's PartialObjectMetadata) instead of the whole
	// record, up to 750 KB of JSON that the dynamic client would decode into maps for
	// the one field the shim reads of it, its resourceVersion. shim.Run sets it; without
	// it (unit tests on a fake dynamic client) Client patches.
	Metadata metadata.Interface
	// MaxPods bounds the entries of one record (default DefaultRecordMaxPods).
	MaxPods int
}

// records writes the JobRecords and remembers the last version of each it wrote or read,
// so that a write is one merge patch (no read) while nobody else writes the record.
type records struct {
	client  dynamic.NamespaceableResourceInterface // nil: off
	meta    metadata.Getter                        // nil: client patches
	max     int
	metrics *metrics.Metrics

	mu sync.Mutex
	// stored is the last known record of each Job by key (namespace/name), nil entries
	// never; a record whose JobUID is not the Job's is an earlier Job's.
	stored map[string]*v1alpha1.JobRecord
}

func newRecords(cfg RecordsConfig, m *metrics.Metrics) *records {
	r := &records{max: cfg.MaxPods, metrics: m, stored: map[string]*v1alpha1.JobRecord{}}
	if r.max <= 0 {
		r.max = DefaultRecordMaxPods
	}
	if cfg.Client != nil {
		r.client = cfg.Client.Resource(v1alpha1.GroupVersionResource)
		if cfg.Metadata != nil {
			r.meta = cfg.Metadata.Resource(v1alpha1.GroupVersionResource)
		}
	}
	return r
}

// patch sends a merge patch of the Job's record and returns the record's resourceVersion
// after it.
func (r *records) patch(ctx context.Context, job *batchv1.Job, patch []byte) (string, error) {
	if r.meta != nil {
		m, err := r.meta.Namespace(job.Namespace).Patch(ctx, job.Name, types.MergePatchType, patch, metav1.PatchOptions{})
		if err != nil {
			return "", err
		}
		return m.ResourceVersion, nil
	}
	u, err := r.client.Namespace(job.Namespace).Patch(ctx, job.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil {
		return "", err
	}
	return u.GetResourceVersion(), nil
}

// forget drops what is known of the Job's record (the Job is gone or finished).
func (r *records) forget(key string) {
	r.mu.Lock()
	delete(r.stored, key)
	r.mu.Unlock()
}

// write stores the entries in the Job's record. Only one sync of a Job runs at a time
// (the queue's guarantee), so the only concurrent writer is another shim (a leader
// change), which the resourceVersion precondition of the patch catches.
func (r *records) write(ctx context.Context, key string, job *batchv1.Job, entries []v1alpha1.Entry) error {
	if r.client == nil || len(entries) == 0 {
		return nil
	}
	logger := klog.FromContext(ctx)
	r.mu.Lock()
	stored := r.stored[key]
	r.mu.Unlock()
	if stored == nil {
		var err error
		if stored, err = r.get(ctx, job); err != nil {
			return err
		}
	}
	if stored != nil && stored.JobUID != job.UID {
		// An earlier Job of the same name, not yet collected: its record goes now.
		err := r.client.Namespace(job.Namespace).Delete(ctx, job.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &stored.UID}})
		r.count("delete", err)
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting the JobRecord of an earlier Job %s: %w", key, err)
		}
		stored = nil
	}
	if stored == nil {
		o := v1alpha1.New(job.Namespace, job.Name, job.UID)
		var rec v1alpha1.Record
		rec.Add(r.max, entries...)
		o.Set(rec, r.max)
		created, n, err := r.create(ctx, o)
		r.count("create", err)
		if err != nil {
			r.forget(key)
			if apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("creating the JobRecord of Job %s: it exists already; will read it next sync: %w", key, err)
			}
			return fmt.Errorf("creating the JobRecord of Job %s: %w", key, err)
		}
		r.written(key, created, "create", n, entries)
		logger.V(4).Info("Created the Job's record", "entries", len(entries), "bytes", n)
		return nil
	}
	next := stored.Record()
	next.Add(r.max, entries...)
	patch, ok, err := record.MergePatch(stored, next, r.max)
	if err != nil || !ok {
		return err
	}
	rv, err := r.patch(ctx, job, patch)
	r.count("patch", err)
	if err != nil {
		// Whatever the record is now, the next sync reads it.
		r.forget(key)
		return fmt.Errorf("writing the JobRecord of Job %s: %w", key, err)
	}
	// The record as stored, from the patch and the answer's resourceVersion.
	o, err := record.Patched(stored, patch, rv)
	if err != nil {
		r.forget(key)
		return err
	}
	r.written(key, o, "patch", len(patch), entries)
	logger.V(4).Info("Wrote the Job's record", "entries", len(next.Entries), "patchBytes", len(patch))
	return nil
}

// get reads the Job's record; nil when there is none.
func (r *records) get(ctx context.Context, job *batchv1.Job) (*v1alpha1.JobRecord, error) {
	u, err := r.client.Namespace(job.Namespace).Get(ctx, job.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the JobRecord of Job %s/%s: %w", job.Namespace, job.Name, err)
	}
	return fromUnstructured(u)
}

func (r *records) create(ctx context.Context, o *v1alpha1.JobRecord) (*v1alpha1.JobRecord, int, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
	if err != nil {
		return nil, 0, err
	}
	u := &unstructured.Unstructured{Object: m}
	body, err := u.MarshalJSON()
	if err != nil {
		return nil, 0, err
	}
	res, err := r.client.Namespace(o.Namespace).Create(ctx, u, metav1.CreateOptions{})
	if err != nil {
		return nil, 0, err
	}
	created, err := fromUnstructured(res)
	return created, len(body), err
}

func (r *records) written(key string, o *v1alpha1.JobRecord, verb string, bytes int, entries []v1alpha1.Entry) {
	r.mu.Lock()
	r.stored[key] = o
	r.mu.Unlock()
	if r.metrics != nil {
		r.metrics.JobRecordBytes.WithLabelValues(verb).Add(float64(bytes))
		for _, e := range entries {
			r.metrics.JobRecordEntries.WithLabelValues(string(e.Outcome)).Inc()
		}
	}
}

func (r *records) count(verb string, err error) {
	if r.metrics == nil {
		return
	}
	result := metrics.ResultSuccess
	switch {
	case apierrors.IsConflict(err):
		result = "conflict"
	case err != nil:
		result = metrics.ResultError
	}
	r.metrics.JobRecordWrites.WithLabelValues(verb, result).Inc()
}

// errUnreadable marks a stored record that does not decode: retrying does not mend it.
var errUnreadable = errors.New("unreadable JobRecord")

func fromUnstructured(u *unstructured.Unstructured) (*v1alpha1.JobRecord, error) {
	o, err := v1alpha1.FromUnstructured(u)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errUnreadable, err)
	}
	return o, nil
}

// recordRetriable says whether a failed record write may succeed if tried again: a
// conflict, a record that exists already (read next time), the API server busy, slow or
// failing, or no answer. A refusal (forbidden, the resource not served, the namespace
// being deleted, the object invalid or too large) is not.
func recordRetriable(err error) bool {
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return !errors.Is(err, errUnreadable) // else: no answer from the API server
	}
	return apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) || apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) ||
		apierrors.IsTooManyRequests(err) || apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err) || apierrors.IsUnexpectedServerError(err)
}

// recordWrite is a JobRecord write running beside the rest of a sync.
type recordWrite struct {
	done    chan struct{}
	err     error // set before done closes
	settled bool
	result  error
	logger  klog.Logger
	entries int
}

// startRecordWrite writes the entries to the Job's record in the background.
func (c *Controller) startRecordWrite(ctx context.Context, key string, job *batchv1.Job, entries []v1alpha1.Entry) *recordWrite {
	w := &recordWrite{done: make(chan struct{}), logger: klog.FromContext(ctx), entries: len(entries)}
	if len(entries) == 0 {
		close(w.done)
		return w
	}
	go func() {
		defer close(w.done)
		w.err = c.jobRecords.write(ctx, key, job, entries)
	}()
	return w
}

func (w *recordWrite) wait() { <-w.done }

// settle waits for the write and returns the error that must stop the pods from going: a
// failure a retry may mend. Any other failure is logged, once, and let go.
func (w *recordWrite) settle() error {
	w.wait()
	if w.settled {
		return w.result
	}
	w.settled = true
	switch err := w.err; {
	case err == nil:
	case recordRetriable(err):
		w.result = err
	case apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause):
		w.logger.V(2).Info("Not recording the pods that leave the Job: its namespace is being deleted", "pods", w.entries)
	default:
		w.logger.Error(err, "Not recording the pods that leave the Job; going on without", "pods", w.entries)
	}
	return w.result
}
