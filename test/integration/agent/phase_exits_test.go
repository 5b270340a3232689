package agent_test

import (
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coroner-dev/coroner/shim/policy"
	"github.com/coroner-dev/coroner/test/containerd"
	"github.com/coroner-dev/coroner/test/containerd/containerdtest"
	"github.com/coroner-dev/coroner/test/integration/agent/kubeletsim"
)

// TestTerminalPhaseCarriesTheExit (issue 12, item 7; A4): the test plays a kubelet that
// wrote the container running, then went away; the pod is deleted and its container
// exits 42 on its own. The agent writes phase Failed after --phase-grace and, in the same
// write, the container's terminated state from the runtime (exit code, reason,
// finishedAt, containerID), so that a podFailurePolicy FailJob rule on exit code 42
// matches the pod (shim/policy, the Job controller's matcher), which it could not while
// the status said running.
func TestTerminalPhaseCarriesTheExit(t *testing.T) {
	containerdtest.Each(t, testTerminalPhaseCarriesTheExit)
}

func testTerminalPhaseCarriesTheExit(t *testing.T, env *containerd.Env) {
	f := newFixture(t, env)
	a := startAgent(t, f.api, nodeA, f.cri.Endpoint)
	p := f.podWith(nodeA, "exit42", kubeletsim.PodOptions{
		Containers: []containerd.Container{{Name: "main", Command: gated("exit 42")}}})
	id := f.start(p)
	st, err := p.Status(f.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.WriteRunning(f.ctx, "main", st); err != nil {
		t.Fatal(err)
	}
	failJob := &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{{
		Action:      batchv1.PodFailurePolicyActionFailJob,
		OnExitCodes: &batchv1.PodFailurePolicyOnExitCodesRequirement{ContainerName: ptrTo("main"), Operator: batchv1.PodFailurePolicyOnExitCodesOpIn, Values: []int32{42}},
	}}}
	if r := policy.Match(failJob, f.get(p)); r.Matched() {
		t.Fatalf("the rule matches the running pod already: %+v", r)
	}

	// The kubelet is gone: the pod is deleted, its container exits on its own.
	if err := f.client.CoreV1().Pods(f.ns).Delete(f.ctx, p.Object.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.release(p, id)
	code, reason, finished := f.waitExited(p, id)
	if code != 42 {
		t.Fatalf("exit %d (%s), want 42", code, reason)
	}
	var got *corev1.Pod
	waitFor(t, "phase Failed", func() bool {
		got = f.get(p)
		return got.Status.Phase == corev1.PodFailed
	})
	took := time.Since(finished)
	t.Logf("phase Failed %v after the exit (grace %v)", took.Round(time.Millisecond), phaseGrace)
	if took < phaseGrace-time.Second {
		t.Errorf("phase written %v after the exit, before the grace of %v", took, phaseGrace)
	}
	if len(got.Status.ContainerStatuses) != 1 {
		t.Fatalf("container statuses %+v", got.Status.ContainerStatuses)
	}
	cs := got.Status.ContainerStatuses[0]
	term := cs.State.Terminated
	if term == nil {
		t.Fatalf("container main: state %+v, want terminated", cs.State)
	}
	t.Logf("container main: %+v", *term)
	if term.ExitCode != 42 || term.Reason != reason || term.ContainerID != "containerd://"+id || cs.ContainerID != "containerd://"+id ||
		!term.FinishedAt.Time.Equal(finished.Truncate(time.Second)) || cs.Ready {
		t.Errorf("container main: %+v (ready %v, id %s), want exit 42, reason %q, containerd://%s, finished %v",
			*term, cs.Ready, cs.ContainerID, reason, id, finished)
	}
	if !writtenByAgent(got) {
		t.Error("the status is not the agent's")
	}
	if r := policy.Match(failJob, got); r.Action != batchv1.PodFailurePolicyActionFailJob || r.ExitCode != 42 {
		t.Errorf("the FailJob rule on exit 42 does not match the Failed pod: %+v", r)
	} else {
		t.Logf("policy: %s", r.Message(got))
	}
	waitFor(t, "the stamp counted", func() bool {
		return a.metric(t, "coroner_agent_stamps_total", "kind=TerminalPhase", "reason=Failed") == 1
	})
}

func ptrTo[T any](v T) *T { return &v }
