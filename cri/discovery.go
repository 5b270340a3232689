package cri

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// EndpointAuto (or an empty Endpoint) makes the Watcher find the runtime's socket among
// Options.Sockets (default DefaultSockets).
const EndpointAuto = "auto"

// DefaultSockets are the CRI sockets that discovery tries, in this order: containerd,
// CRI-O (at /var/run and /run: the same file where /var/run links to /run, but an image
// may lack the link), k3s and rke2's embedded containerd, and cri-dockerd.
var DefaultSockets = []string{
	"/run/containerd/containerd.sock",
	"/var/run/crio/crio.sock",
	"/run/crio/crio.sock",
	"/run/k3s/containerd/containerd.sock",
	"/var/run/cri-dockerd.sock",
}

// IsAuto reports whether endpoint asks for discovery ("" or "auto").
func IsAuto(endpoint string) bool { return endpoint == "" || endpoint == EndpointAuto }

// errNoSocket: nothing at the socket's path.
var errNoSocket = errors.New("no such socket")

// conn is an open connection to a runtime that answered CRI Version.
type conn struct {
	cc       *grpc.ClientConn
	rt       runtimeapi.RuntimeServiceClient
	version  *runtimeapi.VersionResponse
	endpoint string // unix:///path
	path     string
}

// dialSocket opens a gRPC connection to a unix socket (lazily: nothing is dialled before
// the first call).
func dialSocket(path func() (string, error)) (*grpc.ClientConn, error) {
	return grpc.NewClient("passthrough:///cri",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			p, err := path()
			if err != nil {
				return nil, err
			}
			var d net.Dialer
			return d.DialContext(ctx, "unix", p)
		}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)),
	)
}

// probe connects to the socket at path and asks CRI Version. Its errors do not name the
// endpoint; errNoSocket when there is nothing at path.
func (w *Watcher) probe(ctx context.Context, path string) (*conn, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("%w (%v)", errNoSocket, err)
	}
	cc, err := dialSocket(func() (string, error) { return path, nil })
	if err != nil {
		return nil, err
	}
	rt := runtimeapi.NewRuntimeServiceClient(cc)
	vctx, cancel := context.WithTimeout(ctx, w.opts.CallTimeout)
	v, err := rt.Version(vctx, &runtimeapi.VersionRequest{})
	cancel()
	if err != nil {
		cc.Close()
		if status.Code(err) == codes.Unimplemented {
			return nil, fmt.Errorf("does not serve the CRI v1 RuntimeService (Version: %s): not a CRI runtime, or one too old for CRI v1", status.Convert(err).Message())
		}
		return nil, fmt.Errorf("Version: %w", err)
	}
	return &conn{cc: cc, rt: rt, version: v, endpoint: "unix://" + path, path: path}, nil
}

// connect opens a connection to the runtime: the configured endpoint, or with discovery
// the socket found before, else the first candidate that answers CRI Version. Once
// found, a socket is kept for the Watcher's life (a restarting runtime is waited for, not
// replaced by another candidate).
func (w *Watcher) connect(ctx context.Context) (*conn, error) {
	if w.endpointErr != nil {
		return nil, w.endpointErr
	}
	if p := w.socket(); p != "" {
		c, err := w.probe(ctx, p)
		switch {
		case errors.Is(err, errNoSocket):
			return nil, fmt.Errorf("CRI endpoint unix://%s: socket %s does not exist: is the container runtime running? (%v)", p, p, errors.Unwrap(err))
		case err != nil:
			return nil, fmt.Errorf("CRI endpoint unix://%s: %w", p, err)
		}
		return c, nil
	}
	var tried []string
	for _, s := range w.opts.Sockets {
		p := filepath.Join(w.opts.HostPrefix, s)
		c, err := w.probe(ctx, p)
		if err == nil {
			w.sockMu.Lock()
			w.socketPath = p
			w.sockMu.Unlock()
			return c, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if errors.Is(err, errNoSocket) {
			tried = append(tried, p+": no such socket")
		} else {
			tried = append(tried, p+": "+err.Error())
		}
	}
	return nil, fmt.Errorf("no container runtime found: tried %s (set the CRI endpoint explicitly if the runtime's socket is elsewhere, or mount its directory)", strings.Join(tried, "; "))
}

// socket is the runtime's socket: the configured one, the one discovery found, or "".
func (w *Watcher) socket() string {
	w.sockMu.Lock()
	defer w.sockMu.Unlock()
	return w.socketPath
}

// Endpoint is the runtime's CRI endpoint, unix:///path: the configured one, or the one
// discovery found; "" while discovery has found none.
func (w *Watcher) Endpoint() string {
	if p := w.socket(); p != "" {
		return "unix://" + p
	}
	return ""
}
