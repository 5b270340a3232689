package containerd

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/coroner-dev/coroner/test/images"
)

// The kubelet's CRI labels, which the agent maps containers to pods by.
const (
	LabelPodName       = "io.kubernetes.pod.name"
	LabelPodNamespace  = "io.kubernetes.pod.namespace"
	LabelPodUID        = "io.kubernetes.pod.uid"
	LabelContainerName = "io.kubernetes.container.name"
)

// Pod is a pod sandbox created the way the kubelet creates one.
type Pod struct {
	Namespace, Name, UID string
	// SandboxID is the CRI pod sandbox id.
	SandboxID string
	// CgroupParent is the sandbox's cgroup parent, relative to each v1 hierarchy's root:
	// /<Env.CgroupName>/pod<UID>.
	CgroupParent string

	env    *Env
	config *runtimeapi.PodSandboxConfig
}

// RunPod creates and starts a pod sandbox with the kubelet's labels, in the node's network
// namespace (no CNI), with cgroup parent /<test cgroup>/pod<uid> and logs under Env.Dir.
func (e *Env) RunPod(ctx context.Context, namespace, name string) (*Pod, error) {
	uid := newUID()
	p := &Pod{Namespace: namespace, Name: name, UID: uid, env: e,
		CgroupParent: "/" + e.CgroupName + "/pod" + uid}
	logDir := filepath.Join(e.Dir, "pods", namespace+"_"+name+"_"+uid)
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return nil, err
	}
	p.config = &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: name, Namespace: namespace, Uid: uid},
		// No Hostname: a pod in the node's network namespace has no UTS namespace of its own.
		Labels: map[string]string{
			LabelPodName:      name,
			LabelPodNamespace: namespace,
			LabelPodUID:       uid,
		},
		Annotations:  map[string]string{"kubernetes.io/config.source": "api"},
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
	r, err := e.Runtime.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: p.config})
	if err != nil {
		return nil, fmt.Errorf("RunPodSandbox %s/%s: %w", namespace, name, err)
	}
	p.SandboxID = r.PodSandboxId
	return p, nil
}

// Container describes an app container to create in a Pod.
type Container struct {
	Name string
	// Image defaults to images.BusyboxName.
	Image   string
	Command []string
	Args    []string
	// MemoryLimit in bytes; 0 means none.
	MemoryLimit int64
	// Unlabeled leaves out the kubelet's labels, as for a container some other CRI client
	// created.
	Unlabeled bool
}

// StartContainer creates and starts c in the pod with the kubelet's labels and annotations,
// and returns the container id.
func (p *Pod) StartContainer(ctx context.Context, c Container) (string, error) {
	image := c.Image
	if image == "" {
		image = images.BusyboxName
	}
	labels := map[string]string{
		LabelContainerName: c.Name,
		LabelPodName:       p.Name,
		LabelPodNamespace:  p.Namespace,
		LabelPodUID:        p.UID,
	}
	if c.Unlabeled {
		labels = map[string]string{"test": "unlabeled"}
	}
	cfg := &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: c.Name},
		Image:    &runtimeapi.ImageSpec{Image: image},
		Command:  c.Command,
		Args:     c.Args,
		Labels:   labels,
		Annotations: map[string]string{
			"io.kubernetes.container.restartCount":           "0",
			"io.kubernetes.container.terminationMessagePath": "/dev/termination-log",
		},
		LogPath: c.Name + "_0.log",
		Linux: &runtimeapi.LinuxContainerConfig{
			Resources: &runtimeapi.LinuxContainerResources{
				CpuShares:          2,
				MemoryLimitInBytes: c.MemoryLimit,
			},
			SecurityContext: &runtimeapi.LinuxContainerSecurityContext{
				NamespaceOptions: p.config.Linux.SecurityContext.NamespaceOptions,
			},
		},
	}
	rt := p.env.Runtime
	cr, err := rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: p.SandboxID, Config: cfg, SandboxConfig: p.config})
	if err != nil {
		return "", fmt.Errorf("CreateContainer %s in %s/%s: %w", c.Name, p.Namespace, p.Name, err)
	}
	if _, err := rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: cr.ContainerId}); err != nil {
		return cr.ContainerId, fmt.Errorf("StartContainer %s in %s/%s: %w", c.Name, p.Namespace, p.Name, err)
	}
	return cr.ContainerId, nil
}

// Remove stops and removes the pod sandbox and its containers.
func (p *Pod) Remove(ctx context.Context) error {
	if _, err := p.env.Runtime.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: p.SandboxID}); err != nil {
		return err
	}
	_, err := p.env.Runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: p.SandboxID})
	return err
}

// ContainerStatus returns the CRI status of a container.
func (e *Env) ContainerStatus(ctx context.Context, id string) (*runtimeapi.ContainerStatus, error) {
	r, err := e.Runtime.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		return nil, err
	}
	return r.Status, nil
}

// newUID returns a random UUID (version 4), like a pod's metadata.uid.
func newUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}
