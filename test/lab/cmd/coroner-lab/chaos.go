package main

// coroner-lab chaos: the node-side actions of `coronerctl chaos` (partition, heal,
// kill-kubelet, start-kubelet, oom), which act on this machine's lab or kind cluster and
// so link the lab's code; coronerctl, the kubectl plugin users install, runs this program
// for them and links none of it.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/coroner-dev/coroner/internal/cli"
	"github.com/coroner-dev/coroner/test/host"
	"github.com/coroner-dev/coroner/test/kind"
	"github.com/coroner-dev/coroner/test/lab"
)

// chaosOptions are the flags of `coroner-lab chaos`, which coronerctl passes on.
type chaosOptions struct {
	Kubeconfig, Context, Namespace string
	// Node makes oom lower the node's limit rather than the pod's.
	Node bool
	// Timeout bounds oom's wait for a kill.
	Timeout time.Duration
	// LabDir is the repository whose lab the actions act on.
	LabDir string
	// Xid makes device-fail write an Xid line of this number first.
	Xid int
}

// chaosActions are the actions, each with the argument it takes.
var chaosActions = map[string]string{"partition": "NODE", "heal": "NODE", "kill-kubelet": "NODE", "start-kubelet": "NODE", "oom": "POD"}

// runChaos does the action and prints what it did and how to undo it to w.
func runChaos(ctx context.Context, o *chaosOptions, args []string, w io.Writer) error {
	if len(args) >= 1 && deviceActions[args[0]] {
		if o.Node {
			return fmt.Errorf("--node is a flag of oom, not of %s", args[0])
		}
		undo, err := o.runDevices(ctx, args[0], args[1:], w)
		if undo != "" {
			fmt.Fprintf(w, "undo: %s\n", undo)
		}
		return err
	}
	if o.Xid != 0 {
		return errors.New("--xid is a flag of device-fail")
	}
	if len(args) != 2 || args[1] == "" {
		return fmt.Errorf("usage: coroner-lab chaos partition|heal|kill-kubelet|start-kubelet|devices NODE, oom POD [--node], or device-fail|device-heal NODE [DEVICE]")
	}
	action, target := args[0], args[1]
	if _, ok := chaosActions[action]; !ok {
		return fmt.Errorf("unknown chaos action %q: want partition, heal, kill-kubelet, start-kubelet, oom, devices, device-fail or device-heal", action)
	}
	if o.Node && action != "oom" {
		return fmt.Errorf("--node is a flag of oom, not of %s", action)
	}
	if o.Timeout <= 0 {
		return fmt.Errorf("--timeout must be positive, got %v", o.Timeout)
	}
	undo, err := o.runLab(ctx, action, target, w)
	if undo != "" {
		fmt.Fprintf(w, "undo: %s\n", undo)
	}
	return err
}

// client returns a clientset and the namespace of -n or the kubeconfig context.
func (o *chaosOptions) client() (kubernetes.Interface, string, error) {
	return cli.UserClient(o.Kubeconfig, o.Context, o.Namespace, "coroner-lab-chaos")
}

// labConfig finds the lab: --lab-repo, else the repository that holds the working
// directory, else the one this program was built into (_output/bin/coroner-lab).
func (o *chaosOptions) labConfig() (lab.Config, error) {
	if o.LabDir != "" {
		abs, err := filepath.Abs(o.LabDir)
		if err != nil {
			return lab.Config{}, err
		}
		return lab.ConfigFor(abs), nil
	}
	if root, err := host.RepoRoot(); err == nil {
		return lab.ConfigFor(root), nil
	}
	if exe, err := os.Executable(); err == nil {
		root := filepath.Dir(filepath.Dir(filepath.Dir(exe))) // <root>/_output/bin/coroner-lab
		if _, err := os.Stat(filepath.Join(root, "test", "tools", "build.sh")); err == nil {
			return lab.ConfigFor(root), nil
		}
	}
	return lab.Config{}, errors.New("cannot find coroner's lab: run from the repository, or pass --lab-repo")
}

// runLab does a node-side action in the lab, or on a node of the kind cluster
// (test/kind: make kind-lab) when the node, or the pod's node for oom, is one of its node
// containers.
func (o *chaosOptions) runLab(ctx context.Context, action, target string, w io.Writer) (string, error) {
	cfg, err := o.labConfig()
	if err != nil {
		return "", err
	}
	cfg.Out = w
	if kc, ok := o.kindCluster(ctx, cfg, action, target); ok {
		return o.runKind(ctx, kc, action, target, w)
	}
	switch action {
	case "partition":
		if err := cfg.Partition(target); err != nil {
			return "", err
		}
		n, _ := cfg.NodeNamed(target)
		fmt.Fprintf(w, "partition: %s is off the network (link %s down): its kubelet, agent and pods reach neither the API server nor the other nodes, and keep running\n", target, n.HostVeth)
		fmt.Fprintf(w, "partition: the node controller marks it NotReady once its status is older than --node-monitor-grace-period (20s in the lab), then taints it node.kubernetes.io/unreachable\n")
		return "coronerctl chaos heal " + cli.Quote(target), nil
	case "heal":
		if err := cfg.Heal(target); err != nil {
			return "", err
		}
		n, _ := cfg.NodeNamed(target)
		fmt.Fprintf(w, "heal: %s is back on the network (link %s up); it is Ready again at its next status update\n", target, n.HostVeth)
		return "coronerctl chaos partition " + cli.Quote(target), nil
	case "kill-kubelet":
		pid, err := cfg.KillKubelet(target)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(w, "kill-kubelet: killed the kubelet of %s (pid %d) with SIGKILL; its containers keep running, nothing reports the node's status\n", target, pid)
		return "coronerctl chaos start-kubelet " + cli.Quote(target), nil
	case "start-kubelet":
		pid, err := cfg.StartKubelet(target)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(w, "start-kubelet: started the kubelet of %s again (pid %d), with the lab's configuration\n", target, pid)
		return "coronerctl chaos kill-kubelet " + cli.Quote(target), nil
	case "oom":
		return o.oom(ctx, cfg, target, w)
	}
	return "", fmt.Errorf("unknown action %q", action)
}

// oom makes the kernel OOM-kill a task of the pod in the lab.
func (o *chaosOptions) oom(ctx context.Context, cfg lab.Config, name string, w io.Writer) (string, error) {
	if o.Kubeconfig == "" && os.Getenv("KUBECONFIG") == "" {
		o.Kubeconfig = cfg.Kubeconfig()
	}
	cs, ns, err := o.client()
	if err != nil {
		return "", err
	}
	pod, err := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", fmt.Errorf("pod %s/%s not found", ns, name)
	}
	if err != nil {
		return "", err
	}
	scope, whose := lab.OOMPodLimit, "the pod's own cgroup (as if it exceeded its memory limit)"
	if o.Node {
		scope, whose = lab.OOMNode, "the cgroup of all the pods of "+pod.Spec.NodeName+" (as if the node ran out of memory)"
	}
	res, err := cfg.OOM(ctx, pod, scope, o.Timeout)
	return o.reportOOM(w, res, whose, err)
}

// reportOOM prints what an OOM squeeze did.
func (o *chaosOptions) reportOOM(w io.Writer, res lab.OOMResult, whose string, err error) (string, error) {
	if res.Cgroup != "" {
		fmt.Fprintf(w, "oom: lowered the memory limit of %s, %s, to %s\n", res.Cgroup, whose, mib(res.Limit))
	}
	if err != nil {
		return "", err
	}
	if res.Kills == 0 {
		return "", fmt.Errorf("no OOM kill in %s within %v: the pod did not allocate memory meanwhile (only a pod that allocates can be OOM-killed by a lower limit); the limit is restored to %s", res.Cgroup, o.Timeout, mib(res.Restored))
	}
	fmt.Fprintf(w, "oom: the kernel OOM-killed %d task(s) in %s after %v; the limit is restored to %s\n", res.Kills, res.Cgroup, res.Took.Round(1e6), mib(res.Restored))
	return "nothing to undo: the limit is restored; the pod's controller replaces a pod that died", nil
}

// mib writes a byte count in MiB, or "no limit".
func mib(b int64) string {
	if b < 0 || b >= 1<<62 {
		return "no limit"
	}
	return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
}

// kindCluster returns the kind cluster of the repository when the action's node is one of
// its node containers (and not a node of the lab).
func (o *chaosOptions) kindCluster(ctx context.Context, cfg lab.Config, action, target string) (kind.Config, bool) {
	kc, err := kind.NewFor(cfg.Root)
	if err != nil {
		return kind.Config{}, false
	}
	node := target
	if action == "oom" {
		if o.Kubeconfig == "" && os.Getenv("KUBECONFIG") == "" {
			return kind.Config{}, false // the lab's default kubeconfig: a lab pod
		}
		cs, ns, err := o.client()
		if err != nil {
			return kind.Config{}, false
		}
		pod, err := cs.CoreV1().Pods(ns).Get(ctx, target, metav1.GetOptions{})
		if err != nil {
			return kind.Config{}, false
		}
		node = pod.Spec.NodeName
	}
	if _, err := cfg.NodeNamed(node); err == nil {
		return kind.Config{}, false
	}
	return kc, node != "" && kc.IsNode(ctx, node)
}

// runKind does a node-side action on a node of the kind cluster: the same verbs as the
// lab's, with the node's container (test/kind/chaos.go).
func (o *chaosOptions) runKind(ctx context.Context, kc kind.Config, action, target string, w io.Writer) (string, error) {
	switch action {
	case "partition":
		link, err := kc.Partition(ctx, target)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(w, "partition: %s is off the network (the host end of its container's veth, %s, down): its kubelet, agent and pods reach neither the API server nor the other nodes, and keep running\n", target, link)
		fmt.Fprintf(w, "partition: the node controller marks it NotReady once its status is older than --node-monitor-grace-period (kind: 40s), then taints it node.kubernetes.io/unreachable\n")
		return "coronerctl chaos heal " + cli.Quote(target), nil
	case "heal":
		link, err := kc.Heal(ctx, target)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(w, "heal: %s is back on the network (link %s up); it is Ready again at its next status update\n", target, link)
		return "coronerctl chaos partition " + cli.Quote(target), nil
	case "kill-kubelet":
		pid, err := kc.KillKubelet(ctx, target)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(w, "kill-kubelet: killed the kubelet of %s (pid %d in the node) with SIGKILL and keeps its unit stopped; its containers keep running, nothing reports the node's status\n", target, pid)
		return "coronerctl chaos start-kubelet " + cli.Quote(target), nil
	case "start-kubelet":
		pid, err := kc.StartKubelet(ctx, target)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(w, "start-kubelet: started the kubelet unit of %s again (pid %d in the node)\n", target, pid)
		return "coronerctl chaos kill-kubelet " + cli.Quote(target), nil
	case "oom":
		if !o.Node {
			return "", fmt.Errorf("oom without --node on a kind node: give the pod a memory limit instead (kind's pods are OOM-killed at their own limits for real)")
		}
		cs, ns, err := o.client()
		if err != nil {
			return "", err
		}
		pod, err := cs.CoreV1().Pods(ns).Get(ctx, target, metav1.GetOptions{})
		if err != nil {
			return "", err
		}
		res, err := kc.NodeOOM(ctx, pod.Spec.NodeName, o.Timeout)
		return o.reportOOM(w, res, "the cgroup of all the pods of kind node "+pod.Spec.NodeName+" (as if the node ran out of memory)", err)
	}
	return "", fmt.Errorf("unknown action %q", action)
}
