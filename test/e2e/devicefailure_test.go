package e2e

// Device failures (issue 37): every lab node runs coroner-test-gpu, a real device plugin
// registered with its real kubelet (resource coroner.dev/test-gpu, two devices per node);
// `coronerctl chaos device-fail` turns a device Unhealthy in the plugin, the kubelet puts
// that in the pod's status.containerStatuses[].allocatedResourcesStatus, and the program
// in the container, which watches its device's health file as a CUDA program watches its
// GPU, dies with exit 1. The agent stamps DisruptionTarget DeviceFailure and
// coroner.dev/DeviceFailed, and a Job's "Ignore on DisruptionTarget" rule retries the
// index without counting it. A failure the device does not explain is counted.

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/test/lab"
	"github.com/coroner-dev/coroner/test/wrappers"
)

// testGPU is the lab's device plugin's resource.
const testGPU = corev1.ResourceName(lab.TestGPUResource)

// dieWithTheDevice is a container's program that dies when its device fails, as a CUDA
// program does when its GPU falls off the bus: it watches the device's health file (the
// plugin mounts it into every container it allocates a device to) for up to 60 s, exits 1
// the moment the device is not Healthy (after DELAY seconds, 0 by default: a program that
// hangs a while on a dead GPU), and 0 at the end. A replacement (IGNORED > 0: an ignored
// failure of its index) exits 0 at once.
const dieWithTheDevice = `if [ "${IGNORED:-0}" != 0 ]; then echo "replacement on $CORONER_TEST_GPU"; exit 0; fi
f=/run/coroner-test-gpu/$CORONER_TEST_GPU
i=0
while [ $i -lt 600 ]; do
  if [ "$(cat $f)" != Healthy ]; then
    echo "device $CORONER_TEST_GPU is $(cat $f)"
    sleep ${DELAY:-0}
    exit 1
  fi
  sleep 0.1
  i=$((i+1))
done
exit 0`

// dieOnItsOwn is a program that holds a device and fails by itself after 6 s (a bug); a
// replacement (IGNORED > 0) exits 0 at once.
const dieOnItsOwn = `if [ "${IGNORED:-0}" != 0 ]; then echo "replacement on $CORONER_TEST_GPU"; exit 0; fi
sleep 6; echo "a bug"; exit 1`

// deviceJob is an Indexed Job of one completion whose pod holds one test GPU on node:
// backoffLimitPerIndex 0 (one counted failure fails the index) and the rule a user writes
// to retry disruptions, Ignore on DisruptionTarget.
func deviceJob(name, ns, node, script string) *batchv1.Job {
	j := onNode(withIgnoredCount(job(name, ns).
		Indexed().Completions(1).BackoffLimitPerIndex(0).
		PodFailurePolicy(wrappers.OnPodCondition(batchv1.PodFailurePolicyActionIgnore, corev1.DisruptionTarget)).
		Command("sh", "-c", script).Obj()), node)
	withResources(j, nil, corev1.ResourceList{testGPU: quantities("x", "1")["x"]})
	return j
}

// withDelay sets the program's DELAY: seconds between its device's failure and its death.
func withDelay(j *batchv1.Job, seconds int) *batchv1.Job {
	c := &j.Spec.Template.Spec.Containers[0]
	c.Env = append(c.Env, corev1.EnvVar{Name: "DELAY", Value: fmt.Sprint(seconds)})
	return j
}

// startOnGPU creates the Job and waits until its pod runs on node holding a test GPU; it
// returns the pod and the GPU.
func startOnGPU(ctx context.Context, t *testing.T, j *batchv1.Job, node string) (corev1.Pod, string) {
	t.Helper()
	createJob(ctx, t, j)
	first := waitRunning(ctx, t, j.Namespace, j.Name, 1, budget(node, time.Minute))[0]
	return first, heldDevice(ctx, t, j.Namespace, first.Name, node)
}

// heldDevice waits until the kubelet reports the device it allocated to the pod's main
// container (allocatedResourcesStatus) and returns its ID.
func heldDevice(ctx context.Context, t *testing.T, ns, name, node string) string {
	t.Helper()
	var id string
	waitPod(ctx, t, ns, name, "the kubelet's allocatedResourcesStatus for "+string(testGPU), budget(node, time.Minute), func(p *corev1.Pod) bool {
		id = podGPU(p)
		return id != "" || p == nil
	})
	if id == "" {
		t.Fatalf("pod %s: no %s in its allocatedResourcesStatus", name, testGPU)
	}
	return id
}

// otherDevice is the node's test GPU that is not id (the plugin names them GPU-0, GPU-1).
func otherDevice(id string) string {
	if id == "GPU-0" {
		return "GPU-1"
	}
	return "GPU-0"
}

// healAll turns every test GPU of node healthy again when the test (a case) ends: the
// next case starts with both.
func healAll(t *testing.T, node string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		coronerctl(ctx, t, "chaos", "device-heal", node)
	})
}

// TestDeviceFailure runs the device cases one after the other on each node configuration
// (they share the node's two test GPUs).
func TestDeviceFailure(t *testing.T) {
	t.Parallel()
	onEachNode(t, func(t *testing.T, node string) {
		cases := []struct {
			name string
			f    func(t *testing.T, node string)
		}{
			{"its device fails", itsDeviceFails},
			{"another device fails", anotherDeviceFails},
			{"an application Xid", func(t *testing.T, node string) { xidCase(t, node, 13, false) }},
			{"a hardware Xid alone", func(t *testing.T, node string) { xidCase(t, node, 79, true) }},
			{"beside the built-in controller", besideBuiltIn},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				healAll(t, node)
				c.f(t, node)
			})
		}
	})
}

// itsDeviceFails: the pod's GPU turns Unhealthy and the program dies of it: stamped,
// not counted, replaced on a healthy device, the Job Complete.
func itsDeviceFails(t *testing.T, node string) {
	ctx, ns := setup(t, budget(node, 4*time.Minute))
	j := deviceJob("gpu-fails", ns, node, dieWithTheDevice)
	first, dev := startOnGPU(ctx, t, j, node)
	coronerctl(ctx, t, "chaos", "device-fail", node, dev)

	got := waitFinished(ctx, t, ns, j.Name, budget(node, 2*time.Minute))
	wantOutcome(t, got, outcome{Condition: "Complete", Reason: batchv1.JobReasonCompletionsReached, Succeeded: 1, CompletedIndexes: "0"})
	p := pod(ctx, t, ns, first.Name)
	wantCondition(t, p, corev1.DisruptionTarget, conditions.ReasonDeviceFailure)
	wantCondition(t, p, conditions.DeviceFailed, conditions.ReasonDeviceFailure)
	if c := condition(p, conditions.DeviceFailed); c != nil && (!strings.Contains(c.Message, string(testGPU)) || !strings.Contains(c.Message, dev)) {
		t.Errorf("DeviceFailed message does not name %s %s: %s", testGPU, dev, c.Message)
	}
	if term := terminated(p); term == nil || term.ExitCode != 1 {
		t.Errorf("first pod: main container terminated %+v, want exit 1", term)
	}
	pods := jobPods(ctx, t, ns, j.Name)
	if len(pods) != 2 {
		t.Fatalf("%d pods, want 2 (the first and its replacement)", len(pods))
	}
	if d := podGPU(&pods[1]); d == dev && pods[1].Spec.NodeName == node {
		t.Errorf("the replacement got the failed device %s on %s", dev, node)
	}
	// coroner-shim's Event for the pod: the agent's verdict and what the rule did with it.
	wantEvent(ctx, t, ns, j.Name, conditions.ReasonDeviceFailure, first.Name, dev, "not counted", "Ignore on DisruptionTarget")
	out := coronerctl(ctx, t, "explain", "job", "-n", ns, j.Name)
	for _, want := range []string{"device", string(testGPU), dev} {
		if !strings.Contains(out, want) {
			t.Errorf("coronerctl explain does not say %q", want)
		}
	}
}

// anotherDeviceFails: the node's other GPU fails while the pod's program dies of its own
// bug: the pod did not hold that device, so its failure is counted and the index fails.
func anotherDeviceFails(t *testing.T, node string) {
	ctx, ns := setup(t, budget(node, 4*time.Minute))
	j := deviceJob("other-fails", ns, node, dieOnItsOwn)
	first, dev := startOnGPU(ctx, t, j, node)
	coronerctl(ctx, t, "chaos", "device-fail", node, otherDevice(dev))

	got := waitFinished(ctx, t, ns, j.Name, budget(node, 2*time.Minute))
	wantOutcome(t, got, outcome{Condition: "Failed", Reason: batchv1.JobReasonFailedIndexes, Failed: 1, FailedIndexes: "0"})
	p := pod(ctx, t, ns, first.Name)
	wantNoCondition(t, p, corev1.DisruptionTarget)
	if c := condition(p, conditions.DeviceFailed); c == nil || c.Status != corev1.ConditionFalse || c.Reason != conditions.ReasonNoDeviceFailure {
		t.Errorf("pod %s: DeviceFailed %+v, want False %s (the agent's verdict: no device to blame)", p.Name, c, conditions.ReasonNoDeviceFailure)
	}
	if h := lab.TestGPUHealth(p, dev); h != corev1.ResourceHealthStatusHealthy {
		t.Errorf("pod %s: its device %s is %q in its status, want Healthy", p.Name, dev, h)
	}
}

// xidCase: the driver logs an Xid for the pod's GPU while the plugin keeps it Healthy,
// and the program dies. An application Xid (13: a graphics engine exception, the
// program's own fault) never blames the device: counted, the index fails. A hardware Xid
// (79: the GPU fell off the bus) blames it even before, or without, the plugin's word:
// stamped, not counted.
func xidCase(t *testing.T, node string, xid int, blamed bool) {
	ctx, ns := setup(t, budget(node, 4*time.Minute))
	j := deviceJob(fmt.Sprintf("xid-%d", xid), ns, node, dieOnItsOwn)
	first, dev := startOnGPU(ctx, t, j, node)
	coronerctl(ctx, t, "chaos", "device-xid", node, dev, "--xid", fmt.Sprint(xid))

	got := waitFinished(ctx, t, ns, j.Name, budget(node, 2*time.Minute))
	p := pod(ctx, t, ns, first.Name)
	if !blamed {
		wantOutcome(t, got, outcome{Condition: "Failed", Reason: batchv1.JobReasonFailedIndexes, Failed: 1, FailedIndexes: "0"})
		wantNoCondition(t, p, corev1.DisruptionTarget)
		wantNoCondition(t, p, conditions.DeviceFailed)
		return
	}
	wantOutcome(t, got, outcome{Condition: "Complete", Reason: batchv1.JobReasonCompletionsReached, Succeeded: 1, CompletedIndexes: "0"})
	wantCondition(t, p, corev1.DisruptionTarget, conditions.ReasonDeviceFailure)
	wantCondition(t, p, conditions.DeviceFailed, conditions.ReasonDeviceFailure)
	if c := condition(p, conditions.DeviceFailed); c != nil && !strings.Contains(c.Message, fmt.Sprint(xid)) {
		t.Errorf("DeviceFailed message does not name Xid %d: %s", xid, c.Message)
	}
	if h := lab.TestGPUHealth(p, dev); h != corev1.ResourceHealthStatusHealthy {
		t.Errorf("pod %s: its device %s is %q in its status, want Healthy (the plugin was not told)", p.Name, dev, h)
	}
}

// besideBuiltIn: the same failure for a Job of the built-in Job controller (no
// managedBy): the agent's stamp alone makes its Ignore rule retry the index. The program
// dies 2 s after its device (a CUDA call that hangs before it errors): the device is
// Unhealthy in the pod's status by then, so the agent stamps on the runtime's exit event,
// before the kubelet reports the pod Failed. (The race when the program dies at the same
// moment as the device is measured by make bench-device.)
func besideBuiltIn(t *testing.T, node string) {
	ctx, ns := setup(t, budget(node, 4*time.Minute))
	j := builtinCopy(withDelay(deviceJob("gpu-fails", ns, node, dieWithTheDevice), 2))
	first, dev := startOnGPU(ctx, t, j, node)
	coronerctl(ctx, t, "chaos", "device-fail", node, dev)

	got := waitFinished(ctx, t, ns, j.Name, budget(node, 2*time.Minute))
	wantOutcome(t, got, outcome{Condition: "Complete", Reason: batchv1.JobReasonCompletionsReached, Succeeded: 1, CompletedIndexes: "0"})
	p := pod(ctx, t, ns, first.Name)
	wantCondition(t, p, corev1.DisruptionTarget, conditions.ReasonDeviceFailure)
	wantCondition(t, p, conditions.DeviceFailed, conditions.ReasonDeviceFailure)
}

// podGPU is the test GPU the kubelet says the pod holds (lab.PodTestGPU), "" when none yet.
func podGPU(p *corev1.Pod) string {
	if p == nil {
		return ""
	}
	id, _ := lab.PodTestGPU(p)
	return id
}
