package agent

// The kubelet's PodResources API: which device IDs each container holds, for pods whose
// status does not say (allocatedResourcesStatus needs the kubelet's ResourceHealthStatus
// feature, on by default since 1.36). Asked only when a device-holding container dies and
// its devices are not known, and cached for a moment: nothing is polled at rest.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/utils/clock"
)

// DefaultPodResourcesSocket is the kubelet's PodResources socket.
const DefaultPodResourcesSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"

// podResourcesTTL is how long a List answer is reused: the exits of a pod's containers,
// or of a gang of pods, come together.
const podResourcesTTL = 2 * time.Second

// podResourcesTimeout bounds one List call.
const podResourcesTimeout = 2 * time.Second

// ErrNoPodResourcesSocket is List's error when the kubelet's socket does not exist.
var ErrNoPodResourcesSocket = errors.New("no PodResources socket")

// AllocatedDevices are the device IDs of one resource the kubelet allocated to a
// container.
type AllocatedDevices struct {
	Namespace, Pod, Container, Resource string
	IDs                                 []string
}

// PodResourcesLister lists the devices the kubelet allocated to the node's containers.
type PodResourcesLister interface {
	List(ctx context.Context) ([]AllocatedDevices, error)
}

// PodResourcesClient is the PodResourcesLister of the kubelet's socket: it connects on
// the first List, and reuses an answer for podResourcesTTL.
type PodResourcesClient struct {
	socket string
	clock  clock.PassiveClock

	mu       sync.Mutex
	conn     *grpc.ClientConn
	cached   []AllocatedDevices
	cachedAt time.Time
}

// NewPodResourcesClient returns a client of the kubelet's PodResources socket.
func NewPodResourcesClient(socket string, clk clock.PassiveClock) *PodResourcesClient {
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &PodResourcesClient{socket: socket, clock: clk}
}

// List returns the devices allocated to the node's containers (device plugins' only; DRA
// claims are in the pods' statuses). ErrNoPodResourcesSocket when the socket is missing.
func (c *PodResourcesClient) List(ctx context.Context) ([]AllocatedDevices, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clock.Now()
	if c.cached != nil && now.Sub(c.cachedAt) < podResourcesTTL {
		return c.cached, nil
	}
	if _, err := os.Stat(c.socket); errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w at %s", ErrNoPodResourcesSocket, c.socket)
	}
	if c.conn == nil {
		conn, err := grpc.NewClient("unix://"+c.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil, fmt.Errorf("PodResources at %s: %w", c.socket, err)
		}
		c.conn = conn
	}
	ctx, cancel := context.WithTimeout(ctx, podResourcesTimeout)
	defer cancel()
	resp, err := podresourcesv1.NewPodResourcesListerClient(c.conn).List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		return nil, fmt.Errorf("PodResources List at %s: %w", c.socket, err)
	}
	out := []AllocatedDevices{}
	for _, p := range resp.GetPodResources() {
		for _, ctr := range p.GetContainers() {
			for _, d := range ctr.GetDevices() {
				if len(d.GetDeviceIds()) == 0 {
					continue
				}
				out = append(out, AllocatedDevices{Namespace: p.GetNamespace(), Pod: p.GetName(), Container: ctr.GetName(),
					Resource: d.GetResourceName(), IDs: append([]string(nil), d.GetDeviceIds()...)})
			}
		}
	}
	c.cached, c.cachedAt = out, now
	return out, nil
}

// Close closes the connection, if any.
func (c *PodResourcesClient) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == nil {
		return nil
	}
	err := c.conn.Close()
	c.conn = nil
	return err
}
