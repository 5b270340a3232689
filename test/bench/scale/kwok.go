package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/coroner-dev/coroner/test/bench/measure"
	"github.com/coroner-dev/coroner/test/harness"
	"github.com/coroner-dev/coroner/test/host"
)

// kwokVersion is the version test/tools/build.sh builds (kwok_version there); its stage
// files are read from the same version of the module.
const kwokVersion = "v0.8.0"

// Nodes kwok manages carry this annotation (kwok's own convention).
const (
	kwokAnnotation = "kwok.x-k8s.io/node"
	kwokValue      = "fake"
	// zoneLabel spreads the nodes over zones of nodesPerZone, for the outage scenario.
	zoneLabel    = "topology.kubernetes.io/zone"
	nodesPerZone = 500
)

// statusDelay and statusJitter replace the delay of kwok's node heartbeat stage: a
// status every 150-450 s, 300 s on average, as a kubelet reports an unchanged one.
const (
	statusDelayMs  = 150000
	statusJitterMs = 450000
)

// kwokConfig writes kwok's --config into dir: its module's node-initialize and
// node-heartbeat-with-lease stages, the latter's delay made the kubelet's; with pods, also
// its fast pod stages that make a bound pod Running at once (pod-ready) and delete a pod
// being deleted at once (pod-delete, as a kubelet confirms its end), but not the one that
// completes a Job's pods (pod-complete): the outage's pods run until the end.
func kwokConfig(ctx context.Context, dir string, pods bool) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "mod", "download", "-json", "sigs.k8s.io/kwok@"+kwokVersion).Output()
	if err != nil {
		return "", fmt.Errorf("go mod download sigs.k8s.io/kwok@%s (its stage files): %w", kwokVersion, err)
	}
	var mod struct{ Dir string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
		return "", fmt.Errorf("go mod download sigs.k8s.io/kwok@%s: no directory in %q", kwokVersion, out)
	}
	read := func(rel string) (string, error) {
		b, err := os.ReadFile(filepath.Join(mod.Dir, "kustomize", "stage", rel))
		return string(b), err
	}
	initialize, err := read("node/fast/node-initialize.yaml")
	if err != nil {
		return "", err
	}
	heartbeat, err := read("node/heartbeat-with-lease/node-heartbeat-with-lease.yaml")
	if err != nil {
		return "", err
	}
	const want = "durationMilliseconds: 600000\n    jitterDurationMilliseconds: 610000"
	if !strings.Contains(heartbeat, want) {
		return "", fmt.Errorf("kwok %s's heartbeat stage has no %q to replace", kwokVersion, want)
	}
	heartbeat = strings.Replace(heartbeat, want, fmt.Sprintf("durationMilliseconds: %d\n    jitterDurationMilliseconds: %d", statusDelayMs, statusJitterMs), 1)
	stages := []string{initialize, heartbeat}
	if pods {
		for _, rel := range []string{"pod/fast/pod-ready.yaml", "pod/fast/pod-delete.yaml"} {
			st, err := read(rel)
			if err != nil {
				return "", err
			}
			stages = append(stages, st)
		}
	}
	for i := range stages {
		stages[i] = strings.TrimSpace(stages[i])
	}
	path := filepath.Join(dir, "kwok.yaml")
	body := strings.Join(stages, "\n---\n") + "\n"
	return path, os.WriteFile(path, []byte(body), 0o644)
}

// startKwok runs kwok against env, managing the Nodes annotated kwokAnnotation (and, with
// pods, their pods); with a label selector, only those of them it selects. name names its
// log.
func startKwok(ctx context.Context, env *harness.Env, binDir, name string, pods bool, labelSelector string) (*host.Process, error) {
	bin := filepath.Join(binDir, "kwok")
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("%w: run `test/tools/build.sh kwok` first", err)
	}
	cfg, err := kwokConfig(ctx, env.Dir, pods)
	if err != nil {
		return nil, err
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	args := []string{
		"--kubeconfig=" + env.Kubeconfig,
		"--config=" + cfg,
		"--manage-nodes-with-annotation-selector=" + kwokAnnotation + "=" + kwokValue,
		"--node-lease-duration-seconds=40",
		"--server-address=" + addr,
	}
	if labelSelector != "" {
		args = append(args, "--manage-nodes-with-label-selector="+labelSelector)
	}
	return host.StartProcess(env.Dir, name, bin, args...)
}

// nodeName is the name of simulated node i.
func nodeName(i int) string { return fmt.Sprintf("kwok-node-%05d", i) }

// darkLabel marks the nodes that the outage scenario stops (a kwok of their own manages
// them, and is stopped).
const darkLabel = "bench.coroner.dev/outage"

// createNodes creates n Nodes for kwok, 16 at a time; the first dark of them labelled
// darkLabel=dark.
func createNodes(ctx context.Context, cs kubernetes.Interface, n, dark int) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n || ctx.Err() != nil {
					return
				}
				node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
					Name:        nodeName(i),
					Annotations: map[string]string{kwokAnnotation: kwokValue},
					Labels: map[string]string{"type": "kwok", corev1.LabelHostname: nodeName(i),
						zoneLabel: fmt.Sprintf("zone-%02d", i/nodesPerZone), darkLabel: "lit"},
				}}
				if i < dark {
					node.Labels[darkLabel] = "dark"
				}
				if _, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
					errs <- fmt.Errorf("creating node %s: %w", node.Name, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return errors.Join(func() []error {
		var all []error
		for err := range errs {
			all = append(all, err)
		}
		return all
	}()...)
}

// waitNodesAlive waits until every Node is Ready and has a Lease in kube-node-lease.
func waitNodesAlive(ctx context.Context, cs kubernetes.Interface, n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: "type=kwok"})
		if err != nil {
			return err
		}
		ready := 0
		for i := range nodes.Items {
			if measure.NodeReady(&nodes.Items[i]) {
				ready++
			}
		}
		leases, err := cs.CoordinationV1().Leases(corev1.NamespaceNodeLease).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		if ready >= n && countLeases(leases.Items, "kwok-node-") >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %v: %d of %d nodes Ready, %d node Leases", timeout, ready, n, countLeases(leases.Items, "kwok-node-"))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}

func countLeases(ls []coordinationv1.Lease, prefix string) int {
	n := 0
	for _, l := range ls {
		if strings.HasPrefix(l.Name, prefix) {
			n++
		}
	}
	return n
}

// freeAddr is a free 127.0.0.1:port for a process to listen on.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer func() { _ = l.Close() }()
	return l.Addr().String(), nil
}
