package classify

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/agent/cgroup"
	"github.com/coroner-dev/coroner/agent/exithistory"
	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/test/wrappers"
)

var now = finished.Add(3 * time.Second)

func limitVerdict() Verdict {
	return Verdict{Kind: LimitOOM, Container: "main", KillerLevel: cgroup.LevelContainer, Limit: 20 * mi, Peak: 20 * mi}
}

func nodeVerdict() Verdict {
	return Verdict{Kind: NodeOOM, Container: "main", Killer: burstable, KillerLevel: cgroup.LevelQoS}
}

func mainExit(code int32, restarts int32) Exit {
	return Exit{Container: "main", ContainerID: cid, ExitCode: code, Reason: "Error", StartedAt: started, FinishedAt: finished, RestartCount: restarts}
}

func neverPod() *wrappers.PodWrapper {
	return wrappers.MakePod("p", "default").Phase(corev1.PodRunning)
}

func restartingPod(policy corev1.RestartPolicy) *wrappers.PodWrapper {
	w := neverPod()
	w.Spec.RestartPolicy = policy
	return w
}

func deleting(w *wrappers.PodWrapper) *wrappers.PodWrapper {
	w.DeletionTimestamp = &metav1.Time{Time: finished.Add(30 * time.Second)}
	w.DeletionGracePeriodSeconds = ptr.To[int64](30)
	return w
}

func historyOf(t *testing.T, entries ...v1alpha1.Exit) string {
	t.Helper()
	s, err := v1alpha1.FormatExitHistory(entries)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestStampsForExit(t *testing.T) {
	limitMsg := "container main was OOM-killed at its memory limit of 20Mi (peak 20Mi)"
	nodeMsg := "container main was killed by the node's OOM killer: memory cgroup " + burstable + " (the burstable QoS class) ran out of memory"
	ltt := metav1.NewTime(finished)
	oomKilled := &corev1.PodCondition{Type: conditions.OOMKilled, Status: corev1.ConditionTrue,
		Reason: conditions.ReasonMemoryLimitExceeded, Message: limitMsg, LastTransitionTime: ltt}
	nodeOOM := &corev1.PodCondition{Type: conditions.DisruptionTarget, Status: corev1.ConditionTrue,
		Reason: conditions.ReasonNodeOOMKill, Message: nodeMsg, LastTransitionTime: ltt}
	hist := func(e ...v1alpha1.Exit) *Annotation {
		return &Annotation{Key: conditions.AnnotationExitHistory, Value: historyOf(t, e...)}
	}
	entry := func(code int32, restarts int32, oom string) v1alpha1.Exit {
		return v1alpha1.Exit{Container: "main", ExitCode: code, Reason: "Error", FinishedAt: finished, RestartCount: restarts, OOM: oom}
	}

	cases := map[string]struct {
		pod     *corev1.Pod
		verdict Verdict
		exit    Exit
		want    []Stamp
		// wantMessageHas is checked on the last stamp instead of comparing
		// messages, when set.
		wantMessageHas string
	}{
		"nil pod": {
			verdict: limitVerdict(),
			exit:    mainExit(137, 0),
		},
		"limit OOM of a restartPolicy Never pod: the OOMKilled condition at the finish time": {
			pod:     neverPod().Obj(),
			verdict: limitVerdict(),
			exit:    mainExit(137, 0),
			want:    []Stamp{{Kind: KindLimitOOM, Reason: conditions.ReasonMemoryLimitExceeded, Condition: oomKilled, Message: limitMsg}},
		},
		"limit OOM when OOMKilled is already True: the first stays": {
			pod:     neverPod().Condition(conditions.OOMKilled, corev1.ConditionTrue).Obj(),
			verdict: limitVerdict(),
			exit:    mainExit(137, 0),
		},
		"node OOM of a restartPolicy Never pod: DisruptionTarget NodeOOMKill": {
			pod:     neverPod().Obj(),
			verdict: nodeVerdict(),
			exit:    mainExit(137, 0),
			want:    []Stamp{{Kind: KindNodeOOM, Reason: conditions.ReasonNodeOOMKill, Condition: nodeOOM, Message: nodeMsg}},
		},
		"node OOM when DisruptionTarget is already True: whoever was first stays": {
			pod:     neverPod().Condition(conditions.DisruptionTarget, corev1.ConditionTrue).Obj(),
			verdict: nodeVerdict(),
			exit:    mainExit(137, 0),
		},
		"node OOM when DisruptionTarget is False (a failed eviction): set True": {
			pod:     neverPod().Condition(conditions.DisruptionTarget, corev1.ConditionFalse).Obj(),
			verdict: nodeVerdict(),
			exit:    mainExit(137, 0),
			want:    []Stamp{{Kind: KindNodeOOM, Reason: conditions.ReasonNodeOOMKill, Condition: nodeOOM, Message: nodeMsg}},
		},
		"node OOM of a container restarted in place (Always): no condition, the history says node": {
			pod:     restartingPod(corev1.RestartPolicyAlways).Obj(),
			verdict: nodeVerdict(),
			exit:    mainExit(137, 2),
			want: []Stamp{{Kind: KindExitHistory, Reason: "Recorded", Annotation: hist(entry(137, 2, v1alpha1.ExitOOMNode)),
				Message: "exit 137 of container main recorded in coroner.dev/exit-history"}},
		},
		"node OOM of an OnFailure pod whose PID 1 exited 0: not restarted, so the condition too": {
			pod:     restartingPod(corev1.RestartPolicyOnFailure).Obj(),
			verdict: nodeVerdict(),
			exit:    func() Exit { e := mainExit(0, 1); e.Reason = "Error"; return e }(),
			want: []Stamp{
				{Kind: KindNodeOOM, Reason: conditions.ReasonNodeOOMKill, Condition: nodeOOM, Message: nodeMsg},
				{Kind: KindExitHistory, Reason: "Recorded", Annotation: hist(entry(0, 1, v1alpha1.ExitOOMNode)),
					Message: "exit 0 of container main recorded in coroner.dev/exit-history"},
			},
		},
		"node OOM of a pod being deleted: the condition, no history": {
			pod:     deleting(restartingPod(corev1.RestartPolicyAlways)).Obj(),
			verdict: nodeVerdict(),
			exit:    mainExit(137, 0),
			want:    []Stamp{{Kind: KindNodeOOM, Reason: conditions.ReasonNodeOOMKill, Condition: nodeOOM, Message: nodeMsg}},
		},
		"limit OOM of an OnFailure pod: the condition and the history": {
			pod:     restartingPod(corev1.RestartPolicyOnFailure).Obj(),
			verdict: limitVerdict(),
			exit:    mainExit(137, 3),
			want: []Stamp{
				{Kind: KindLimitOOM, Reason: conditions.ReasonMemoryLimitExceeded, Condition: oomKilled, Message: limitMsg},
				{Kind: KindExitHistory, Reason: "Recorded", Annotation: hist(entry(137, 3, v1alpha1.ExitOOMLimit)),
					Message: "exit 137 of container main recorded in coroner.dev/exit-history"},
			},
		},
		"unknown OOM: a stamp for the metric that writes nothing": {
			pod:     neverPod().Obj(),
			verdict: Verdict{Kind: UnknownOOM, Container: "main", Basis: "OOM kill without evidence of whose limit"},
			exit:    mainExit(137, 0),
			want: []Stamp{{Kind: KindUnknownOOM, Reason: "Unknown",
				Message: "container main was OOM-killed; whose limit is unknown (OOM kill without evidence of whose limit)"}},
		},
		"not an OOM, restartPolicy Never: nothing": {
			pod:     neverPod().Obj(),
			verdict: Verdict{Kind: NotOOM},
			exit:    mainExit(3, 0),
		},
		"not an OOM, OnFailure: the exit history only": {
			pod:     restartingPod(corev1.RestartPolicyOnFailure).Obj(),
			verdict: Verdict{Kind: NotOOM},
			exit:    mainExit(42, 0),
			want: []Stamp{{Kind: KindExitHistory, Reason: "Recorded", Annotation: hist(entry(42, 0, "")),
				Message: "exit 42 of container main recorded in coroner.dev/exit-history"}},
		},
		"the same exit observed again: nothing": {
			pod: restartingPod(corev1.RestartPolicyOnFailure).
				Annotation(conditions.AnnotationExitHistory, historyOf(t, entry(42, 0, ""))).Obj(),
			verdict: Verdict{Kind: NotOOM},
			exit:    mainExit(42, 0),
		},
		"a malformed history is replaced, saying so": {
			pod: restartingPod(corev1.RestartPolicyOnFailure).
				Annotation(conditions.AnnotationExitHistory, "main=42").Obj(),
			verdict:        Verdict{Kind: NotOOM},
			exit:           mainExit(42, 0),
			want:           []Stamp{{Kind: KindExitHistory, Reason: "Replaced", Annotation: hist(entry(42, 0, ""))}},
			wantMessageHas: "malformed exit history",
		},
		"a terminal OnFailure pod: no history": {
			pod:     restartingPod(corev1.RestartPolicyOnFailure).Phase(corev1.PodFailed).Obj(),
			verdict: Verdict{Kind: NotOOM},
			exit:    mainExit(1, 0),
		},
		"a Never pod whose container has its own restartPolicy: history": {
			pod: func() *corev1.Pod {
				p := neverPod().Obj()
				p.Spec.Containers[0].RestartPolicy = ptr.To(corev1.ContainerRestartPolicyOnFailure)
				return p
			}(),
			verdict: Verdict{Kind: NotOOM},
			exit:    mainExit(1, 0),
			want: []Stamp{{Kind: KindExitHistory, Reason: "Recorded", Annotation: hist(entry(1, 0, "")),
				Message: "exit 1 of container main recorded in coroner.dev/exit-history"}},
		},
		"a native sidecar's exit in a Never pod: history (the kubelet restarts it in place)": {
			pod: func() *corev1.Pod {
				p := neverPod().Obj()
				p.Spec.InitContainers = []corev1.Container{{Name: "proxy", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways)}}
				return p
			}(),
			verdict: Verdict{Kind: NotOOM},
			exit:    Exit{Container: "proxy", ExitCode: 1, RestartCount: 0, FinishedAt: finished},
			want: []Stamp{{Kind: KindExitHistory, Reason: "Recorded",
				Annotation: hist(v1alpha1.Exit{Container: "proxy", ExitCode: 1, FinishedAt: finished, RestartCount: 0}),
				Message:    "exit 1 of container proxy recorded in coroner.dev/exit-history"}},
		},
		"a native sidecar's node OOM kill in a Never pod: history only, no DisruptionTarget (it restarts in place)": {
			pod: func() *corev1.Pod {
				p := neverPod().Obj()
				p.Spec.InitContainers = []corev1.Container{{Name: "proxy", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways)}}
				return p
			}(),
			verdict: Verdict{Kind: NodeOOM},
			exit:    Exit{Container: "proxy", ExitCode: 137, Reason: "OOMKilled", RestartCount: 2, FinishedAt: finished},
			want: []Stamp{{Kind: KindExitHistory, Reason: "Recorded",
				Annotation: hist(v1alpha1.Exit{Container: "proxy", ExitCode: 137, Reason: "OOMKilled", FinishedAt: finished, RestartCount: 2, OOM: v1alpha1.ExitOOMNode}),
				Message:    "exit 137 of container proxy recorded in coroner.dev/exit-history"}},
		},
		"an ordinary init container's exit in a Never pod: no history": {
			pod: func() *corev1.Pod {
				p := neverPod().Obj()
				p.Spec.InitContainers = []corev1.Container{{Name: "setup"}}
				return p
			}(),
			verdict: Verdict{Kind: NotOOM},
			exit:    Exit{Container: "setup", ExitCode: 1, RestartCount: 0, FinishedAt: finished},
		},
		"an exit of a container not in the spec: no history": {
			pod:     restartingPod(corev1.RestartPolicyAlways).Obj(),
			verdict: Verdict{Kind: NotOOM},
			exit:    Exit{Container: "debugger-x", ExitCode: 1, FinishedAt: finished},
		},
		"an exit without a finish time: the condition's time is now": {
			pod:     neverPod().Obj(),
			verdict: limitVerdict(),
			exit:    func() Exit { e := mainExit(137, 0); e.FinishedAt = time.Time{}; return e }(),
			want: []Stamp{{Kind: KindLimitOOM, Reason: conditions.ReasonMemoryLimitExceeded, Message: limitMsg,
				Condition: func() *corev1.PodCondition { c := *oomKilled; c.LastTransitionTime = metav1.NewTime(now); return &c }()}},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var before *corev1.Pod
			if tc.pod != nil {
				before = tc.pod.DeepCopy()
			}
			got := StampsForExit(tc.pod, tc.verdict, tc.exit, now, ExitOptions{})
			if tc.wantMessageHas != "" && len(got) > 0 {
				if !strings.Contains(got[len(got)-1].Message, tc.wantMessageHas) {
					t.Errorf("Message = %q, want it to contain %q", got[len(got)-1].Message, tc.wantMessageHas)
				}
				got[len(got)-1].Message = ""
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("StampsForExit() mismatch (-want +got):\n%s", diff)
			}
			if tc.pod != nil && !cmp.Equal(before, tc.pod) {
				t.Errorf("StampsForExit() modified the pod")
			}
		})
	}
}

func TestStampsForExitHistoryLimits(t *testing.T) {
	pod := restartingPod(corev1.RestartPolicyAlways).Obj()
	for i := range int32(5) {
		e := mainExit(1, i)
		e.FinishedAt = finished.Add(time.Duration(i) * time.Minute)
		stamps := StampsForExit(pod, Verdict{}, e, now, ExitOptions{History: exithistory.Limits{MaxEntries: 3}})
		if len(stamps) != 1 || stamps[0].Annotation == nil {
			t.Fatalf("exit %d: stamps = %+v, want one annotation", i, stamps)
		}
		if pod.Annotations == nil {
			pod.Annotations = map[string]string{}
		}
		pod.Annotations[conditions.AnnotationExitHistory] = stamps[0].Annotation.Value
	}
	entries, err := v1alpha1.ParseExitHistory(pod.Annotations[conditions.AnnotationExitHistory])
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 3 || entries[0].RestartCount != 2 || entries[2].RestartCount != 4 {
		t.Errorf("history = %+v, want restarts 2, 3, 4", entries)
	}
}

func TestContainerWillRestart(t *testing.T) {
	withInit := func(w *wrappers.PodWrapper, c corev1.Container) *corev1.Pod {
		p := w.Obj()
		p.Spec.InitContainers = append(p.Spec.InitContainers, c)
		return p
	}
	withRules := func(policy corev1.ContainerRestartPolicy, op corev1.ContainerRestartRuleOnExitCodesOperator, action corev1.ContainerRestartRuleAction, codes ...int32) *corev1.Pod {
		p := neverPod().Obj()
		p.Spec.Containers[0].RestartPolicy = &policy
		p.Spec.Containers[0].RestartPolicyRules = []corev1.ContainerRestartRule{{Action: action,
			ExitCodes: &corev1.ContainerRestartRuleOnExitCodes{Operator: op, Values: codes}}}
		return p
	}
	cases := map[string]struct {
		pod       *corev1.Pod
		container string
		code      int32
		want      bool
	}{
		"Never":                              {pod: neverPod().Obj(), container: "main", code: 1, want: false},
		"OnFailure after a failure":          {pod: restartingPod(corev1.RestartPolicyOnFailure).Obj(), container: "main", code: 137, want: true},
		"OnFailure after exit 0":             {pod: restartingPod(corev1.RestartPolicyOnFailure).Obj(), container: "main", code: 0, want: false},
		"Always after exit 0":                {pod: restartingPod(corev1.RestartPolicyAlways).Obj(), container: "main", code: 0, want: true},
		"empty policy is Always":             {pod: restartingPod("").Obj(), container: "main", code: 0, want: true},
		"being deleted":                      {pod: deleting(restartingPod(corev1.RestartPolicyAlways)).Obj(), container: "main", code: 1, want: false},
		"terminal":                           {pod: restartingPod(corev1.RestartPolicyAlways).Phase(corev1.PodFailed).Obj(), container: "main", code: 1, want: false},
		"not in the spec":                    {pod: restartingPod(corev1.RestartPolicyAlways).Obj(), container: "ephemeral", code: 1, want: false},
		"nil pod":                            {container: "main", code: 1, want: false},
		"sidecar in a Never pod":             {pod: withInit(neverPod(), corev1.Container{Name: "s", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways)}), container: "s", code: 0, want: true},
		"init container done":                {pod: withInit(restartingPod(corev1.RestartPolicyAlways), corev1.Container{Name: "i"}), container: "i", code: 0, want: false},
		"init container failed, OnFailure":   {pod: withInit(restartingPod(corev1.RestartPolicyOnFailure), corev1.Container{Name: "i"}), container: "i", code: 1, want: true},
		"init container failed, Never":       {pod: withInit(neverPod(), corev1.Container{Name: "i"}), container: "i", code: 1, want: false},
		"container policy overrides the pod": {pod: withRules(corev1.ContainerRestartPolicyOnFailure, corev1.ContainerRestartRuleOnExitCodesOpIn, corev1.ContainerRestartRuleActionRestart), container: "main", code: 1, want: true},
		"rule In matches":                    {pod: withRules(corev1.ContainerRestartPolicyNever, corev1.ContainerRestartRuleOnExitCodesOpIn, corev1.ContainerRestartRuleActionRestart, 42), container: "main", code: 42, want: true},
		"rule In does not match":             {pod: withRules(corev1.ContainerRestartPolicyNever, corev1.ContainerRestartRuleOnExitCodesOpIn, corev1.ContainerRestartRuleActionRestart, 42), container: "main", code: 1, want: false},
		"rule NotIn matches":                 {pod: withRules(corev1.ContainerRestartPolicyNever, corev1.ContainerRestartRuleOnExitCodesOpNotIn, corev1.ContainerRestartRuleActionRestart, 0), container: "main", code: 3, want: true},
		"rule RestartAllContainers":          {pod: withRules(corev1.ContainerRestartPolicyNever, corev1.ContainerRestartRuleOnExitCodesOpIn, corev1.ContainerRestartRuleActionRestartAllContainers, 7), container: "main", code: 7, want: true},
		"unknown action falls back":          {pod: withRules(corev1.ContainerRestartPolicyAlways, corev1.ContainerRestartRuleOnExitCodesOpIn, "Pause", 7), container: "main", code: 7, want: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := ContainerWillRestart(tc.pod, tc.container, tc.code); got != tc.want {
				t.Errorf("ContainerWillRestart(%s, %d) = %v, want %v", tc.container, tc.code, got, tc.want)
			}
		})
	}
}
