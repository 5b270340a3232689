package record

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

// The stored form: one JobRecord object (coroner.dev/v1alpha1, namespaced, CRD in
// deploy/base/jobrecord-crd.yaml) per Job, named after the Job and owned by it, so that
// the garbage collector deletes it with the Job.
const (
	Group    = "coroner.dev"
	Version  = "v1alpha1"
	Kind     = "JobRecord"
	Resource = "jobrecords"
)

// GroupVersionResource is the JobRecords' resource, for a dynamic client.
var GroupVersionResource = schema.GroupVersionResource{Group: Group, Version: Version, Resource: Resource}

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

// MergePatch is the JSON merge patch that turns old into next: the entries added or
// changed, null for those dropped, the drop counts and the bound, and old's
// resourceVersion, which makes the API server refuse the patch (409 Conflict) when the
// stored record is no longer old. ok is false when there is nothing to write.
func MergePatch(old *JobRecord, next Record, max int) (patch []byte, ok bool, err error) {
	pods := map[string]any{}
	names := map[string]bool{}
	for _, e := range next.Entries {
		names[e.Name] = true
		if was, found := old.Pods[e.Name]; found && equal(was, e) {
			continue
		}
		pods[e.Name] = e
	}
	for name := range old.Pods {
		if !names[name] {
			pods[name] = nil
		}
	}
	dropped := maps.Equal(old.Dropped, next.Dropped) || (len(old.Dropped) == 0 && len(next.Dropped) == 0)
	if len(pods) == 0 && dropped && old.MaxPods == int32(max) {
		return nil, false, nil
	}
	body := map[string]any{"metadata": map[string]any{"resourceVersion": old.ResourceVersion}, "maxPods": max}
	if len(pods) > 0 {
		body["pods"] = pods
	}
	if !dropped {
		body["dropped"] = next.Dropped
	}
	patch, err = json.Marshal(body)
	return patch, err == nil, err
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

// FromUnstructured reads a JobRecord as a dynamic client returns it.
func FromUnstructured(u *unstructured.Unstructured) (*JobRecord, error) {
	var o JobRecord
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &o); err != nil {
		return nil, fmt.Errorf("reading the JobRecord %s/%s: %w", u.GetNamespace(), u.GetName(), err)
	}
	return &o, nil
}
