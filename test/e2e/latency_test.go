package e2e

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/test/bench/measure"
	"github.com/coroner-dev/coroner/test/images"
)

// latencyPods is how many exits each node makes for exitToStamp; vmLatencyPods those of
// the VM node, which starts pods 10-20x slower (each exits 2 s after the previous one).
const (
	latencyPods   = 20
	vmLatencyPods = 6
)

// exitToStamp measures, on the busy node and the OOM node (on the process lab containerd
// 1.7 and 1.6, the agent relisting on both; on kind two containerd 2.x nodes, events mode)
// and, when the lab has it, the VM node (systemd, cgroup v2, containerd 2.x: events mode;
// its CRI reached through ssh) at the same time, how long after a container's exit
// the agent's stamp is visible through a watch: latencyPods pods per node, each container
// exiting once (code 3, restartPolicy OnFailure: the agent records the exit in
// coroner.dev/exit-history), from the runtime's finishedAt (asked of the node's containerd
// over CRI, in nanoseconds: the exit history and the pod status keep only seconds) to the
// watch event that carries the record. The kubelet's own report of the same exit
// (lastState.terminated) is timed from the same finishedAt beside it. Every exit must be
// stamped; the figures are logged, not asserted (machines are noisy).
func exitToStamp(t *testing.T) {
	nodes := []string{busyNode, oomNode}
	if suite.kind {
		nodes = []string{oomNode}
	}
	if suite.vm {
		nodes = append(nodes, vmNode)
		vmTurn(t)
	}
	ctx, ns := setup(t, budget(nodes[len(nodes)-1], 3*time.Minute))
	runtimes := map[string]string{}
	for _, n := range nodes {
		node, err := suite.cs.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		runtimes[n] = node.Status.NodeInfo.ContainerRuntimeVersion
	}
	w, err := suite.cs.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()

	type seen struct {
		node             string
		containerID      string // the exited container, from the kubelet's lastState
		stamped, kubelet time.Time
		// failed says why the pod failed before its container exited (the kubelet rejected
		// or evicted it: a node left under MemoryPressure by an earlier case, say).
		failed string
	}
	var mu sync.Mutex
	pods := map[string]*seen{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			at := time.Now()
			mu.Lock()
			s := pods[p.Name]
			if s == nil {
				s = &seen{node: p.Spec.NodeName}
				pods[p.Name] = s
			}
			if s.stamped.IsZero() {
				if h, err := v1alpha1.ParseExitHistory(p.Annotations[conditions.AnnotationExitHistory]); err == nil && len(h) > 0 {
					s.stamped = at
				}
			}
			if p.Status.Phase == corev1.PodFailed && s.failed == "" {
				s.failed = fmt.Sprintf("%s: %s", p.Status.Reason, p.Status.Message)
			}
			if s.kubelet.IsZero() {
				for _, cs := range p.Status.ContainerStatuses {
					if t := cs.LastTerminationState.Terminated; t != nil {
						s.kubelet, s.containerID = at, strings.TrimPrefix(t.ContainerID, "containerd://")
					}
				}
			}
			mu.Unlock()
		}
	}()

	// The agent's and the kubelet's cost on each node: idle for 10 s, then during the exits.
	costs := map[string]*nodeCost{}
	for _, n := range nodes {
		if c := startCost(ctx, t, n); c != nil {
			costs[n] = c
		}
	}
	if len(costs) > 0 {
		time.Sleep(10 * time.Second)
		for n, c := range costs {
			if err := c.idle(ctx); err != nil {
				t.Logf("%s: no agent cost figures: %v", n, err)
				delete(costs, n)
			}
		}
	}

	start := time.Now()
	perNode := map[string]int{}
	for _, node := range nodes {
		perNode[node] = latencyPods
		if isVM(node) {
			perNode[node] = vmLatencyPods
		}
		for i := range perNode[node] {
			exitAt := fmt.Sprintf("%d.%d", 1+i*3/10, i*3%10)
			if isVM(node) {
				exitAt = fmt.Sprint(5 + 2*i)
			}
			p := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("exit-%s-%d", strings.TrimPrefix(node, "lab-"), i), Namespace: ns},
				Spec: corev1.PodSpec{
					NodeName: node, RestartPolicy: corev1.RestartPolicyOnFailure, TerminationGracePeriodSeconds: ptr.To[int64](0),
					Containers: []corev1.Container{{Name: "main", Image: images.BusyboxName, ImagePullPolicy: corev1.PullNever,
						// Exits once, 1 s + i*0.3 s after it starts (about 3 exits a second per
						// node, under the agent's default 5 writes a second, so that the
						// detection is measured, not the client's rate limiter); on the VM
						// node 5 s + i*2 s; its restart then waits.
						Command:      []string{"sh", "-c", "[ -e /d/ran ] && exec sleep 3600; touch /d/ran; sleep " + exitAt + "; exit 3"},
						VolumeMounts: []corev1.VolumeMount{{Name: "d", MountPath: "/d"}}}},
					Volumes: []corev1.Volume{{Name: "d", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
				},
			}
			if isVM(node) {
				tolerateVM(&p.Spec)
			}
			if _, err := suite.cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	complete := func() (n int) {
		mu.Lock()
		defer mu.Unlock()
		for _, s := range pods {
			if !s.stamped.IsZero() && !s.kubelet.IsZero() || s.failed != "" {
				n++
			}
		}
		return n
	}
	deadline := time.Now().Add(budget(nodes[len(nodes)-1], 2*time.Minute))
	total := 0
	for _, n := range perNode {
		total += n
	}
	// The exited containers' finish times, read while they are there: the kubelet may
	// remove an exited container once its pod has restarted it.
	finishedAt := map[string]map[string]time.Time{}
	runtimesCRI := map[string]runtimeapi.RuntimeServiceClient{}
	for _, node := range nodes {
		conn, stop := dialNodeCRI(ctx, t, node)
		defer stop()
		runtimesCRI[node] = runtimeapi.NewRuntimeServiceClient(conn)
		finishedAt[node] = map[string]time.Time{}
	}
	collect := func() {
		for _, node := range nodes {
			got, err := criFinishedAt(ctx, runtimesCRI[node])
			if err != nil {
				t.Logf("%s: reading exited containers: %v (retried)", node, err)
			}
			maps.Copy(finishedAt[node], got)
		}
	}
	for complete() < total && time.Now().Before(deadline) {
		collect()
		time.Sleep(time.Second)
	}
	collect()
	w.Stop()
	<-done
	t.Logf("%d pods on %d nodes: all created, exited and reported within %v", total, len(nodes), time.Since(start).Round(time.Second))
	for _, node := range nodes {
		if c := costs[node]; c != nil {
			c.report(ctx, t, perNode[node])
		}
	}
	for _, node := range nodes {
		var stamp, kubelet []time.Duration
		var missing, failed []string
		untimed := 0
		for name, s := range pods {
			if s.node != node {
				continue
			}
			if s.stamped.IsZero() {
				if s.failed != "" {
					failed = append(failed, name+" ("+s.failed+")")
				} else {
					missing = append(missing, name)
				}
				continue
			}
			finished, ok := finishedAt[node][s.containerID]
			if !ok {
				untimed++ // removed before it could be read: stamped, not timed
				continue
			}
			stamp = append(stamp, s.stamped.Sub(finished))
			kubelet = append(kubelet, s.kubelet.Sub(finished))
		}
		slices.Sort(missing)
		slices.Sort(failed)
		if len(failed) > 0 {
			t.Errorf("%s: %d of %d pods failed before their container exited, nothing to time: %v", node, len(failed), perNode[node], failed)
		}
		if len(missing) > 0 {
			t.Errorf("%s (%s): %d of %d exits never stamped: %v", node, runtimes[node], len(missing), perNode[node], missing)
		}
		if untimed > 0 {
			t.Logf("%s: %d stamped exits not timed (their containers were removed before they could be read)", node, untimed)
		}
		if len(stamp) == 0 {
			continue
		}
		t.Logf("%s (%s): exit -> stamp visible p50 %v p99 %v (n=%d); exit -> kubelet's terminated status visible p50 %v p99 %v (n=%d)",
			node, runtimes[node], ms(measure.Percentile(stamp, 50)), ms(measure.Percentile(stamp, 99)), len(stamp),
			ms(measure.Percentile(kubelet, 50)), ms(measure.Percentile(kubelet, 99)), len(kubelet))
	}
	_ = suite.cs.CoreV1().Pods(ns).DeleteCollection(context.Background(), metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}, metav1.ListOptions{})
}

func ms(d time.Duration) time.Duration { return d.Round(time.Millisecond) }

// dialNodeCRI connects to a lab node's containerd: its socket on this machine, or for the
// VM node the guest's, forwarded over ssh once for the whole test.
func dialNodeCRI(ctx context.Context, t *testing.T, node string) (*grpc.ClientConn, func()) {
	t.Helper()
	if suite.kind {
		socket, err := suite.kc.NodeSocket(ctx, node)
		if err != nil {
			t.Fatal(err)
		}
		conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		return conn, func() { conn.Close() }
	}
	n, err := suite.cfg.NodeNamed(node)
	if err != nil {
		t.Fatal(err)
	}
	socket, stopForward := n.Socket(), func() {}
	if n.IsVM() {
		local, stop, err := suite.cfg.VMSocket(ctx, socket)
		if err != nil {
			t.Fatalf("%s: %v", node, err)
		}
		socket, stopForward = local, stop
	}
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		stopForward()
		t.Fatal(err)
	}
	return conn, func() { conn.Close(); stopForward() }
}

// criFinishedAt asks a node's containerd when each of its exited containers finished, to
// the nanosecond.
func criFinishedAt(ctx context.Context, rt runtimeapi.RuntimeServiceClient) (map[string]time.Time, error) {
	r, err := rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_EXITED},
	}})
	if err != nil {
		return nil, err
	}
	out := map[string]time.Time{}
	for _, c := range r.GetContainers() {
		st, err := rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: c.GetId()})
		if err == nil && st.GetStatus().GetFinishedAt() > 0 {
			out[c.GetId()] = time.Unix(0, st.GetStatus().GetFinishedAt())
		}
	}
	return out, nil
}
