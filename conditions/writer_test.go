package conditions

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
)

// fakePods is a PodPatcher that stores pods and plays the API server's part
// that matters here: it applies strategic merge patches with the real
// strategicpatch code and JSON merge patches to metadata.annotations, checks
// the metadata.resourceVersion and metadata.uid preconditions (409 Conflict on
// mismatch), bumps the resourceVersion on every write, and answers 404 for
// pods it does not have. It counts calls, records patches, and can inject
// errors.
type fakePods struct {
	pods map[string]*corev1.Pod
	rv   int

	gets    int
	patches []recordedPatch

	// patchErrs are returned by the next patches, in order, before the patch
	// is looked at; a nil entry lets that patch through.
	patchErrs []error
	// getErr is returned by every GET when set.
	getErr error
	// beforePatch runs at the start of every patch (after patchErrs), for
	// example to play the kubelet writing between coroner's read and write.
	beforePatch func(f *fakePods)
}

type recordedPatch struct {
	namespace, name string
	patchType       types.PatchType
	body            string
	subresources    []string
}

func newFakePods(pods ...*corev1.Pod) *fakePods {
	f := &fakePods{pods: map[string]*corev1.Pod{}, rv: 100}
	for _, p := range pods {
		f.pods[p.Namespace+"/"+p.Name] = p.DeepCopy()
	}
	return f
}

var podsResource = schema.GroupResource{Resource: "pods"}

func (f *fakePods) GetPod(_ context.Context, namespace, name string) (*corev1.Pod, error) {
	f.gets++
	if f.getErr != nil {
		return nil, f.getErr
	}
	p, ok := f.pods[namespace+"/"+name]
	if !ok {
		return nil, apierrors.NewNotFound(podsResource, name)
	}
	return p.DeepCopy(), nil
}

func (f *fakePods) PatchPod(_ context.Context, namespace, name string, pt types.PatchType, data []byte, subresources ...string) (*corev1.Pod, error) {
	f.patches = append(f.patches, recordedPatch{namespace, name, pt, string(data), subresources})
	if len(f.patchErrs) > 0 {
		err := f.patchErrs[0]
		f.patchErrs = f.patchErrs[1:]
		if err != nil {
			return nil, err
		}
	}
	if f.beforePatch != nil {
		f.beforePatch(f)
	}
	key := namespace + "/" + name
	cur, ok := f.pods[key]
	if !ok {
		return nil, apierrors.NewNotFound(podsResource, name)
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
		return nil, apierrors.NewConflict(podsResource, name, errors.New("the object has been modified"))
	}
	if pre.Metadata.UID != "" && pre.Metadata.UID != cur.UID {
		return nil, apierrors.NewConflict(podsResource, name, errors.New("uid mismatch"))
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

// store writes p as the new version of the pod, with a new resourceVersion.
func (f *fakePods) store(p *corev1.Pod) {
	f.rv++
	p.ResourceVersion = strconv.Itoa(f.rv)
	f.pods[p.Namespace+"/"+p.Name] = p
}

func (f *fakePods) pod(namespace, name string) *corev1.Pod {
	return f.pods[namespace+"/"+name]
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

const (
	ns  = "team-a"
	pod = "job-0-abcde"
)

var fixedNow = func() metav1.Time { return t1 }

// runningPod is the pod as an informer would have it: resourceVersion 10, a
// Ready condition owned by the kubelet.
func runningPod() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: pod, Namespace: ns, UID: "uid-1", ResourceVersion: "10",
			Annotations: map[string]string{"owner": "someone"},
		},
		Status: corev1.PodStatus{
			Phase:      corev1.PodRunning,
			Conditions: []corev1.PodCondition{ready(corev1.ConditionTrue)},
		},
	}
}

func withPhase(p *corev1.Pod, phase corev1.PodPhase) *corev1.Pod {
	p.Status.Phase = phase
	return p
}

func withCondition(p *corev1.Pod, c corev1.PodCondition) *corev1.Pod {
	Set(&p.Status, c, t0)
	return p
}

var (
	oomCondition = corev1.PodCondition{
		Type: OOMKilled, Status: corev1.ConditionTrue, Reason: ReasonMemoryLimitExceeded,
		Message: "container main exceeded its memory limit",
	}
	zombieCondition = corev1.PodCondition{
		Type: ForcefullyTerminated, Status: corev1.ConditionTrue, Reason: ReasonNodeUnreachable,
		Message: "Pod forcefully terminated after 90s: node node-a is unreachable",
	}
	conflict = apierrors.NewConflict(podsResource, pod, errors.New("the object has been modified"))
)

// call is one writer call, for tables.
type call func(ctx context.Context, c PodPatcher, p *corev1.Pod) (bool, error)

func ensureCondition(cond corev1.PodCondition) call {
	return func(ctx context.Context, c PodPatcher, p *corev1.Pod) (bool, error) {
		return EnsurePodCondition(ctx, c, p, cond, fixedNow)
	}
}

func ensurePhase(phase corev1.PodPhase, conds ...corev1.PodCondition) call {
	return func(ctx context.Context, c PodPatcher, p *corev1.Pod) (bool, error) {
		return EnsurePodPhase(ctx, c, p, phase, fixedNow, conds...)
	}
}

func ensureAnnotation(key, value string) call {
	return func(ctx context.Context, c PodPatcher, p *corev1.Pod) (bool, error) {
		return EnsurePodAnnotation(ctx, c, p, key, value)
	}
}

func TestWriters(t *testing.T) {
	const (
		oomJSON    = `{"type":"coroner.dev/OOMKilled","status":"True","lastTransitionTime":"2026-01-02T03:04:05Z","reason":"MemoryLimitExceeded","message":"container main exceeded its memory limit"}`
		zombieJSON = `{"type":"coroner.dev/ForcefullyTerminated","status":"True","lastTransitionTime":"2026-01-02T03:04:05Z","reason":"NodeUnreachable","message":"Pod forcefully terminated after 90s: node node-a is unreachable"}`
	)
	statusSub := []string{"status"}

	cases := []struct {
		name string
		// stored is the pod on the fake server; given is the caller's copy
		// (defaults to stored).
		stored, given *corev1.Pod
		setup         func(f *fakePods)
		call          call

		wantChanged bool
		wantErr     func(error) bool
		wantGets    int
		wantPatches []recordedPatch
		// check looks at the stored pod afterwards.
		check func(t *testing.T, p *corev1.Pod)
	}{
		{
			name:        "condition already there: no API call",
			stored:      withCondition(runningPod(), oomCondition),
			call:        ensureCondition(oomCondition),
			wantChanged: false,
		},
		{
			name:        "new condition: one status patch with only that condition and the preconditions",
			stored:      runningPod(),
			call:        ensureCondition(oomCondition),
			wantChanged: true,
			wantPatches: []recordedPatch{{ns, pod, types.StrategicMergePatchType,
				`{"metadata":{"resourceVersion":"10","uid":"uid-1"},"status":{"conditions":[` + oomJSON + `]}}`, statusSub}},
			check: func(t *testing.T, p *corev1.Pod) {
				want := []corev1.PodCondition{ready(corev1.ConditionTrue), {
					Type: OOMKilled, Status: corev1.ConditionTrue, Reason: ReasonMemoryLimitExceeded,
					Message: oomCondition.Message, LastTransitionTime: t1Trunc,
				}}
				// Conditions are a map keyed by type (listType=map); a strategic
				// merge patch without $setElementOrder puts the patched
				// conditions first.
				if diff := cmp.Diff(want, p.Status.Conditions, sortConditions); diff != "" {
					t.Errorf("stored conditions (-want +got):\n%s", diff)
				}
			},
		},
		{
			name: "changed reason: patch keeps lastTransitionTime",
			stored: withCondition(runningPod(), corev1.PodCondition{
				Type: DisruptionTarget, Status: corev1.ConditionTrue, Reason: ReasonEvictionByEvictionAPI, Message: "Eviction API: evicting",
			}),
			call: ensureCondition(corev1.PodCondition{
				Type: DisruptionTarget, Status: corev1.ConditionTrue, Reason: ReasonTerminationByKubelet, Message: "kubelet evicted",
			}),
			wantChanged: true,
			wantPatches: []recordedPatch{{ns, pod, types.StrategicMergePatchType,
				`{"metadata":{"resourceVersion":"10","uid":"uid-1"},"status":{"conditions":[{"type":"DisruptionTarget","status":"True","lastTransitionTime":"2026-01-02T03:00:00Z","reason":"TerminationByKubelet","message":"kubelet evicted"}]}}`, statusSub}},
		},
		{
			name: "conflict: re-read, recompute against the fresh pod, patch with its resourceVersion",
			// The kubelet changed the pod since the caller's informer saw it.
			stored:      withPhase(runningPod(), corev1.PodRunning),
			given:       runningPod(),
			setup:       func(f *fakePods) { f.store(f.pod(ns, pod).DeepCopy()) }, // resourceVersion 10 -> 101
			call:        ensureCondition(oomCondition),
			wantChanged: true,
			wantGets:    1,
			wantPatches: []recordedPatch{
				{ns, pod, types.StrategicMergePatchType, `{"metadata":{"resourceVersion":"10","uid":"uid-1"},"status":{"conditions":[` + oomJSON + `]}}`, statusSub},
				{ns, pod, types.StrategicMergePatchType, `{"metadata":{"resourceVersion":"101","uid":"uid-1"},"status":{"conditions":[` + oomJSON + `]}}`, statusSub},
			},
			check: func(t *testing.T, p *corev1.Pod) {
				if !IsTrue(&p.Status, OOMKilled) || !IsTrue(&p.Status, corev1.PodReady) {
					t.Errorf("stored conditions = %v, want Ready and OOMKilled", p.Status.Conditions)
				}
			},
		},
		{
			name:        "injected conflict on the first patch: GET then a second patch",
			stored:      runningPod(),
			setup:       func(f *fakePods) { f.patchErrs = []error{conflict} },
			call:        ensureCondition(oomCondition),
			wantChanged: true,
			wantGets:    1,
			wantPatches: []recordedPatch{
				{ns, pod, types.StrategicMergePatchType, `{"metadata":{"resourceVersion":"10","uid":"uid-1"},"status":{"conditions":[` + oomJSON + `]}}`, statusSub},
				{ns, pod, types.StrategicMergePatchType, `{"metadata":{"resourceVersion":"10","uid":"uid-1"},"status":{"conditions":[` + oomJSON + `]}}`, statusSub},
			},
		},
		{
			name:   "conflict, and the fresh pod already has the condition: no second patch",
			stored: runningPod(),
			setup: func(f *fakePods) {
				f.store(withCondition(f.pod(ns, pod).DeepCopy(), oomCondition))
			},
			call:        ensureCondition(oomCondition),
			wantChanged: false,
			wantGets:    1,
			wantPatches: []recordedPatch{
				{ns, pod, types.StrategicMergePatchType, `{"metadata":{"resourceVersion":"10","uid":"uid-1"},"status":{"conditions":[` + oomJSON + `]}}`, statusSub},
			},
		},
		{
			name:   "conflicts every time: bounded, the Conflict is returned",
			stored: runningPod(),
			setup: func(f *fakePods) {
				f.patchErrs = []error{conflict, conflict, conflict, conflict, conflict, conflict, conflict}
			},
			call:        ensureCondition(oomCondition),
			wantErr:     apierrors.IsConflict,
			wantGets:    4,
			wantPatches: repeat(recordedPatch{ns, pod, types.StrategicMergePatchType, `{"metadata":{"resourceVersion":"10","uid":"uid-1"},"status":{"conditions":[` + oomJSON + `]}}`, statusSub}, 5),
		},
		{
			name:        "pod deleted: patch answers 404, ErrPodGone",
			stored:      nil,
			given:       runningPod(),
			call:        ensureCondition(oomCondition),
			wantErr:     isGoneAndNotFound,
			wantPatches: []recordedPatch{{ns, pod, types.StrategicMergePatchType, `{"metadata":{"resourceVersion":"10","uid":"uid-1"},"status":{"conditions":[` + oomJSON + `]}}`, statusSub}},
		},
		{
			name:   "pod deleted after a conflict: GET answers 404, ErrPodGone",
			stored: runningPod(),
			setup: func(f *fakePods) {
				f.patchErrs = []error{conflict}
				delete(f.pods, ns+"/"+pod)
			},
			call:        ensureCondition(oomCondition),
			wantErr:     isGoneAndNotFound,
			wantGets:    1,
			wantPatches: []recordedPatch{{ns, pod, types.StrategicMergePatchType, `{"metadata":{"resourceVersion":"10","uid":"uid-1"},"status":{"conditions":[` + oomJSON + `]}}`, statusSub}},
		},
		{
			name: "pod re-created with the same name: ErrPodGone, the new pod is not written",
			stored: func() *corev1.Pod {
				p := runningPod()
				p.UID, p.ResourceVersion = "uid-2", "50"
				return p
			}(),
			given:       runningPod(),
			call:        ensureCondition(oomCondition),
			wantErr:     func(err error) bool { return errors.Is(err, ErrPodGone) },
			wantGets:    1,
			wantPatches: []recordedPatch{{ns, pod, types.StrategicMergePatchType, `{"metadata":{"resourceVersion":"10","uid":"uid-1"},"status":{"conditions":[` + oomJSON + `]}}`, statusSub}},
		},
		{
			name:   "other errors are returned without retry",
			stored: runningPod(),
			setup: func(f *fakePods) {
				f.patchErrs = []error{apierrors.NewForbidden(podsResource, pod, errors.New("VAP: not your node"))}
			},
			call:        ensureCondition(oomCondition),
			wantErr:     apierrors.IsForbidden,
			wantPatches: []recordedPatch{{ns, pod, types.StrategicMergePatchType, `{"metadata":{"resourceVersion":"10","uid":"uid-1"},"status":{"conditions":[` + oomJSON + `]}}`, statusSub}},
		},
		{
			name:   "GET errors other than 404 are returned",
			stored: runningPod(),
			setup: func(f *fakePods) {
				f.patchErrs = []error{conflict}
				f.getErr = apierrors.NewServiceUnavailable("etcd")
			},
			call:        ensureCondition(oomCondition),
			wantErr:     apierrors.IsServiceUnavailable,
			wantGets:    1,
			wantPatches: []recordedPatch{{ns, pod, types.StrategicMergePatchType, `{"metadata":{"resourceVersion":"10","uid":"uid-1"},"status":{"conditions":[` + oomJSON + `]}}`, statusSub}},
		},
		{
			name:   "caller's pod without resourceVersion: read first, never write without a precondition",
			stored: runningPod(),
			given: func() *corev1.Pod {
				p := runningPod()
				p.ResourceVersion = ""
				return p
			}(),
			call:        ensureCondition(oomCondition),
			wantChanged: true,
			wantGets:    1,
			wantPatches: []recordedPatch{{ns, pod, types.StrategicMergePatchType, `{"metadata":{"resourceVersion":"10","uid":"uid-1"},"status":{"conditions":[` + oomJSON + `]}}`, statusSub}},
		},

		// EnsurePodPhase
		{
			name:        "phase: Running to Failed with a condition, one patch",
			stored:      runningPod(),
			call:        ensurePhase(corev1.PodFailed, zombieCondition),
			wantChanged: true,
			wantPatches: []recordedPatch{{ns, pod, types.StrategicMergePatchType,
				`{"metadata":{"resourceVersion":"10","uid":"uid-1"},"status":{"phase":"Failed","conditions":[` + zombieJSON + `]}}`, statusSub}},
			check: func(t *testing.T, p *corev1.Pod) {
				if p.Status.Phase != corev1.PodFailed || !IsTrue(&p.Status, ForcefullyTerminated) || !IsTrue(&p.Status, corev1.PodReady) {
					t.Errorf("stored status = %+v, want phase Failed, ForcefullyTerminated and Ready", p.Status)
				}
			},
		},
		{
			name:        "phase: conditions already as wanted are not sent",
			stored:      withCondition(withPhase(runningPod(), corev1.PodPending), zombieCondition),
			call:        ensurePhase(corev1.PodFailed, zombieCondition, oomCondition),
			wantChanged: true,
			wantPatches: []recordedPatch{{ns, pod, types.StrategicMergePatchType,
				`{"metadata":{"resourceVersion":"10","uid":"uid-1"},"status":{"phase":"Failed","conditions":[` + oomJSON + `]}}`, statusSub}},
		},
		{
			name:   "phase: a condition type given twice is sent once, as last given",
			stored: runningPod(),
			call: ensurePhase(corev1.PodFailed, oomCondition, corev1.PodCondition{
				Type: OOMKilled, Status: corev1.ConditionTrue, Reason: ReasonMemoryLimitExceeded, Message: "container main exceeded its memory limit",
			}, corev1.PodCondition{
				Type: OOMKilled, Status: corev1.ConditionTrue, Reason: ReasonMemoryLimitExceeded, Message: "second",
			}),
			wantChanged: true,
			wantPatches: []recordedPatch{{ns, pod, types.StrategicMergePatchType,
				`{"metadata":{"resourceVersion":"10","uid":"uid-1"},"status":{"phase":"Failed","conditions":[{"type":"coroner.dev/OOMKilled","status":"True","lastTransitionTime":"2026-01-02T03:04:05Z","reason":"MemoryLimitExceeded","message":"second"}]}}`, statusSub}},
		},
		{
			name:        "phase: already Failed, nothing written, not even the conditions",
			stored:      withPhase(runningPod(), corev1.PodFailed),
			call:        ensurePhase(corev1.PodFailed, zombieCondition),
			wantChanged: false,
		},
		{
			name:        "phase: Succeeded is never overwritten with Failed",
			stored:      withPhase(runningPod(), corev1.PodSucceeded),
			call:        ensurePhase(corev1.PodFailed, zombieCondition),
			wantChanged: false,
			check: func(t *testing.T, p *corev1.Pod) {
				if p.Status.Phase != corev1.PodSucceeded || Find(&p.Status, ForcefullyTerminated) != nil {
					t.Errorf("stored status = %+v, want untouched Succeeded", p.Status)
				}
			},
		},
		{
			name:   "phase: the kubelet writes Succeeded between our read and write, the kubelet wins",
			stored: runningPod(),
			setup: func(f *fakePods) {
				f.beforePatch = func(f *fakePods) {
					if f.pod(ns, pod).Status.Phase == corev1.PodRunning {
						f.store(withPhase(f.pod(ns, pod).DeepCopy(), corev1.PodSucceeded))
					}
				}
			},
			call:        ensurePhase(corev1.PodFailed, zombieCondition),
			wantChanged: false,
			wantGets:    1,
			wantPatches: []recordedPatch{{ns, pod, types.StrategicMergePatchType,
				`{"metadata":{"resourceVersion":"10","uid":"uid-1"},"status":{"phase":"Failed","conditions":[` + zombieJSON + `]}}`, statusSub}},
			check: func(t *testing.T, p *corev1.Pod) {
				if p.Status.Phase != corev1.PodSucceeded || Find(&p.Status, ForcefullyTerminated) != nil {
					t.Errorf("stored status = %+v, want the kubelet's Succeeded, untouched", p.Status)
				}
			},
		},
		{
			name:    "phase: a non-terminal phase is refused without an API call",
			stored:  runningPod(),
			call:    ensurePhase(corev1.PodRunning),
			wantErr: func(err error) bool { return err != nil && !errors.Is(err, ErrPodGone) },
		},

		// EnsurePodAnnotation
		{
			name:        "annotation already there: no API call",
			stored:      runningPod(),
			call:        ensureAnnotation("owner", "someone"),
			wantChanged: false,
		},
		{
			name:        "new annotation: one merge patch on the pod itself",
			stored:      runningPod(),
			call:        ensureAnnotation(AnnotationExitHistory, `[{"c":"main","code":3}]`),
			wantChanged: true,
			wantPatches: []recordedPatch{{ns, pod, types.MergePatchType,
				`{"metadata":{"annotations":{"coroner.dev/exit-history":"[{\"c\":\"main\",\"code\":3}]"},"resourceVersion":"10","uid":"uid-1"}}`, nil}},
			check: func(t *testing.T, p *corev1.Pod) {
				want := map[string]string{"owner": "someone", AnnotationExitHistory: `[{"c":"main","code":3}]`}
				if diff := cmp.Diff(want, p.Annotations); diff != "" {
					t.Errorf("stored annotations (-want +got):\n%s", diff)
				}
			},
		},
		{
			name:        "changed annotation value after a conflict",
			stored:      runningPod(),
			setup:       func(f *fakePods) { f.store(f.pod(ns, pod).DeepCopy()) },
			call:        ensureAnnotation("owner", "coroner"),
			wantChanged: true,
			wantGets:    1,
			wantPatches: []recordedPatch{
				{ns, pod, types.MergePatchType, `{"metadata":{"annotations":{"owner":"coroner"},"resourceVersion":"10","uid":"uid-1"}}`, nil},
				{ns, pod, types.MergePatchType, `{"metadata":{"annotations":{"owner":"coroner"},"resourceVersion":"101","uid":"uid-1"}}`, nil},
			},
		},
		{
			name:        "annotation: an empty value is a value",
			stored:      runningPod(),
			call:        ensureAnnotation(AnnotationSafeToForcefullyDelete, ""),
			wantChanged: true,
			wantPatches: []recordedPatch{{ns, pod, types.MergePatchType,
				`{"metadata":{"annotations":{"coroner.dev/safe-to-forcefully-delete":""},"resourceVersion":"10","uid":"uid-1"}}`, nil}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var f *fakePods
			if tc.stored != nil {
				f = newFakePods(tc.stored)
			} else {
				f = newFakePods()
			}
			given := tc.given
			if given == nil {
				given = tc.stored.DeepCopy()
			}
			if tc.setup != nil {
				tc.setup(f)
			}
			givenBefore := given.DeepCopy()

			changed, err := tc.call(context.Background(), f, given)

			if tc.wantErr == nil && err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if tc.wantErr != nil && !tc.wantErr(err) {
				t.Fatalf("error = %v, not the expected kind", err)
			}
			if changed != tc.wantChanged {
				t.Errorf("changed = %v, want %v", changed, tc.wantChanged)
			}
			if f.gets != tc.wantGets {
				t.Errorf("GET calls = %d, want %d", f.gets, tc.wantGets)
			}
			if diff := cmp.Diff(tc.wantPatches, f.patches, cmp.AllowUnexported(recordedPatch{})); diff != "" {
				t.Errorf("patches (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(givenBefore, given); diff != "" {
				t.Errorf("the caller's pod was modified (-before +after):\n%s", diff)
			}
			if tc.check != nil {
				tc.check(t, f.pod(ns, pod))
			}
		})
	}
}

var sortConditions = cmpopts.SortSlices(func(a, b corev1.PodCondition) bool { return a.Type < b.Type })

func repeat(p recordedPatch, n int) []recordedPatch {
	out := make([]recordedPatch, n)
	for i := range out {
		out[i] = p
	}
	return out
}

func isGoneAndNotFound(err error) bool {
	return errors.Is(err, ErrPodGone) && apierrors.IsNotFound(err)
}

func TestWritersRejectBadArguments(t *testing.T) {
	f := newFakePods(runningPod())
	ctx := context.Background()
	if _, err := EnsurePodCondition(ctx, f, runningPod(), corev1.PodCondition{Status: corev1.ConditionTrue}, fixedNow); err == nil {
		t.Error("EnsurePodCondition with an empty type: no error")
	}
	if _, err := EnsurePodPhase(ctx, f, runningPod(), corev1.PodFailed, fixedNow, corev1.PodCondition{}); err == nil {
		t.Error("EnsurePodPhase with an empty condition type: no error")
	}
	if _, err := EnsurePodAnnotation(ctx, f, runningPod(), "", "v"); err == nil {
		t.Error("EnsurePodAnnotation with an empty key: no error")
	}
	if _, err := EnsurePodCondition(ctx, f, nil, oomCondition, fixedNow); err == nil {
		t.Error("EnsurePodCondition with a nil pod: no error")
	}
	if f.gets != 0 || len(f.patches) != 0 {
		t.Errorf("API calls on bad arguments: %d GETs, %d patches", f.gets, len(f.patches))
	}
}

// TestClientsetPodPatcher checks the adapter sends what a real API server
// expects: a GET of the pod, and a patch of the status subresource with the
// field manager.
func TestClientsetPodPatcher(t *testing.T) {
	cs := fake.NewClientset(runningPod())
	p := NewPodPatcher(cs, "coroner-test")

	changed, err := EnsurePodPhase(context.Background(), p, runningPod(), corev1.PodFailed, fixedNow, zombieCondition)
	if err != nil || !changed {
		t.Fatalf("EnsurePodPhase() = %v, %v; want true, nil", changed, err)
	}
	actions := cs.Actions()
	if len(actions) != 1 {
		t.Fatalf("actions = %v, want one patch", actions)
	}
	pa, ok := actions[0].(clienttesting.PatchAction)
	if !ok {
		t.Fatalf("action = %#v, want a patch", actions[0])
	}
	if pa.GetVerb() != "patch" || pa.GetSubresource() != "status" || pa.GetPatchType() != types.StrategicMergePatchType ||
		pa.GetNamespace() != ns || pa.GetName() != pod {
		t.Errorf("patch = %s %s/%s subresource %q type %q, want patch %s/%s subresource status, strategic merge",
			pa.GetVerb(), pa.GetNamespace(), pa.GetName(), pa.GetSubresource(), pa.GetPatchType(), ns, pod)
	}
	if pa, ok := actions[0].(clienttesting.PatchActionImpl); ok && pa.PatchOptions.FieldManager != "coroner-test" {
		t.Errorf("field manager = %q, want coroner-test", pa.PatchOptions.FieldManager)
	}

	got, err := p.GetPod(context.Background(), ns, pod)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status.Phase != corev1.PodFailed || !IsTrue(&got.Status, ForcefullyTerminated) || !IsTrue(&got.Status, corev1.PodReady) {
		t.Errorf("pod status after patch = %+v, want Failed with ForcefullyTerminated and Ready", got.Status)
	}
}
