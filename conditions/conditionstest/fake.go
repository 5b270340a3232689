// Package conditionstest has a hand-written fake of the conditions.PodPatcher seam for
// unit tests of the code that writes pods (conditions' writers, the agent's stamper).
package conditionstest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
)

// PodsResource is the resource named in the fake's API errors.
var PodsResource = schema.GroupResource{Resource: "pods"}

// Patch is one patch the fake received.
type Patch struct {
	Namespace, Name string
	Type            types.PatchType
	Body            string
	Subresources    []string
}

// FakePods keeps pods in memory and patches them like the API server: it applies
// strategic merge patches (with the real strategicpatch code) and JSON merge patches,
// checks the metadata.resourceVersion and metadata.uid preconditions (409 Conflict on
// mismatch), bumps the resourceVersion on every write and answers 404 for pods it does
// not have. It counts GETs, records patches and can inject errors. Safe for concurrent
// use through its methods; the exported fields are for single-goroutine tests.
type FakePods struct {
	mu   sync.Mutex
	pods map[string]*corev1.Pod
	rv   int

	// Gets counts GET calls; Patches records every patch, in order.
	Gets    int
	Patches []Patch
	// PatchErrs are returned by the next patches, in order, before the patch is looked
	// at; a nil entry lets that patch through.
	PatchErrs []error
	// GetErr is returned by every GET when set.
	GetErr error
	// BeforePatch runs at the start of every patch that got past PatchErrs, for example to
	// play the kubelet writing between a read and a write.
	BeforePatch func(f *FakePods)
}

// NewFakePods returns a fake holding copies of pods, at resourceVersion counter 100.
func NewFakePods(pods ...*corev1.Pod) *FakePods {
	f := &FakePods{pods: map[string]*corev1.Pod{}, rv: 100}
	for _, p := range pods {
		f.pods[p.Namespace+"/"+p.Name] = p.DeepCopy()
	}
	return f
}

// GetPod implements conditions.PodPatcher.
func (f *FakePods) GetPod(_ context.Context, namespace, name string) (*corev1.Pod, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Gets++
	if f.GetErr != nil {
		return nil, f.GetErr
	}
	p, ok := f.pods[namespace+"/"+name]
	if !ok {
		return nil, apierrors.NewNotFound(PodsResource, name)
	}
	return p.DeepCopy(), nil
}

// PatchPod implements conditions.PodPatcher.
func (f *FakePods) PatchPod(_ context.Context, namespace, name string, pt types.PatchType, data []byte, subresources ...string) (*corev1.Pod, error) {
	f.mu.Lock()
	f.Patches = append(f.Patches, Patch{namespace, name, pt, string(data), subresources})
	if len(f.PatchErrs) > 0 {
		err := f.PatchErrs[0]
		f.PatchErrs = f.PatchErrs[1:]
		if err != nil {
			f.mu.Unlock()
			return nil, err
		}
	}
	before := f.BeforePatch
	f.mu.Unlock()
	if before != nil {
		before(f)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	cur, ok := f.pods[namespace+"/"+name]
	if !ok {
		return nil, apierrors.NewNotFound(PodsResource, name)
	}
	var pre struct {
		Metadata struct {
			ResourceVersion string    `json:"resourceVersion"`
			UID             types.UID `json:"uid"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(data, &pre); err != nil {
		return nil, apierrors.NewBadRequest(err.Error())
	}
	if pre.Metadata.ResourceVersion != "" && pre.Metadata.ResourceVersion != cur.ResourceVersion {
		return nil, apierrors.NewConflict(PodsResource, name, errors.New("the object has been modified"))
	}
	if pre.Metadata.UID != "" && pre.Metadata.UID != cur.UID {
		return nil, apierrors.NewConflict(PodsResource, name, errors.New("uid mismatch"))
	}
	orig, err := json.Marshal(cur)
	if err != nil {
		return nil, err
	}
	var patched []byte
	switch pt {
	case types.StrategicMergePatchType:
		patched, err = strategicpatch.StrategicMergePatch(orig, data, corev1.Pod{})
	case types.MergePatchType:
		patched, err = mergePatch(orig, data)
	default:
		err = fmt.Errorf("unsupported patch type %q", pt)
	}
	if err != nil {
		return nil, apierrors.NewBadRequest(err.Error())
	}
	next := &corev1.Pod{}
	if err := json.Unmarshal(patched, next); err != nil {
		return nil, apierrors.NewBadRequest(err.Error())
	}
	f.store(next)
	return next.DeepCopy(), nil
}

// Store writes p as the new version of its pod, with a new resourceVersion (another
// writer, such as the kubelet).
func (f *FakePods) Store(p *corev1.Pod) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.store(p.DeepCopy())
}

func (f *FakePods) store(p *corev1.Pod) {
	f.rv++
	p.ResourceVersion = strconv.Itoa(f.rv)
	f.pods[p.Namespace+"/"+p.Name] = p
}

// Delete removes the pod (another writer deleted it).
func (f *FakePods) Delete(namespace, name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.pods, namespace+"/"+name)
}

// Pod returns a copy of the stored pod, nil when there is none.
func (f *FakePods) Pod(namespace, name string) *corev1.Pod {
	f.mu.Lock()
	defer f.mu.Unlock()
	if p := f.pods[namespace+"/"+name]; p != nil {
		return p.DeepCopy()
	}
	return nil
}

// PatchCount is the number of patches received.
func (f *FakePods) PatchCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.Patches)
}

// SetPatchErrs sets PatchErrs.
func (f *FakePods) SetPatchErrs(errs ...error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.PatchErrs = errs
}

// PatchSummaries returns "subresource:body" for each patch, for failure messages.
func (f *FakePods) PatchSummaries() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, p := range f.Patches {
		out = append(out, strings.Join(p.Subresources, "/")+":"+p.Body)
	}
	return out
}

// mergePatch is RFC 7386 JSON merge patch, enough for the fake.
func mergePatch(orig, patch []byte) ([]byte, error) {
	var o, p any
	if err := json.Unmarshal(orig, &o); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(patch, &p); err != nil {
		return nil, err
	}
	return json.Marshal(mergeValue(o, p))
}

func mergeValue(orig, patch any) any {
	pm, ok := patch.(map[string]any)
	if !ok {
		return patch
	}
	om, ok := orig.(map[string]any)
	if !ok {
		om = map[string]any{}
	}
	for k, v := range pm {
		if v == nil {
			delete(om, k)
			continue
		}
		om[k] = mergeValue(om[k], v)
	}
	return om
}
