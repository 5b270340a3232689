package lab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
)

// workload is a DaemonSet or Deployment that the overlay deploys.
type workload struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

func (w workload) String() string { return fmt.Sprintf("%s %s/%s", w.Kind, w.Namespace, w.Name) }

// deploy renders the overlay with kubectl's kustomize, applies it (server-side) and
// returns the workloads it contains.
func (c Config) deploy(ctx context.Context, say func(string, ...any)) ([]workload, error) {
	if _, err := os.Stat(c.Overlay); err != nil {
		return nil, err
	}
	rendered, err := c.Kubectl(ctx, nil, "kustomize", c.Overlay)
	if err != nil {
		return nil, fmt.Errorf("kubectl kustomize %s: %w", c.shortPath(c.Overlay), err)
	}
	objs, err := decodeObjects(rendered)
	if err != nil {
		return nil, fmt.Errorf("reading the rendered %s: %w", c.shortPath(c.Overlay), err)
	}
	var wls []workload
	for _, o := range objs {
		if o.GetKind() == "DaemonSet" || o.GetKind() == "Deployment" {
			ns := o.GetNamespace()
			if ns == "" {
				ns = "default"
			}
			wls = append(wls, workload{Kind: o.GetKind(), Namespace: ns, Name: o.GetName()})
		}
	}
	say("%s renders %d objects", c.shortPath(c.Overlay), len(objs))
	out, err := c.Kubectl(ctx, rendered, "apply", "--server-side", "--force-conflicts", "--field-manager=coroner-lab", "-f", "-")
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if l != "" {
			say("%s", l)
		}
	}
	if err != nil {
		return wls, fmt.Errorf("kubectl apply: %w", err)
	}
	return wls, nil
}

// Kubectl runs the lab's kubectl against the lab, stdin from in; it returns stdout, and
// stderr in the error.
func (c Config) Kubectl(ctx context.Context, in []byte, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, c.bin("kubectl"), append([]string{"--kubeconfig=" + c.Kubeconfig()}, args...)...)
	if in != nil {
		cmd.Stdin = bytes.NewReader(in)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

func decodeObjects(b []byte) ([]*unstructured.Unstructured, error) {
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, err
		}
		if len(m) == 0 {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
}

// workloadStatus is what the lab tells about one workload of coroner.
type workloadStatus struct {
	workload
	Desired, Ready int
	// Pods are one line per pod: name, node, state.
	Pods []string
	// Settled: every pod is ready or has shown how it fails (crashed, image missing...).
	Settled bool
	// Images are the container images of the pod template.
	Images []string
}

// waitWorkloads waits until every workload is ready or has settled into a failure, up to
// timeout, and returns their status.
func (c Config) waitWorkloads(ctx context.Context, wls []workload, timeout time.Duration) ([]workloadStatus, error) {
	cs, err := c.Clientset()
	if err != nil {
		return nil, err
	}
	var sts []workloadStatus
	err = Poll(ctx, timeout, "coroner's pods", func() (bool, error) {
		sts = sts[:0]
		all := true
		for _, w := range wls {
			s := workloadState(ctx, cs, w)
			sts = append(sts, s)
			all = all && s.Settled
		}
		return all, nil
	})
	if err != nil && ctx.Err() != nil {
		return sts, err
	}
	return sts, nil
}

// workloadState reads a workload and its pods.
func workloadState(ctx context.Context, cs kubernetes.Interface, w workload) workloadStatus {
	s := workloadStatus{workload: w}
	var selector *metav1.LabelSelector
	var tmpl corev1.PodTemplateSpec
	switch w.Kind {
	case "DaemonSet":
		ds, err := cs.AppsV1().DaemonSets(w.Namespace).Get(ctx, w.Name, metav1.GetOptions{})
		if err != nil {
			s.Pods = []string{"not found: " + err.Error()}
			return s
		}
		s.Desired, s.Ready, selector, tmpl = int(ds.Status.DesiredNumberScheduled), int(ds.Status.NumberReady), ds.Spec.Selector, ds.Spec.Template
	case "Deployment":
		d, err := cs.AppsV1().Deployments(w.Namespace).Get(ctx, w.Name, metav1.GetOptions{})
		if err != nil {
			s.Pods = []string{"not found: " + err.Error()}
			return s
		}
		s.Desired, s.Ready, selector, tmpl = int(replicas(d)), int(d.Status.ReadyReplicas), d.Spec.Selector, d.Spec.Template
	}
	for _, ctr := range tmpl.Spec.Containers {
		s.Images = append(s.Images, ctr.Image)
	}
	sel, err := metav1.LabelSelectorAsSelector(selector)
	if err != nil {
		sel = labels.Nothing()
	}
	pods, err := cs.CoreV1().Pods(w.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		s.Pods = []string{"listing pods: " + err.Error()}
		return s
	}
	sort.Slice(pods.Items, func(i, j int) bool { return pods.Items[i].Spec.NodeName < pods.Items[j].Spec.NodeName })
	settled := 0
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.DeletionTimestamp != nil {
			continue
		}
		line, done := podState(p)
		if done {
			settled++
		}
		node := p.Spec.NodeName
		if node == "" {
			node = "(unscheduled)"
		}
		s.Pods = append(s.Pods, fmt.Sprintf("%s on %s: %s", p.Name, node, line))
	}
	s.Settled = s.Desired > 0 && len(s.Pods) >= s.Desired && settled >= s.Desired
	return s
}

func replicas(d *appsv1.Deployment) int32 {
	if d.Spec.Replicas == nil {
		return 1
	}
	return *d.Spec.Replicas
}

// failing waiting reasons: the pod will not get better by itself.
var failingReasons = map[string]bool{
	"CrashLoopBackOff": true, "ErrImageNeverPull": true, "ErrImagePull": true, "ImagePullBackOff": true,
	"CreateContainerConfigError": true, "CreateContainerError": true, "InvalidImageName": true, "RunContainerError": true,
}

// podState says how a pod is doing, and whether it has settled (ready, or visibly failing).
func podState(p *corev1.Pod) (string, bool) {
	if p.Spec.NodeName == "" {
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
				return "Pending: " + c.Message, false
			}
		}
		return "Pending", false
	}
	ready := false
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			ready = true
		}
	}
	if ready {
		return "Running, ready", true
	}
	var parts []string
	settled := false
	for _, cs := range p.Status.ContainerStatuses {
		switch {
		case cs.State.Waiting != nil:
			w := cs.State.Waiting
			part := cs.Name + ": " + w.Reason
			if w.Message != "" && w.Reason != "CrashLoopBackOff" {
				part += " (" + firstLine(w.Message) + ")"
			}
			parts = append(parts, part)
			settled = settled || failingReasons[w.Reason]
		case cs.State.Terminated != nil:
			t := cs.State.Terminated
			parts = append(parts, fmt.Sprintf("%s: terminated, exit %d %s", cs.Name, t.ExitCode, t.Reason))
			settled = true
		case cs.State.Running != nil:
			parts = append(parts, cs.Name+": running, not ready")
		}
		if t := cs.LastTerminationState.Terminated; t != nil {
			parts = append(parts, fmt.Sprintf("restarted %d times, last exit %d %s", cs.RestartCount, t.ExitCode, t.Reason))
			if msg := strings.TrimSpace(t.Message); msg != "" {
				parts = append(parts, "message: "+firstLine(msg))
			}
			settled = true
		}
	}
	if len(parts) == 0 {
		return string(p.Status.Phase), false
	}
	return string(p.Status.Phase) + ": " + strings.Join(parts, "; "), settled
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i] + " ..."
	}
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}

// lastLogLine returns the last line a pod's (previous, when it restarted) container
// wrote, for pods that are not ready.
func lastLogLine(ctx context.Context, cs kubernetes.Interface, ns, pod string) string {
	p, err := cs.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
	if err != nil || len(p.Status.ContainerStatuses) == 0 {
		return ""
	}
	c := p.Status.ContainerStatuses[0]
	tail := int64(1)
	opts := &corev1.PodLogOptions{Container: c.Name, TailLines: &tail, Previous: c.RestartCount > 0 && c.State.Running == nil}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	b, err := cs.CoreV1().Pods(ns).GetLogs(pod, opts).DoRaw(cctx)
	if err != nil {
		return ""
	}
	return firstLine(string(b))
}

// reportWorkloads prints the workloads' state, with the last log line of pods that are not
// ready; it returns whether all are ready.
func (c Config) reportWorkloads(ctx context.Context, sts []workloadStatus, say func(string, ...any)) bool {
	cs, err := c.Clientset()
	if err != nil {
		say("%v", err)
		return false
	}
	allReady := true
	for _, s := range sts {
		verdict := "ready"
		if s.Desired == 0 || s.Ready < s.Desired {
			verdict = "NOT READY"
			allReady = false
		}
		say("%s: %d/%d ready (%s)", s.workload, s.Ready, s.Desired, verdict)
		for _, p := range s.Pods {
			say("  %s", p)
			if !strings.Contains(p, "Running, ready") {
				name := p[:strings.IndexByte(p, ' ')]
				if l := lastLogLine(ctx, cs, s.Namespace, name); l != "" {
					say("    last log line: %s", l)
				}
			}
		}
	}
	return allReady
}
