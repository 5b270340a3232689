package e2e

import (
	"context"
	"fmt"
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

	"github.com/coroner-dev/coroner/agent/exithistory"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/test/bench/measure"
	"github.com/coroner-dev/coroner/test/images"
)

// latencyPods is how many exits each node makes for exitToStamp.
const latencyPods = 20

// exitToStamp measures, on a containerd 2.x node (the agent in events mode) and the
// containerd 1.6 node (relist mode) at the same time, how long after a container's exit
// the agent's stamp is visible through a watch: latencyPods pods per node, each container
// exiting once (code 3, restartPolicy OnFailure: the agent records the exit in
// coroner.dev/exit-history), from the runtime's finishedAt (asked of the node's containerd
// over CRI, in nanoseconds: the exit history and the pod status keep only seconds) to the
// watch event that carries the record. The kubelet's own report of the same exit
// (lastState.terminated) is timed from the same finishedAt beside it. Every exit must be
// stamped; the figures are logged, not asserted (machines are noisy).
func exitToStamp(t *testing.T) {
	ctx, ns := setup(t, 3*time.Minute)
	nodes := []string{busyNode, oomNode}
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
				if h, err := exithistory.Parse(p.Annotations[conditions.AnnotationExitHistory]); err == nil && len(h) > 0 {
					s.stamped = at
				}
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

	start := time.Now()
	for _, node := range nodes {
		for i := range latencyPods {
			p := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("exit-%s-%d", strings.TrimPrefix(node, "lab-"), i), Namespace: ns},
				Spec: corev1.PodSpec{
					NodeName: node, RestartPolicy: corev1.RestartPolicyOnFailure, TerminationGracePeriodSeconds: ptr.To[int64](0),
					Containers: []corev1.Container{{Name: "main", Image: images.BusyboxName, ImagePullPolicy: corev1.PullNever,
						// Exits once, 1 s + i*0.3 s after it starts (about 3 exits a second per
						// node, under the agent's default 5 writes a second, so that the
						// detection is measured, not the client's rate limiter); its restart
						// then waits.
						Command: []string{"sh", "-c", fmt.Sprintf("[ -e /d/ran ] && exec sleep 3600; touch /d/ran; sleep %d.%d; exit 3",
							1+i*3/10, i*3%10)},
						VolumeMounts: []corev1.VolumeMount{{Name: "d", MountPath: "/d"}}}},
					Volumes: []corev1.Volume{{Name: "d", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
				},
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
			if !s.stamped.IsZero() && !s.kubelet.IsZero() {
				n++
			}
		}
		return n
	}
	deadline := time.Now().Add(2 * time.Minute)
	for complete() < len(nodes)*latencyPods && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	w.Stop()
	<-done
	t.Logf("%d pods on %d nodes: all created, exited and reported within %v", len(nodes)*latencyPods, len(nodes), time.Since(start).Round(time.Second))
	for _, node := range nodes {
		finishedAt := criFinishedAt(ctx, t, node)
		var stamp, kubelet []time.Duration
		var missing []string
		for name, s := range pods {
			if s.node != node {
				continue
			}
			if s.stamped.IsZero() {
				missing = append(missing, name)
				continue
			}
			finished, ok := finishedAt[s.containerID]
			if !ok {
				t.Errorf("%s: the exited container %q is not in %s's containerd", name, s.containerID, node)
				continue
			}
			stamp = append(stamp, s.stamped.Sub(finished))
			kubelet = append(kubelet, s.kubelet.Sub(finished))
		}
		slices.Sort(missing)
		if len(missing) > 0 {
			t.Errorf("%s (%s): %d of %d exits never stamped: %v", node, runtimes[node], len(missing), latencyPods, missing)
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

// criFinishedAt asks a lab node's containerd (its CRI socket is on this machine) when each
// of its exited containers finished, to the nanosecond.
func criFinishedAt(ctx context.Context, t *testing.T, node string) map[string]time.Time {
	t.Helper()
	n, err := suite.cfg.NodeNamed(node)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("unix://"+n.Socket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r, err := runtimeapi.NewRuntimeServiceClient(conn).ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_EXITED},
	}})
	if err != nil {
		t.Fatalf("%s: ListContainers: %v", node, err)
	}
	out := map[string]time.Time{}
	for _, c := range r.GetContainers() {
		st, err := runtimeapi.NewRuntimeServiceClient(conn).ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: c.GetId()})
		if err == nil && st.GetStatus().GetFinishedAt() > 0 {
			out[c.GetId()] = time.Unix(0, st.GetStatus().GetFinishedAt())
		}
	}
	return out
}
