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
		was, found := old.Pods[e.Name]
		switch {
		case !found:
			pods[e.Name] = e
		case !equal(was, e):
			// A merge patch merges an object into the stored one: the fields the changed
			// entry no longer has must be sent as null, or the stored entry keeps them.
			v, err := replacing(was, e)
			if err != nil {
				return nil, false, err
			}
			pods[e.Name] = v
		}
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

// replacing is the merge patch value that turns the stored entry was into e: e's fields,
// and null for each field, at any depth, that was has and e does not.
func replacing(was, e Entry) (map[string]any, error) {
	var before, after map[string]any
	for _, c := range []struct {
		e   Entry
		out *map[string]any
	}{{was, &before}, {e, &after}} {
		b, err := json.Marshal(c.e)
		if err != nil {
			return nil, err
		}
		if err := json.Unmarshal(b, c.out); err != nil {
			return nil, err
		}
	}
	nullMissing(before, after)
	return after, nil
}

// nullMissing sets to nil each key of after that before has and after lacks, and does the
// same inside the objects both have under a key.
func nullMissing(before, after map[string]any) {
	for k, v := range before {
		w, ok := after[k]
		if !ok {
			after[k] = nil
			continue
		}
		if bm, ok := v.(map[string]any); ok {
			if am, ok := w.(map[string]any); ok {
				nullMissing(bm, am)
			}
		}
	}
}

// Patched is o after the API server applied patch, one of MergePatch's, and stored it at
// resourceVersion: the fields MergePatch writes (pods, dropped, maxPods) merged as JSON
// merge patch merges them (RFC 7386: a null removes a key), the entries decoded from the
// patch's JSON as the API server stores them (times to the second). It spares the shim
// decoding the API server's answer, the whole record (about 600 KB at 2,000 entries),
// after each write: 1.8 s of the shim's 39 s of CPU on bench-shim's indexed-10k. o is not
// changed; the result shares o's entries, which are never changed in place.
func (o *JobRecord) Patched(patch []byte, resourceVersion string) (*JobRecord, error) {
	var p struct {
		MaxPods *int32             `json:"maxPods"`
		Pods    map[string]*Entry  `json:"pods"`
		Dropped map[Outcome]*int32 `json:"dropped"`
	}
	if err := json.Unmarshal(patch, &p); err != nil {
		return nil, fmt.Errorf("reading the JobRecord patch: %w", err)
	}
	out := *o
	out.ObjectMeta = *o.ObjectMeta.DeepCopy()
	out.ResourceVersion = resourceVersion
	if p.MaxPods != nil {
		out.MaxPods = *p.MaxPods
	}
	if p.Pods != nil {
		out.Pods = mergeMap(o.Pods, p.Pods)
	}
	if p.Dropped != nil {
		out.Dropped = mergeMap(o.Dropped, p.Dropped)
	}
	return &out, nil
}

// mergeMap is a copy of m with a merge patch's map merged in: a nil value (the patch's
// null) removes its key, any other sets it.
func mergeMap[K comparable, V any](m map[K]V, patch map[K]*V) map[K]V {
	out := make(map[K]V, len(m)+len(patch))
	maps.Copy(out, m)
	for k, v := range patch {
		if v == nil {
			delete(out, k)
		} else {
			out[k] = *v
		}
	}
	return out
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
