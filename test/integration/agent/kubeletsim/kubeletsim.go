// Package kubeletsim plays the kubelet of a node for tests and benchmarks of the node
// agent, against a real API server (test/harness) and a real containerd
// (test/containerd): it creates a Pod object bound to the node, then the pod's sandbox
// and containers over CRI with the kubelet's labels, carrying the Pod object's UID (the
// API server assigns it, which is why test/containerd's RunPod, which makes up its own,
// does not do here), and it writes pod status where a test plays the kubelet's part.
//
// Sandboxes are made as test/containerd makes them: the node's network namespace, cgroup
// parent /<Env.CgroupName>/pod<uid> (so the Env's Stop removes them), logs under Env.Dir.
// As the kubelet does, a sandbox carries the pod's labels and identity and, as its
// annotations (PodSandboxConfig.Annotations), the Pod object's annotations with the two
// the kubelet adds to its own copy of a pod (kubernetes.io/config.source "api" and
// kubernetes.io/config.seen).
package kubeletsim

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/coroner-dev/coroner/test/containerd"
	"github.com/coroner-dev/coroner/test/images"
)

// Node is one node's kubelet, played over an API client and a containerd.
type Node struct {
	Name   string
	Client kubernetes.Interface
	CRI    *containerd.Env
}

// PodOptions shape the Pod object.
type PodOptions struct {
	// RestartPolicy defaults to Never.
	RestartPolicy corev1.RestartPolicy
	// Containers are the pod's app containers: name, command and memory limit go into
	// the Pod object's spec (image busybox, imagePullPolicy Never); start each with
	// Pod.StartContainer.
	Containers []containerd.Container
	// Labels, Annotations and Finalizers go on the Pod object.
	Labels      map[string]string
	Annotations map[string]string
	Finalizers  []string
	// Mutate, when set, changes the Pod object before it is created (extended resources,
	// say).
	Mutate func(*corev1.Pod)
}

// Pod is a Pod object and its sandbox.
type Pod struct {
	// Object is the Pod as the API server returned it at creation.
	Object       *corev1.Pod
	SandboxID    string
	CgroupParent string

	node   *Node
	config *runtimeapi.PodSandboxConfig
	specs  map[string]containerd.Container
}

// CreatePod creates the Pod object bound to the node, then its sandbox.
func (n *Node) CreatePod(ctx context.Context, namespace, name string, opts PodOptions) (*Pod, error) {
	policy := opts.RestartPolicy
	if policy == "" {
		policy = corev1.RestartPolicyNever
	}
	obj := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: opts.Labels, Annotations: opts.Annotations, Finalizers: opts.Finalizers},
		Spec: corev1.PodSpec{
			NodeName:                      n.Name,
			RestartPolicy:                 policy,
			TerminationGracePeriodSeconds: ptr(int64(30)),
		},
	}
	specs := map[string]containerd.Container{}
	for _, c := range opts.Containers {
		spec := corev1.Container{Name: c.Name, Image: images.BusyboxName, ImagePullPolicy: corev1.PullNever,
			Command: c.Command, Args: c.Args}
		if c.MemoryLimit > 0 {
			spec.Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: *resource.NewQuantity(c.MemoryLimit, resource.BinarySI)}
		}
		obj.Spec.Containers = append(obj.Spec.Containers, spec)
		specs[c.Name] = c
	}
	if opts.Mutate != nil {
		opts.Mutate(obj)
	}
	created, err := n.Client.CoreV1().Pods(namespace).Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("creating pod %s/%s: %w", namespace, name, err)
	}
	p := &Pod{Object: created, node: n, specs: specs}
	if err := p.runSandbox(ctx); err != nil {
		return p, err
	}
	return p, nil
}

// runSandbox makes the pod's sandbox the way the kubelet does, with the Pod object's UID.
func (p *Pod) runSandbox(ctx context.Context) error {
	env := p.node.CRI
	o := p.Object
	uid := string(o.UID)
	p.CgroupParent = "/" + env.CgroupName + "/pod" + uid
	logDir := filepath.Join(env.Dir, "pods", o.Namespace+"_"+o.Name+"_"+uid)
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return err
	}
	p.config = &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: o.Name, Namespace: o.Namespace, Uid: uid},
		Labels: map[string]string{
			containerd.LabelPodName:      o.Name,
			containerd.LabelPodNamespace: o.Namespace,
			containerd.LabelPodUID:       uid,
		},
		Annotations:  sandboxAnnotations(o, time.Now()),
		LogDirectory: logDir,
		Linux: &runtimeapi.LinuxPodSandboxConfig{
			CgroupParent: p.CgroupParent,
			SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
				NamespaceOptions: &runtimeapi.NamespaceOption{
					Network: runtimeapi.NamespaceMode_NODE,
					Pid:     runtimeapi.NamespaceMode_CONTAINER,
					Ipc:     runtimeapi.NamespaceMode_POD,
				},
			},
		},
	}
	r, err := env.Runtime.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: p.config})
	if err != nil {
		return fmt.Errorf("RunPodSandbox %s/%s: %w", o.Namespace, o.Name, err)
	}
	p.SandboxID = r.PodSandboxId
	return nil
}

// sandboxAnnotations are the annotations the kubelet gives pod's sandbox: the pod's own,
// and the kubelet's config.source ("api") and config.seen (when it first saw the pod).
func sandboxAnnotations(pod *corev1.Pod, seen time.Time) map[string]string {
	out := make(map[string]string, len(pod.Annotations)+2)
	for k, v := range pod.Annotations {
		out[k] = v
	}
	out["kubernetes.io/config.source"] = "api"
	out["kubernetes.io/config.seen"] = seen.UTC().Format(time.RFC3339Nano)
	return out
}

// SandboxAnnotations returns the sandbox's annotations as the runtime reports them
// (PodSandboxStatus).
func (p *Pod) SandboxAnnotations(ctx context.Context) (map[string]string, error) {
	r, err := p.node.CRI.Runtime.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: p.SandboxID})
	if err != nil {
		return nil, err
	}
	return r.GetStatus().GetAnnotations(), nil
}

// StartContainer creates and starts the named container of the pod's spec (attempt 0)
// with the kubelet's labels and annotations, and returns its id.
func (p *Pod) StartContainer(ctx context.Context, name string) (string, error) {
	return p.StartAttempt(ctx, name, 0)
}

// StartAttempt creates and starts the named container of the pod's spec as the kubelet
// does after attempt restarts (CRI metadata attempt, the restartCount annotation, the
// log file <name>_<attempt>.log), and returns its id.
func (p *Pod) StartAttempt(ctx context.Context, name string, attempt uint32) (string, error) {
	c, ok := p.specs[name]
	if !ok {
		return "", fmt.Errorf("pod %s has no container %q", p.Object.Name, name)
	}
	o := p.Object
	cfg := &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: c.Name, Attempt: attempt},
		Image:    &runtimeapi.ImageSpec{Image: images.BusyboxName},
		Command:  c.Command,
		Args:     c.Args,
		Labels: map[string]string{
			containerd.LabelContainerName: c.Name,
			containerd.LabelPodName:       o.Name,
			containerd.LabelPodNamespace:  o.Namespace,
			containerd.LabelPodUID:        string(o.UID),
		},
		Annotations: map[string]string{
			"io.kubernetes.container.restartCount":           fmt.Sprint(attempt),
			"io.kubernetes.container.terminationMessagePath": "/dev/termination-log",
		},
		LogPath: fmt.Sprintf("%s_%d.log", c.Name, attempt),
		Linux: &runtimeapi.LinuxContainerConfig{
			Resources: &runtimeapi.LinuxContainerResources{CpuShares: 2, MemoryLimitInBytes: c.MemoryLimit},
			SecurityContext: &runtimeapi.LinuxContainerSecurityContext{
				NamespaceOptions: p.config.Linux.SecurityContext.NamespaceOptions,
			},
		},
	}
	rt := p.node.CRI.Runtime
	cr, err := rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: p.SandboxID, Config: cfg, SandboxConfig: p.config})
	if err != nil {
		return "", fmt.Errorf("CreateContainer %s in %s/%s: %w", c.Name, o.Namespace, o.Name, err)
	}
	if _, err := rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: cr.ContainerId}); err != nil {
		return cr.ContainerId, fmt.Errorf("StartContainer %s in %s/%s: %w", c.Name, o.Namespace, o.Name, err)
	}
	return cr.ContainerId, nil
}

// StopContainer stops a container as the kubelet does: SIGTERM, then SIGKILL after
// timeout seconds.
func (p *Pod) StopContainer(ctx context.Context, id string, timeout int64) error {
	_, err := p.node.CRI.Runtime.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: timeout})
	return err
}

// Status returns a container's CRI status.
func (p *Pod) Status(ctx context.Context, id string) (*runtimeapi.ContainerStatus, error) {
	return p.node.CRI.ContainerStatus(ctx, id)
}

// PID returns the host PID of a running container's main process.
func (p *Pod) PID(ctx context.Context, id string) (int, error) {
	r, err := p.node.CRI.Runtime.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: true})
	if err != nil {
		return 0, err
	}
	var info struct {
		PID int `json:"pid"`
	}
	if err := json.Unmarshal([]byte(r.GetInfo()["info"]), &info); err != nil || info.PID == 0 {
		return 0, fmt.Errorf("no pid in the verbose status of %s (%v)", id, err)
	}
	return info.PID, nil
}

// RemoveContainer removes an exited container, as the kubelet's garbage collection does
// with the instances of a restarting container older than the last one.
func (p *Pod) RemoveContainer(ctx context.Context, id string) error {
	_, err := p.node.CRI.Runtime.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id})
	return err
}

// Remove stops and removes the sandbox and its containers.
func (p *Pod) Remove(ctx context.Context) error {
	rt := p.node.CRI.Runtime
	if _, err := rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: p.SandboxID}); err != nil {
		return err
	}
	_, err := rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: p.SandboxID})
	return err
}

// ForceDelete deletes the Pod object at once (grace period 0), as the kubelet's final
// delete does; finalizers the test added must be gone first.
func (p *Pod) ForceDelete(ctx context.Context) error {
	return p.node.Client.CoreV1().Pods(p.Object.Namespace).Delete(ctx, p.Object.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))})
}

// Get reads the Pod object.
func (p *Pod) Get(ctx context.Context) (*corev1.Pod, error) {
	return p.node.Client.CoreV1().Pods(p.Object.Namespace).Get(ctx, p.Object.Name, metav1.GetOptions{})
}

// WriteTerminated plays the kubelet's status write for a pod whose container exited:
// phase (Failed or Succeeded) and the container's terminated state.
func (p *Pod) WriteTerminated(ctx context.Context, phase corev1.PodPhase, container string, st *runtimeapi.ContainerStatus) (*corev1.Pod, error) {
	cur, err := p.Get(ctx)
	if err != nil {
		return nil, err
	}
	cur.Status.Phase = phase
	cur.Status.ContainerStatuses = []corev1.ContainerStatus{{
		Name:        container,
		Image:       images.BusyboxName,
		ContainerID: "containerd://" + st.GetId(),
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode:    st.GetExitCode(),
			Reason:      st.GetReason(),
			StartedAt:   metav1.NewTime(nanos(st.GetStartedAt())),
			FinishedAt:  metav1.NewTime(nanos(st.GetFinishedAt())),
			ContainerID: "containerd://" + st.GetId(),
		}},
	}}
	return p.node.Client.CoreV1().Pods(cur.Namespace).UpdateStatus(ctx, cur, metav1.UpdateOptions{FieldManager: "kubelet"})
}

// WriteRunning plays the kubelet's status write for a pod whose container runs: phase
// Running and the container's running state, with its container ID.
func (p *Pod) WriteRunning(ctx context.Context, container string, st *runtimeapi.ContainerStatus) (*corev1.Pod, error) {
	cur, err := p.Get(ctx)
	if err != nil {
		return nil, err
	}
	cur.Status.Phase = corev1.PodRunning
	cur.Status.ContainerStatuses = []corev1.ContainerStatus{{
		Name:         container,
		Image:        images.BusyboxName,
		ContainerID:  "containerd://" + st.GetId(),
		Ready:        true,
		Started:      ptr(true),
		RestartCount: int32(st.GetMetadata().GetAttempt()),
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{
			StartedAt: metav1.NewTime(nanos(st.GetStartedAt())),
		}},
	}}
	return p.node.Client.CoreV1().Pods(cur.Namespace).UpdateStatus(ctx, cur, metav1.UpdateOptions{FieldManager: "kubelet"})
}

func ptr[T any](v T) *T { return &v }

// nanos converts CRI's nanoseconds since the epoch.
func nanos(ns int64) time.Time {
	if ns <= 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// FinishedAt is a container's CRI finish time (zero while it runs).
func FinishedAt(st *runtimeapi.ContainerStatus) time.Time { return nanos(st.GetFinishedAt()) }
