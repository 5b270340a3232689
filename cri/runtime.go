package cri

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Container is a container the runtime lists, with its pod's identity from the kubelet's
// labels.
type Container struct {
	// ID is the runtime's id (without a containerd:// prefix); SandboxID the pod
	// sandbox's.
	ID, SandboxID string
	// Name is the container's name in its pod (io.kubernetes.container.name).
	Name                          string
	PodNamespace, PodName, PodUID string
	// Attempt is the CRI attempt number, the kubelet's restart count of the container.
	Attempt uint32
	// Running: the runtime reports the container running.
	Running bool
}

// Sandbox is a pod sandbox the runtime lists, with its pod's identity from the kubelet's
// labels and the annotations the kubelet gave it: a copy of the pod's annotations when it
// created the sandbox (PodSandboxConfig.Annotations), so that whether the pod is opted in
// to forceful deletion can be read without the API server.
type Sandbox struct {
	// ID is the runtime's id of the sandbox (Container.SandboxID).
	ID                            string
	PodNamespace, PodName, PodUID string
	// Annotations are the sandbox's (not nil; not to be modified).
	Annotations map[string]string
	// Ready: the runtime reports the sandbox ready (its pause process runs). A sandbox
	// that is not ready may still have running containers until the kubelet stops them.
	Ready bool
}

// RuntimeClient makes the few CRI calls the agent makes besides watching: listing the
// running containers and the pod sandboxes, and stopping a container (fencing,
// requirement A6). It has its own
// connection to the runtime, independent of a Watcher's, so that it works whatever state
// the Watcher's session is in; gRPC reconnects it as needed (at most MaxBackoff apart).
type RuntimeClient struct {
	endpoint    string
	conn        *grpc.ClientConn
	rt          runtimeapi.RuntimeServiceClient
	callTimeout time.Duration
}

// NewRuntimeClient returns a client of the CRI runtime at endpoint (unix:///path or a
// bare /path). Nothing is dialled until the first call, so a runtime that is not there
// yet is not an error here: calls fail until it is.
func NewRuntimeClient(endpoint string) (*RuntimeClient, error) {
	path, err := socketPath(endpoint)
	if err != nil {
		return nil, err
	}
	return newRuntimeClient(endpoint, func() (string, error) { return path, nil })
}

// RuntimeClient returns a client of the Watcher's runtime, with a connection of its own:
// at the configured endpoint, or, with discovery, at the socket the Watcher found (calls
// fail while it has found none).
func (w *Watcher) RuntimeClient() (*RuntimeClient, error) {
	if w.endpointErr != nil {
		return nil, w.endpointErr
	}
	name := w.opts.Endpoint
	if IsAuto(name) {
		name = EndpointAuto
	}
	return newRuntimeClient(name, func() (string, error) {
		if p := w.socket(); p != "" {
			return p, nil
		}
		return "", errors.New("no container runtime found yet")
	})
}

func newRuntimeClient(endpoint string, path func() (string, error)) (*RuntimeClient, error) {
	bc := backoff.DefaultConfig
	bc.MaxDelay = 5 * time.Second
	conn, err := grpc.NewClient("passthrough:///cri",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			p, err := path()
			if err != nil {
				return nil, err
			}
			var d net.Dialer
			return d.DialContext(ctx, "unix", p)
		}),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: bc, MinConnectTimeout: 5 * time.Second}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)),
	)
	if err != nil {
		return nil, fmt.Errorf("CRI endpoint %s: %w", endpoint, err)
	}
	return &RuntimeClient{endpoint: endpoint, conn: conn, rt: runtimeapi.NewRuntimeServiceClient(conn), callTimeout: 10 * time.Second}, nil
}

// Close closes the connection.
func (c *RuntimeClient) Close() error { return c.conn.Close() }

// RunningContainers lists the running containers that carry the kubelet's labels
// (others, made by another CRI client, are left out).
func (c *RuntimeClient) RunningContainers(ctx context.Context) ([]Container, error) {
	ctx, cancel := context.WithTimeout(ctx, c.callTimeout)
	defer cancel()
	r, err := c.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING},
	}})
	if err != nil {
		return nil, fmt.Errorf("CRI endpoint %s: ListContainers: %w", c.endpoint, err)
	}
	out := make([]Container, 0, len(r.GetContainers()))
	for _, rc := range r.GetContainers() {
		// The filter is the runtime's to apply; checked again all the same.
		if ct, ok := containerOf(rc); ok && ct.Running {
			out = append(out, ct)
		}
	}
	return out, nil
}

// containerOf maps a listed container with the kubelet's labels.
func containerOf(rc *runtimeapi.Container) (Container, bool) {
	l := rc.GetLabels()
	if !hasKubeletLabels(l) {
		return Container{}, false
	}
	return Container{
		ID: rc.GetId(), SandboxID: rc.GetPodSandboxId(),
		Name:         l[LabelContainerName],
		PodNamespace: l[LabelPodNamespace], PodName: l[LabelPodName], PodUID: l[LabelPodUID],
		Attempt: rc.GetMetadata().GetAttempt(),
		Running: rc.GetState() == runtimeapi.ContainerState_CONTAINER_RUNNING,
	}, true
}

// Sandboxes lists the pod sandboxes that carry the kubelet's pod labels
// (io.kubernetes.pod.namespace, .name and .uid; others, made by another CRI client, are
// left out), ready or not, with their annotations: a running container's sandbox is
// listed whatever its state (containers can outlive their sandbox's pause process), so
// that a caller that lists the containers first finds the sandbox of each.
func (c *RuntimeClient) Sandboxes(ctx context.Context) ([]Sandbox, error) {
	ctx, cancel := context.WithTimeout(ctx, c.callTimeout)
	defer cancel()
	r, err := c.rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return nil, fmt.Errorf("CRI endpoint %s: ListPodSandbox: %w", c.endpoint, err)
	}
	out := make([]Sandbox, 0, len(r.GetItems()))
	for _, rs := range r.GetItems() {
		if s, ok := sandboxOf(rs); ok {
			out = append(out, s)
		}
	}
	return out, nil
}

// sandboxOf maps a listed sandbox with the kubelet's pod labels.
func sandboxOf(rs *runtimeapi.PodSandbox) (Sandbox, bool) {
	l := rs.GetLabels()
	if l[LabelPodNamespace] == "" || l[LabelPodName] == "" || l[LabelPodUID] == "" || rs.GetId() == "" {
		return Sandbox{}, false
	}
	ann := rs.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	return Sandbox{
		ID:           rs.GetId(),
		PodNamespace: l[LabelPodNamespace], PodName: l[LabelPodName], PodUID: l[LabelPodUID],
		Annotations: ann,
		Ready:       rs.GetState() == runtimeapi.PodSandboxState_SANDBOX_READY,
	}, true
}

// StopContainer stops a container as the kubelet does: SIGTERM (or the image's stop
// signal), then SIGKILL once timeout has passed (rounded up to whole seconds, as CRI
// counts them); it returns once the container has exited. A container that does not
// exist (any more) is not an error: it does not run.
func (c *RuntimeClient) StopContainer(ctx context.Context, id string, timeout time.Duration) error {
	secs := int64((max(timeout, 0) + time.Second - 1) / time.Second)
	ctx, cancel := context.WithTimeout(ctx, time.Duration(secs)*time.Second+c.callTimeout)
	defer cancel()
	_, err := c.rt.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: secs})
	if status.Code(err) == codes.NotFound {
		return nil
	}
	if err != nil {
		return fmt.Errorf("CRI endpoint %s: StopContainer %s: %w", c.endpoint, id, err)
	}
	return nil
}
