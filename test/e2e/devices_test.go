package e2e

// devices_test.go: the lab's test GPUs (test/deviceplugin's coroner-test-gpu, a real
// device plugin on every node: each process node in its own mount namespace, the VM node,
// kind's workers) as the kubelet reports them, and `coronerctl chaos device-fail` /
// `device-heal` on them. Nothing of the kubelet's side is faked: the allocatable count,
// the pods' allocatedResourcesStatus and the health file a container sees come from the
// real kubelet and the real plugin.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/agent/nvidia"
	"github.com/coroner-dev/coroner/test/deviceplugin"
	"github.com/coroner-dev/coroner/test/images"
	"github.com/coroner-dev/coroner/test/lab"
)

// gpuNodes are the nodes with a test GPU plugin: the lab's process nodes and its VM node
// when it runs, or kind's workers.
func gpuNodes() []string {
	if suite.kind {
		return []string{suite.kc.Cluster + "-worker", suite.kc.Cluster + "-worker2"}
	}
	var ns []string
	for _, n := range suite.cfg.Nodes {
		ns = append(ns, n.Name)
	}
	return append(ns, vmNode)
}

// gpuControl is the test GPU control of a node of the suite's cluster.
func gpuControl(ctx context.Context, t *testing.T, node string) lab.GPUControl {
	t.Helper()
	var g lab.GPUControl
	var release func()
	var err error
	if suite.kind {
		g, release, err = suite.kc.TestGPUDevices(ctx, node)
	} else {
		g, release, err = suite.cfg.TestGPUDevices(ctx, node)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	return g
}

// watchGPU is a container that lives while its test GPU is healthy, as a CUDA program
// does: it watches the device's health file (mounted by the plugin) and exits 1 when the
// device fails.
const watchGPU = `echo "$CORONER_TEST_GPU $CORONER_TEST_GPU_PCI"
while [ "$(cat /run/coroner-test-gpu/$CORONER_TEST_GPU)" = Healthy ]; do sleep 0.1; done
echo "$CORONER_TEST_GPU failed"; exit 1`

// gpuPod is a pod on node that holds one test GPU and runs command.
func gpuPod(ns, name, node, command string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			NodeSelector:                  map[string]string{corev1.LabelHostname: node},
			Containers: []corev1.Container{{Name: "main", Image: images.BusyboxName, ImagePullPolicy: corev1.PullNever,
				Command: []string{"sh", "-c", command},
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
					corev1.ResourceName(lab.TestGPUResource): resource.MustParse("1"),
				}},
			}},
		},
	}
	tolerateVM(&p.Spec)
	return p
}

// gpuHealth is the health the pod's status gives its test GPU ("" when none yet), and the
// device's ID.
func gpuHealth(p *corev1.Pod) (id, health string) {
	if p == nil {
		return "", ""
	}
	for _, s := range p.Status.ContainerStatuses {
		for _, r := range s.AllocatedResourcesStatus {
			if r.Name == corev1.ResourceName(lab.TestGPUResource) && len(r.Resources) == 1 {
				return string(r.Resources[0].ResourceID), string(r.Resources[0].Health)
			}
		}
	}
	return "", ""
}

// TestTestGPUs checks, on every node with a test GPU plugin: the node reports 2
// allocatable test GPUs; a pod that holds one sees it Healthy in its status;
// `coronerctl chaos device-fail` of a running pod's device turns it Unhealthy in the pod's
// status within seconds and device-heal turns it back; a device-fail with an Xid writes
// the driver's line for the device's PCI address to the node's kernel log (it parses) and
// the program watching the device in its container exits 1. CORONER_E2E_GPU_FLIPS=N
// (default 3) flips the first pod's device N times and logs the lag from the plugin's
// answer to the pod's status.
func TestTestGPUs(t *testing.T) {
	if suite.skip != "" {
		t.Skip(suite.skip)
	}
	flips := 3
	if v := os.Getenv("CORONER_E2E_GPU_FLIPS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("CORONER_E2E_GPU_FLIPS=%q: want a positive number", v)
		}
		flips = n
	}
	var mu sync.Mutex
	lags := map[string][]time.Duration{}
	t.Cleanup(func() {
		for _, node := range gpuNodes() {
			if l := lags[node]; len(l) > 0 {
				t.Logf("%s: device-fail to Unhealthy in the pod's status over %d flips: %s", node, len(l), lagSummary(l))
			}
		}
	})
	for _, node := range gpuNodes() {
		t.Run(node, func(t *testing.T) {
			t.Parallel()
			if isVM(node) {
				needVM(t)
				vmTurn(t)
			}
			l := testGPUs(t, node, flips)
			mu.Lock()
			lags[node] = l
			mu.Unlock()
		})
	}
}

// testGPUs is TestTestGPUs on one node; it returns the lags it measured.
func testGPUs(t *testing.T, node string, flips int) []time.Duration {
	ctx, ns := setup(t, budget(node, 4*time.Minute)+time.Duration(flips)*budget(node, 10*time.Second))
	n, err := suite.cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if q := n.Status.Allocatable[corev1.ResourceName(lab.TestGPUResource)]; q.Value() != lab.TestGPUs {
		t.Fatalf("%s: allocatable %s = %s, want %d", node, lab.TestGPUResource, q.String(), lab.TestGPUs)
	}
	g := gpuControl(ctx, t, node)
	devices, err := g.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range devices {
		if d.Health != "Healthy" {
			t.Fatalf("%s: %s is %s before the test (another case failed it?)", node, d.ID, d.Health)
		}
	}

	// Two pods, a device each: one that sleeps (its device fails and heals while it runs),
	// one that dies with its device.
	holder := gpuPod(ns, "holder", node, "echo $CORONER_TEST_GPU; sleep 3600")
	watcher := gpuPod(ns, "watcher", node, watchGPU)
	for _, p := range []*corev1.Pod{holder, watcher} {
		if _, err := suite.cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ids := map[string]string{}
	for _, p := range []*corev1.Pod{holder, watcher} {
		got := waitPod(ctx, t, ns, p.Name, "Running with a Healthy test GPU in its status", budget(node, 2*time.Minute), func(p *corev1.Pod) bool {
			_, h := gpuHealth(p)
			return p != nil && p.Status.Phase == corev1.PodRunning && h == "Healthy"
		})
		ids[p.Name], _ = gpuHealth(got)
	}
	if ids["holder"] == ids["watcher"] {
		t.Fatalf("both pods hold %s", ids["holder"])
	}

	// Fail and heal the holder's device: its status follows while it runs.
	var lags []time.Duration
	for i := range flips {
		for _, healthy := range []bool{false, true} {
			lag := flipAndWatch(ctx, t, g, ns, "holder", ids["holder"], healthy, i == 0)
			if !healthy {
				lags = append(lags, lag)
			}
		}
	}
	if got, err := suite.cs.CoreV1().Pods(ns).Get(ctx, "holder", metav1.GetOptions{}); err != nil || got.Status.Phase != corev1.PodRunning {
		t.Errorf("holder after its device failed and healed: %v, want Running (it does not watch its device)", phaseOr(got, err))
	}

	// Fail the watcher's device with an Xid: the line in the kernel log, the program's
	// exit, the pod's status.
	want := devices[slices.IndexFunc(devices, func(d deviceplugin.Device) bool { return d.ID == ids["watcher"] })].PCI
	marker := "NVRM: Xid (PCI:" + strings.TrimSuffix(want, ".0") + "): 79,"
	before := len(kernelLogLines(ctx, t, node, marker))
	out := coronerctl(ctx, t, "chaos", "device-fail", node, "pod/watcher", "-n", ns, "--xid", "79")
	if !strings.Contains(out, "coronerctl chaos device-heal "+node+" "+ids["watcher"]) {
		t.Errorf("device-fail did not say how to undo it:\n%s", out)
	}
	var line string
	err = lab.Poll(ctx, 30*time.Second, "a new line with "+marker+" in "+node+"'s kernel log", func() (bool, error) {
		lines := kernelLogLines(ctx, t, node, marker)
		if len(lines) > before {
			line = lines[len(lines)-1]
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	x, ok, err := nvidia.ParseXid(line)
	if err != nil || !ok || x.Code != 79 || x.Address.String() != want || !x.DeviceFault() {
		t.Errorf("the kernel log's Xid line %q: %+v, %v, %v; want Xid 79 of %s (%s)", line, x, ok, err, want, ids["watcher"])
	}
	got := waitPod(ctx, t, ns, "watcher", "Failed, exit 1, its test GPU Unhealthy in its status", budget(node, time.Minute), func(p *corev1.Pod) bool {
		_, h := gpuHealth(p)
		return p != nil && p.Status.Phase == corev1.PodFailed && h == "Unhealthy"
	})
	if s := got.Status.ContainerStatuses[0].State.Terminated; s == nil || s.ExitCode != 1 {
		t.Errorf("watcher's container: %+v, want exit 1 (its program saw the device fail)", got.Status.ContainerStatuses[0].State)
	}
	if logs, err := kubectl(ctx, "-n", ns, "logs", "watcher"); err != nil || !strings.Contains(string(logs), ids["watcher"]+" failed") {
		t.Errorf("watcher's log: %s %v", logs, err)
	}
	out = coronerctl(ctx, t, "chaos", "device-heal", node)
	if !strings.Contains(out, ids["watcher"]+" of "+node+" is Healthy again") {
		t.Errorf("device-heal did not heal %s:\n%s", ids["watcher"], out)
	}
	err = lab.Poll(ctx, budget(node, 30*time.Second), node+"'s allocatable test GPUs back to 2", func() (bool, error) {
		n, err := suite.cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		q := n.Status.Allocatable[corev1.ResourceName(lab.TestGPUResource)]
		return q.Value() == lab.TestGPUs, nil
	})
	if err != nil {
		t.Error(err)
	}
	return lags
}

// flipAndWatch fails (healthy false) or heals the pod's device through the plugin's control
// API and waits, on a watch of the pod, until its status says so; it returns the time from
// the plugin's answer to the status. first logs the pod's status as seen.
func flipAndWatch(ctx context.Context, t *testing.T, g lab.GPUControl, ns, pod, id string, healthy, first bool) time.Duration {
	t.Helper()
	want := "Unhealthy"
	var err error
	if healthy {
		want = "Healthy"
		_, err = g.Heal(ctx, id)
	} else {
		_, _, err = g.Fail(ctx, id, 0)
	}
	if err != nil {
		t.Fatal(err)
	}
	done := time.Now()
	var seen time.Duration
	watchPod(ctx, t, ns, pod, id+" "+want+" in its status", 30*time.Second, func(p *corev1.Pod) bool {
		if _, h := gpuHealth(p); h == want {
			seen = time.Since(done)
			return true
		}
		return false
	})
	if first {
		t.Logf("%s %s in pod %s's status %v after the plugin's answer", id, want, pod, seen.Round(time.Millisecond))
	}
	return seen
}

// kernelLogLines are the lines of the node's kernel log that hold marker: this machine's
// for a process node and a kind node, the guest's for the VM node.
func kernelLogLines(ctx context.Context, t *testing.T, node, marker string) []string {
	t.Helper()
	var out []byte
	var err error
	if isVM(node) {
		out, err = suite.cfg.VMExec(ctx, "dmesg")
	} else {
		out, err = exec.CommandContext(ctx, "dmesg").Output()
	}
	if err != nil {
		t.Fatalf("dmesg of %s: %v\n%s", node, err, out)
	}
	var lines []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, marker) {
			lines = append(lines, l)
		}
	}
	return lines
}

// phaseOr is the pod's phase, or the error of its Get.
func phaseOr(p *corev1.Pod, err error) string {
	if err != nil {
		return err.Error()
	}
	return string(p.Status.Phase)
}

// lagSummary is "p50 X, max Y (n)" of lags.
func lagSummary(lags []time.Duration) string {
	s := slices.Clone(lags)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return fmt.Sprintf("p50 %v, max %v, min %v", s[len(s)/2].Round(time.Millisecond), s[len(s)-1].Round(time.Millisecond), s[0].Round(time.Millisecond))
}
