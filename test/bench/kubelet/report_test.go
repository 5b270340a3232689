package main

import (
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coroner-dev/coroner/conditions"
)

func TestViewOf(t *testing.T) {
	term := &corev1.ContainerStateTerminated{ExitCode: 3, ContainerID: "containerd://abc"}
	oom := &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "OOMKilled", ContainerID: "containerd://def"}
	status := func(phase corev1.PodPhase, reason string, cs corev1.ContainerStatus, conds ...corev1.PodCondition) corev1.PodStatus {
		cs.Name = containerName
		return corev1.PodStatus{Phase: phase, Reason: reason, ContainerStatuses: []corev1.ContainerStatus{cs}, Conditions: conds}
	}
	cases := []struct {
		name        string
		kind        kind
		pod         corev1.Pod
		wantStamped bool
		wantTerm    *corev1.ContainerStateTerminated
		wantWrong   bool
		wantFailed  bool
	}{{
		name: "exit running, nothing yet",
		kind: kindExit,
		pod:  corev1.Pod{Status: status(corev1.PodRunning, "", corev1.ContainerStatus{State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}})},
	}, {
		name:     "exit reported by the kubelet in state, before the restart",
		kind:     kindExit,
		pod:      corev1.Pod{Status: status(corev1.PodRunning, "", corev1.ContainerStatus{State: corev1.ContainerState{Terminated: term}})},
		wantTerm: term,
	}, {
		name: "exit stamped and in lastState after the restart",
		kind: kindExit,
		pod: corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{conditions.AnnotationExitHistory: `[{"container":"main","exitCode":3}]`}},
			Status:     status(corev1.PodRunning, "", corev1.ContainerStatus{LastTerminationState: corev1.ContainerState{Terminated: term}}),
		},
		wantStamped: true, wantTerm: term,
	}, {
		name:       "exit pod rejected by the kubelet",
		kind:       kindExit,
		pod:        corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodFailed, Reason: "OutOfpods"}},
		wantFailed: true,
	}, {
		name: "limit OOM stamped",
		kind: kindOOM,
		pod: corev1.Pod{Status: status(corev1.PodFailed, "", corev1.ContainerStatus{State: corev1.ContainerState{Terminated: oom}},
			corev1.PodCondition{Type: conditions.OOMKilled, Status: corev1.ConditionTrue, Reason: conditions.ReasonMemoryLimitExceeded})},
		wantStamped: true, wantTerm: oom,
	}, {
		name: "limit OOM taken for a node OOM",
		kind: kindOOM,
		pod: corev1.Pod{Status: status(corev1.PodFailed, "", corev1.ContainerStatus{State: corev1.ContainerState{Terminated: oom}},
			corev1.PodCondition{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: conditions.ReasonNodeOOMKill})},
		wantTerm: oom, wantWrong: true,
	}, {
		name:     "OOM pod whose container ended otherwise",
		kind:     kindOOM,
		pod:      corev1.Pod{Status: status(corev1.PodFailed, "", corev1.ContainerStatus{State: corev1.ContainerState{Terminated: term}})},
		wantTerm: term, wantFailed: true,
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := viewOf(&tc.pod, tc.kind)
			if v.stamped != tc.wantStamped || v.terminated != tc.wantTerm || (v.wrong != "") != tc.wantWrong || (v.failed != "") != tc.wantFailed {
				t.Errorf("viewOf = %+v, want stamped %v terminated %v wrong %v failed %v", v, tc.wantStamped, tc.wantTerm, tc.wantWrong, tc.wantFailed)
			}
		})
	}
}

func TestKinds(t *testing.T) {
	cases := []struct {
		name        string
		exits, ooms int
		want        string
	}{
		{name: "no OOMs", exits: 3, want: "eee"},
		{name: "one in five", exits: 8, ooms: 2, want: "eeeeoeeeeo"},
		{name: "only OOMs", ooms: 2, want: "oo"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := ""
			for _, k := range kinds(tc.exits, tc.ooms) {
				got += string(k[0])
			}
			if got != tc.want {
				t.Errorf("kinds(%d, %d) = %s, want %s", tc.exits, tc.ooms, got, tc.want)
			}
		})
	}
}

func TestProcParsing(t *testing.T) {
	ticks, err := statCPUTicks("3469 (containerd) S 1 3469 3469 0 -1 4194560 52133 0 0 0 1234 567 0 0 20 0 14 0 1894644 2143973376 12000")
	if err != nil || ticks != 1801 {
		t.Errorf("statCPUTicks = %d, %v; want 1801", ticks, err)
	}
	rss, err := statusRSS("Name:\tcontainerd\nVmRSS:\t   51200 kB\n")
	if err != nil || rss != 51200*1024 {
		t.Errorf("statusRSS = %v, %v; want %v", rss, err, 51200*1024)
	}
	text := []byte(`# HELP process_cpu_seconds_total x
process_cpu_seconds_total 12.5
process_resident_memory_bytes 4.2e+07
coroner_agent_dropped_events_total{reason="PodGone"} 3
coroner_agent_dropped_events_total{reason="NotInCache"} 1
coroner_agent_runtime_info{endpoint="unix:///x.sock",mode="events",no_stream="",runtime="containerd v2.4.2"} 1
`)
	m := promValues(text, "process_cpu_seconds_total", "coroner_agent_dropped_events_total")
	if m["process_cpu_seconds_total"] != 12.5 || m["coroner_agent_dropped_events_total"] != 4 {
		t.Errorf("promValues = %v", m)
	}
	if got, want := runtimeInfo(text), "containerd v2.4.2, agent: events"; got != want {
		t.Errorf("runtimeInfo = %q, want %q", got, want)
	}
}

func TestKindOf(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	recs := []*record{
		{name: "timed", kind: kindExit, finishedAt: at(0), stampAt: at(50), kubeletAt: at(800), containerID: "a"},
		{name: "never", kind: kindExit, finishedAt: at(0), kubeletAt: at(900), timedOut: true},
		{name: "rejected", kind: kindExit, failed: "OutOfpods: x"},
		{name: "untimed", kind: kindExit, stampAt: at(10), kubeletAt: at(20), finishedErr: "gone"},
		{name: "oom", kind: kindOOM, finishedAt: at(0), stampAt: at(300), kubeletAt: at(600)},
	}
	got := kindOf(recs, kindExit, 0)
	if got.Pods != 4 || got.Coroner.N != 1 || got.Coroner.P99 != 50 || got.Kubelet.N != 2 || got.Kubelet.Max != 900 {
		t.Errorf("kindOf(exit) = %+v", got)
	}
	if !slices.Equal(got.NeverStamped, []string{"never"}) || len(got.Failed) != 1 || len(got.Untimed) != 1 {
		t.Errorf("kindOf(exit): never %v failed %v untimed %v", got.NeverStamped, got.Failed, got.Untimed)
	}
	// The runtime's clock 1 s ahead of this machine's: its finish 1 s earlier.
	oom := kindOf(recs, kindOOM, time.Second)
	if oom.Coroner.P50 != 1300 || oom.Kubelet.P50 != 1600 || oom.RatioP50 != 1300.0/1600 {
		t.Errorf("kindOf(oom, offset 1s) = %+v", oom)
	}
}
