package v1alpha1

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/coroner-dev/coroner/conditions"
)

// The JobRecord is the structured story of a Job's pods that coroner-shim keeps for
// `coronerctl explain` (docs/explain.md): for each pod that leaves the Job (its tracking
// finalizer removed once it is counted, or deleted by the shim before it finished), one
// Entry with its last phase, its cause of death (conditions.Cause, the one cause coroner
// tells everywhere), the failure decision (the podFailurePolicy rule and what it did) and
// why the shim deleted it. Events stay for people; explain reads the record instead of
// parsing Event text, which client-go's correlator thins out after 25 Events per Job and
// the API server forgets after an hour.
//
// The record is bounded (Record.Add's max): past it, entries go oldest first in the order
// Succeeded, Deleted, Ignored, Failed (the failures explain a failed Job longest), and
// Dropped counts what went, so that explain can say plainly that the story is incomplete
// and by how much.
//
// It is stored as one JobRecord object per Job (namespaced, CRD in
// deploy/base/jobrecord-crd.yaml), named after the Job and owned by it, so that the
// garbage collector deletes it with the Job.

// Outcome is what a pod's end did to its Job.
type Outcome string

const (
	// OutcomeSucceeded: counted in status.succeeded.
	OutcomeSucceeded Outcome = "Succeeded"
	// OutcomeFailed: counted in status.failed (no rule matched, Count, FailIndex or
	// FailJob; Entry.Action says which rule acted).
	OutcomeFailed Outcome = "Failed"
	// OutcomeIgnored: an Ignore rule matched; not counted, the pod replaced.
	OutcomeIgnored Outcome = "Ignored"
	// OutcomeDeleted: deleted by the shim before it finished (an excess pod, the Job
	// suspended or finished); not counted.
	OutcomeDeleted Outcome = "Deleted"
)

// dropOrder is the order in which outcomes lose their oldest entries past the bound.
var dropOrder = []Outcome{OutcomeSucceeded, OutcomeDeleted, OutcomeIgnored, OutcomeFailed}

// Entry is one pod as the shim last saw it.
type Entry struct {
	Name string `json:"name"`
	// Index is the completion index (Indexed Jobs).
	Index *int32          `json:"index,omitempty"`
	Node  string          `json:"node,omitempty"`
	Phase corev1.PodPhase `json:"phase"`
	// Outcome is what the pod's end did to the Job.
	Outcome Outcome `json:"outcome"`
	// Cause is the pod's cause of death (conditions.CauseOfDeath); nil for a pod that
	// succeeded.
	Cause *conditions.Cause `json:"cause,omitempty"`
	// Rule and Action are the podFailurePolicy rule that matched a failed pod and its
	// action; nil and empty when no rule matched.
	Rule   *int32                         `json:"rule,omitempty"`
	Action batchv1.PodFailurePolicyAction `json:"action,omitempty"`
	// Grown is, for a failure that grew the memory of its replacement
	// (coroner.dev/oom-memory-retry) instead of going to the pod failure policy, what grew
	// (Growth.String): "container main 24Mi -> 48Mi".
	Grown string `json:"grown,omitempty"`
	// Consequence is what the failure did to the Job, as the shim's Event said it ("index
	// 2 failed", "counts towards the backoff limit"); empty for other outcomes.
	Consequence string `json:"consequence,omitempty"`
	// Why is the shim's reason for deleting the pod ("excess pod", "job suspended", ...);
	// empty when the shim did not delete it.
	Why string `json:"why,omitempty"`
	// Restarts is the sum of the containers' restart counts; LastExit, when a container
	// restarted in place (restartPolicy OnFailure), its latest exit before the state the
	// pod was recorded in (a crash-looping pod's telling exit).
	Restarts int32                 `json:"restarts,omitempty"`
	LastExit *conditions.CauseExit `json:"lastExit,omitempty"`
	// Finished is when the pod's last container exited, when known.
	Finished *metav1.Time `json:"finished,omitempty"`
	// Recorded is when the shim recorded the entry.
	Recorded metav1.Time `json:"recorded"`
}

// Equivalent reports whether e and o say the same, Recorded aside (re-recording an
// unchanged pod is no change).
func (e Entry) Equivalent(o Entry) bool {
	e.Recorded, o.Recorded = metav1.Time{}, metav1.Time{}
	return equality.Semantic.DeepEqual(e, o)
}

// DeepCopy copies e.
func (e Entry) DeepCopy() Entry {
	c := e
	copyPtr := func(p *int32) *int32 {
		if p == nil {
			return nil
		}
		v := *p
		return &v
	}
	c.Index, c.Rule = copyPtr(e.Index), copyPtr(e.Rule)
	if e.Cause != nil {
		cause := *e.Cause
		if e.Cause.Exit != nil {
			exit := *e.Cause.Exit
			cause.Exit = &exit
		}
		c.Cause = &cause
	}
	if e.LastExit != nil {
		x := *e.LastExit
		c.LastExit = &x
	}
	if e.Finished != nil {
		c.Finished = e.Finished.DeepCopy()
	}
	return c
}

// Record is the entries of a Job's pods, oldest recorded first: the JobRecord's pods as a
// list.
type Record struct {
	Entries []Entry `json:"entries,omitempty"`
	// Dropped counts the entries dropped to stay within the bound, by outcome.
	Dropped map[Outcome]int32 `json:"dropped,omitempty"`
}

// Add puts the entries into r (a pod recorded again replaces its entry: the later word
// wins, but keeps the Why of the shim's deletion, as a pod deleted while its Job fails is
// recorded when it is deleted and again when it is counted) and then drops entries past
// max (0: no bound), oldest first in the order Succeeded, Deleted, Ignored, Failed. It
// reports whether r changed.
func (r *Record) Add(max int, entries ...Entry) bool {
	changed := false
	for _, e := range entries {
		if i := slices.IndexFunc(r.Entries, func(x Entry) bool { return x.Name == e.Name }); i >= 0 {
			if e.Why == "" {
				e.Why = r.Entries[i].Why
			}
			if r.Entries[i].Equivalent(e) {
				continue
			}
			r.Entries = slices.Delete(r.Entries, i, i+1)
		}
		r.Entries = append(r.Entries, e)
		changed = true
	}
	if max <= 0 {
		return changed
	}
	for _, o := range dropOrder {
		for len(r.Entries) > max {
			i := slices.IndexFunc(r.Entries, func(x Entry) bool { return x.Outcome == o })
			if i < 0 {
				break
			}
			r.Entries = slices.Delete(r.Entries, i, i+1)
			if r.Dropped == nil {
				r.Dropped = map[Outcome]int32{}
			}
			r.Dropped[o]++
			changed = true
		}
	}
	return changed
}

// Find returns the entry of the pod named name, if the record has it.
func (r *Record) Find(name string) (Entry, bool) {
	if i := slices.IndexFunc(r.Entries, func(x Entry) bool { return x.Name == name }); i >= 0 {
		return r.Entries[i], true
	}
	return Entry{}, false
}

// DroppedTotal is the number of entries dropped past the bound.
func (r *Record) DroppedTotal() int32 {
	var n int32
	for _, v := range r.Dropped {
		n += v
	}
	return n
}

// JobRecord is the stored object. The pods are a map keyed by pod name rather than a list
// so that a write is a JSON merge patch of only the entries that changed (a few hundred
// bytes per pod) rather than the whole record, which for a Job of thousands of pods is
// hundreds of kilobytes.
type JobRecord struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	// JobUID is the UID of the Job the record is of; a record of an earlier Job of the
	// same name is not this Job's.
	JobUID types.UID `json:"jobUID"`
	// MaxPods is the bound the shim kept the record within when it last wrote it.
	MaxPods int32 `json:"maxPods,omitempty"`
	// Pods are the entries by pod name.
	Pods map[string]Entry `json:"pods,omitempty"`
	// Dropped counts the entries dropped past MaxPods, by outcome.
	Dropped map[Outcome]int32 `json:"dropped,omitempty"`
}

// New is the empty JobRecord of a Job, owned by it (not a controller reference: the Job
// controls its pods, the record only goes with it; blockOwnerDeletion is left unset so
// that the shim needs no update right on jobs/finalizers).
func New(namespace, jobName string, jobUID types.UID) *JobRecord {
	return &JobRecord{
		TypeMeta: metav1.TypeMeta{APIVersion: Group + "/" + Version, Kind: Kind},
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: jobName, OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "batch/v1", Kind: "Job", Name: jobName, UID: jobUID,
		}}},
		JobUID: jobUID,
	}
}

// Record is the stored entries as a Record, oldest recorded first (ties by name: the
// stored times have a resolution of one second).
func (o *JobRecord) Record() Record {
	r := Record{Entries: slices.Collect(maps.Values(o.Pods)), Dropped: maps.Clone(o.Dropped)}
	slices.SortFunc(r.Entries, func(a, b Entry) int {
		if c := a.Recorded.Compare(b.Recorded.Time); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return r
}

// Set makes o hold r, bounded by max.
func (o *JobRecord) Set(r Record, max int) {
	o.Pods = make(map[string]Entry, len(r.Entries))
	for _, e := range r.Entries {
		o.Pods[e.Name] = e
	}
	o.Dropped = maps.Clone(r.Dropped)
	o.MaxPods = int32(max)
}

// DeepCopy copies o.
func (o *JobRecord) DeepCopy() *JobRecord {
	if o == nil {
		return nil
	}
	c := &JobRecord{TypeMeta: o.TypeMeta, JobUID: o.JobUID, MaxPods: o.MaxPods, Dropped: maps.Clone(o.Dropped)}
	o.DeepCopyInto(&c.ObjectMeta)
	if o.Pods != nil {
		c.Pods = make(map[string]Entry, len(o.Pods))
		for k, e := range o.Pods {
			c.Pods[k] = e.DeepCopy()
		}
	}
	return c
}

// DeepCopyObject makes JobRecord a runtime.Object.
func (o *JobRecord) DeepCopyObject() runtime.Object { return o.DeepCopy() }

// FromUnstructured reads a JobRecord as a dynamic client returns it.
func FromUnstructured(u *unstructured.Unstructured) (*JobRecord, error) {
	var o JobRecord
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &o); err != nil {
		return nil, fmt.Errorf("reading the JobRecord %s/%s: %w", u.GetNamespace(), u.GetName(), err)
	}
	return &o, nil
}
