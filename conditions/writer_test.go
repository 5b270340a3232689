package conditions

import (
	"context"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/coroner-dev/coroner/conditions/conditionstest"
)

// The fake API server of these tests (shared with the agent's stamper tests).
type fakePods = conditionstest.FakePods

// recordedPatch is a patch as these tests spell them.
type recordedPatch struct {
	namespace, name string
	patchType       types.PatchType
	body            string
	subresources    []string
}

func patchesOf(f *fakePods) []recordedPatch {
	var out []recordedPatch
	for _, p := range f.Patches {
		out = append(out, recordedPatch{p.Namespace, p.Name, p.Type, p.Body, p.Subresources})
	}
	return out
}

var (
	newFakePods  = conditionstest.NewFakePods
	podsResource = conditionstest.PodsResource
)

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

func ensureConditions(conds ...corev1.PodCondition) call {
	return func(ctx context.Context, c PodPatcher, p *corev1.Pod) (bool, error) {
		written, err := EnsurePodConditions(ctx, c, p, fixedNow, conds...)
		return len(written) > 0, err
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
			name:        "two conditions: one status patch with both",
			stored:      runningPod(),
			call:        ensureConditions(oomCondition, zombieCondition),
			wantChanged: true,
			wantPatches: []recordedPatch{{ns, pod, types.StrategicMergePatchType,
				`{"metadata":{"resourceVersion":"10","uid":"uid-1"},"status":{"conditions":[` + oomJSON + `,` + zombieJSON + `]}}`, statusSub}},
			check: func(t *testing.T, p *corev1.Pod) {
				if !IsTrue(&p.Status, OOMKilled) || !IsTrue(&p.Status, ForcefullyTerminated) {
					t.Errorf("stored conditions = %v, want both", p.Status.Conditions)
				}
			},
		},
		{
			name:        "two conditions, one already there: the patch carries the other only",
			stored:      withCondition(runningPod(), oomCondition),
			call:        ensureConditions(oomCondition, zombieCondition),
			wantChanged: true,
			wantPatches: []recordedPatch{{ns, pod, types.StrategicMergePatchType,
				`{"metadata":{"resourceVersion":"10","uid":"uid-1"},"status":{"conditions":[` + zombieJSON + `]}}`, statusSub}},
		},
		{
			name:        "a type given twice: the first is written",
			stored:      runningPod(),
			call:        ensureConditions(oomCondition, corev1.PodCondition{Type: OOMKilled, Status: corev1.ConditionFalse, Reason: "Other"}),
			wantChanged: true,
			wantPatches: []recordedPatch{{ns, pod, types.StrategicMergePatchType,
				`{"metadata":{"resourceVersion":"10","uid":"uid-1"},"status":{"conditions":[` + oomJSON + `]}}`, statusSub}},
		},
		{
			name:        "both conditions already there: no API call",
			stored:      withCondition(withCondition(runningPod(), oomCondition), zombieCondition),
			call:        ensureConditions(oomCondition, zombieCondition),
			wantChanged: false,
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
			setup:       func(f *fakePods) { f.Store(f.Pod(ns, pod).DeepCopy()) }, // resourceVersion 10 -> 101
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
			setup:       func(f *fakePods) { f.PatchErrs = []error{conflict} },
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
				f.Store(withCondition(f.Pod(ns, pod).DeepCopy(), oomCondition))
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
				f.PatchErrs = []error{conflict, conflict, conflict, conflict, conflict, conflict, conflict}
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
				f.PatchErrs = []error{conflict}
				f.Delete(ns, pod)
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
				f.PatchErrs = []error{apierrors.NewForbidden(podsResource, pod, errors.New("VAP: not your node"))}
			},
			call:        ensureCondition(oomCondition),
			wantErr:     apierrors.IsForbidden,
			wantPatches: []recordedPatch{{ns, pod, types.StrategicMergePatchType, `{"metadata":{"resourceVersion":"10","uid":"uid-1"},"status":{"conditions":[` + oomJSON + `]}}`, statusSub}},
		},
		{
			name:   "GET errors other than 404 are returned",
			stored: runningPod(),
			setup: func(f *fakePods) {
				f.PatchErrs = []error{conflict}
				f.GetErr = apierrors.NewServiceUnavailable("etcd")
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
				f.BeforePatch = func(f *fakePods) {
					if f.Pod(ns, pod).Status.Phase == corev1.PodRunning {
						f.Store(withPhase(f.Pod(ns, pod).DeepCopy(), corev1.PodSucceeded))
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
			name:        "new annotation: one merge patch on the pod's status (it stores metadata too)",
			stored:      runningPod(),
			call:        ensureAnnotation(AnnotationExitHistory, `[{"c":"main","code":3}]`),
			wantChanged: true,
			wantPatches: []recordedPatch{{ns, pod, types.MergePatchType,
				`{"metadata":{"annotations":{"coroner.dev/exit-history":"[{\"c\":\"main\",\"code\":3}]"},"resourceVersion":"10","uid":"uid-1"}}`, statusSub}},
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
			setup:       func(f *fakePods) { f.Store(f.Pod(ns, pod).DeepCopy()) },
			call:        ensureAnnotation("owner", "coroner"),
			wantChanged: true,
			wantGets:    1,
			wantPatches: []recordedPatch{
				{ns, pod, types.MergePatchType, `{"metadata":{"annotations":{"owner":"coroner"},"resourceVersion":"10","uid":"uid-1"}}`, statusSub},
				{ns, pod, types.MergePatchType, `{"metadata":{"annotations":{"owner":"coroner"},"resourceVersion":"101","uid":"uid-1"}}`, statusSub},
			},
		},
		{
			name:        "annotation: an empty value is a value",
			stored:      runningPod(),
			call:        ensureAnnotation(AnnotationSafeToForcefullyDelete, ""),
			wantChanged: true,
			wantPatches: []recordedPatch{{ns, pod, types.MergePatchType,
				`{"metadata":{"annotations":{"coroner.dev/safe-to-forcefully-delete":""},"resourceVersion":"10","uid":"uid-1"}}`, statusSub}},
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
			if f.Gets != tc.wantGets {
				t.Errorf("GET calls = %d, want %d", f.Gets, tc.wantGets)
			}
			if diff := cmp.Diff(tc.wantPatches, patchesOf(f), cmp.AllowUnexported(recordedPatch{})); diff != "" {
				t.Errorf("patches (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(givenBefore, given); diff != "" {
				t.Errorf("the caller's pod was modified (-before +after):\n%s", diff)
			}
			if tc.check != nil {
				tc.check(t, f.Pod(ns, pod))
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
	if f.Gets != 0 || len(f.Patches) != 0 {
		t.Errorf("API calls on bad arguments: %d GETs, %d patches", f.Gets, len(f.Patches))
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
