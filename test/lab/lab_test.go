package lab

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/test/host"
	"github.com/coroner-dev/coroner/test/images"
)

// TestLab brings the whole lab up (as `make lab` does), checks that three nodes are Ready
// and run a busybox pod each, that pods reach each other across nodes, that a second Up
// sees the lab up and changes nothing, then brings it down and checks that nothing is
// left: no process, network namespace, mount, link, cgroup or directory of the lab.
//
// It takes about a minute and needs root, so it runs only with CORONER_LAB_TEST=1
// (`make test-lab`). It refuses to run while a lab is up, not to take it down.
func TestLab(t *testing.T) {
	if os.Getenv("CORONER_LAB_TEST") != "1" {
		t.Skip("brings the whole lab up and down (about a minute, root): set CORONER_LAB_TEST=1")
	}
	if os.Geteuid() != 0 {
		t.Fatal("the lab needs root")
	}
	cfg, err := DefaultConfig()
	if err != nil {
		t.Fatal(err)
	}
	cfg.Out = os.Stderr
	if st, _ := loadState(cfg.statePath()); st != nil || cfg.anythingLeft() {
		t.Fatal("a lab is up on this machine (or its leftovers are): make lab-down first; this test does not take it down")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()

	netnsBefore := dirNames("/run/netns")
	sharedBefore := mountPropagation(cgroupFSRoot)
	hostDirsBefore := missingHostDirs()
	sysctlsBefore := readSysctls()
	t.Cleanup(func() {
		if t.Failed() {
			_ = Down(context.Background(), cfg)
		}
	})

	start := time.Now()
	if err := Up(ctx, cfg); err != nil {
		t.Fatalf("Up: %v", err)
	}
	upTime := time.Since(start)
	st, err := loadState(cfg.statePath())
	if err != nil || st == nil || st.Phase != phaseReady {
		t.Fatalf("state after Up: %+v, %v", st, err)
	}
	// The control plane's 4, and per node its mount namespace holder, containerd, kubelet
	// and test GPU plugin.
	if len(st.Processes) != 4+4*len(cfg.Nodes) {
		t.Errorf("state records %d processes, want %d", len(st.Processes), 4+4*len(cfg.Nodes))
	}

	cs, err := cfg.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ready := 0
	for _, n := range nodes.Items {
		if nodeReady(&n) {
			ready++
		}
	}
	if len(nodes.Items) != 3 || ready != 3 {
		t.Fatalf("%d nodes, %d Ready; want 3 Ready", len(nodes.Items), ready)
	}

	// A busybox pod on each node.
	ns := "lab-test"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, n := range cfg.Nodes {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "busybox-" + n.Name, Namespace: ns},
			Spec: corev1.PodSpec{
				NodeName:                      n.Name,
				TerminationGracePeriodSeconds: ptr.To[int64](1),
				Containers: []corev1.Container{{
					Name: "main", Image: images.BusyboxName, ImagePullPolicy: corev1.PullNever,
					Command: []string{"sleep", "3600"},
				}},
			},
		}
		if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	podIPs := map[string]string{}
	err = Poll(ctx, 60*time.Second, "a busybox pod Running on each node", func() (bool, error) {
		pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		running := 0
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
				running++
				podIPs[p.Spec.NodeName] = p.Status.PodIP
			}
		}
		return running == len(cfg.Nodes), nil
	})
	if err != nil {
		out, _ := cfg.Kubectl(ctx, nil, "get", "pods", "-A", "-o", "wide")
		t.Fatalf("%v\n%s", err, out)
	}
	for _, n := range cfg.Nodes {
		if !n.PodCIDR.Contains(net.ParseIP(podIPs[n.Name])) {
			t.Errorf("pod on %s has IP %s, outside the node's pod CIDR %s", n.Name, podIPs[n.Name], n.PodCIDR)
		}
	}
	// Each node has its own device-plugin directory (its mount namespace): its own test
	// GPUs. The kubelets' and containerds' mounts stay in the nodes' namespaces.
	for _, n := range cfg.Nodes {
		node, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if q := node.Status.Allocatable[corev1.ResourceName(TestGPUResource)]; q.Value() != TestGPUs {
			t.Errorf("%s: allocatable %s %s, want %d", n.Name, TestGPUResource, q.String(), TestGPUs)
		}
	}
	if m := append(mountsUnder(filepath.Join(cfg.Dir, "nodes")), mountTargetsLeft()...); len(m) > 0 {
		t.Errorf("the nodes' mounts are on this machine, not in their mount namespaces: %v", m)
	}
	// Pod to pod across nodes, through kubectl exec (API server -> kubelet -> containerd).
	first, last := cfg.Nodes[0], cfg.Nodes[len(cfg.Nodes)-1]
	out, err := cfg.Kubectl(ctx, nil, "exec", "-n", ns, "busybox-"+first.Name, "--", "ping", "-c", "1", "-W", "3", podIPs[last.Name])
	if err != nil || !bytes.Contains(out, []byte("1 packets received")) {
		t.Errorf("ping from the pod on %s to the pod on %s (%s): %v\n%s", first.Name, last.Name, podIPs[last.Name], err, out)
	}

	// Up again: already up, nothing restarted.
	var buf bytes.Buffer
	again := cfg
	again.Out = &buf
	if err := Up(ctx, again); err != nil {
		t.Fatalf("second Up: %v", err)
	}
	if !strings.Contains(buf.String(), "already up") {
		t.Errorf("second Up did not say the lab is up:\n%s", buf.String())
	}
	for _, p := range st.procs() {
		if !p.running() {
			t.Errorf("%s (pid %d) not running after the second Up", p.Name, p.PID)
		}
	}

	start = time.Now()
	if err := Down(ctx, cfg); err != nil {
		t.Fatalf("Down: %v", err)
	}
	downTime := time.Since(start)
	t.Logf("up %v (cold or warm, see the build step), down %v", upTime.Round(100*time.Millisecond), downTime.Round(100*time.Millisecond))

	for _, p := range st.Processes {
		if host.Alive(p.PID) && p.running() {
			t.Errorf("%s (pid %d) still runs", p.Name, p.PID)
		}
	}
	if pids := processesUsing(cfg.Dir, RunDir); len(pids) > 0 {
		t.Errorf("processes still use the lab's directories: %v", pids)
	}
	for _, n := range cfg.Nodes {
		if pids := host.CgroupPIDs(n.Cgroup()); len(pids) > 0 {
			t.Errorf("processes left in cgroup %s: %v", n.Cgroup(), pids)
		}
	}
	if dirs := host.CgroupDirs(CgroupParent); len(dirs) > 0 {
		t.Errorf("cgroups left: %v", dirs)
	}
	if left := labNetns(); len(left) > 0 {
		t.Errorf("network namespaces left: %v", left)
	}
	for _, name := range dirNames("/run/netns") {
		if !slices.Contains(netnsBefore, name) {
			t.Errorf("new /run/netns/%s left", name)
		}
	}
	for _, d := range append([]string{cfg.Dir, RunDir, "/run/netns"}, mountTargets()...) {
		if m := mountsUnder(d); len(m) > 0 {
			t.Errorf("mounts left under %s: %v", d, m)
		}
	}
	if left := labLinks(); len(left) > 0 {
		t.Errorf("links left: %v", left)
	}
	if _, err := os.Stat(RunDir); err == nil {
		t.Errorf("%s left", RunDir)
	}
	if entries := dirNames(cfg.Dir); !slices.Equal(entries, []string{"logs"}) {
		t.Errorf("%s holds %v, want only logs", cfg.Dir, entries)
	}
	for _, d := range hostDirsBefore {
		if _, err := os.Lstat(d); err == nil {
			t.Errorf("%s did not exist before the lab and is left", d)
		}
	}
	if got := mountPropagation(cgroupFSRoot); got != sharedBefore {
		t.Errorf("%s propagation %s, was %s", cgroupFSRoot, got, sharedBefore)
	}

	if got := readSysctls(); fmt.Sprint(got) != fmt.Sprint(sysctlsBefore) {
		t.Errorf("kernel tunables %v after Down, were %v", got, sysctlsBefore)
	}

	// Down again: nothing to do.
	buf.Reset()
	again.Out = &buf
	if err := Down(ctx, again); err != nil || !strings.Contains(buf.String(), "nothing to remove") {
		t.Errorf("second Down: %v\n%s", err, buf.String())
	}
}

func dirNames(dir string) []string {
	entries, _ := os.ReadDir(dir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}
