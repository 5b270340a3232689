package deviceplugin

// fakekubelet_test.go: what the tests stand in for the kubelet with, and their helpers.

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2/ktesting"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// testTimeout bounds every wait of these tests; none sleeps.
const testTimeout = 10 * time.Second

// fakeKubelet stands in for the kubelet's device manager, and only for its Registration
// service on kubelet.sock: like the kubelet it deletes the sockets in the directory when it
// starts, and on Register it connects back to the plugin's endpoint and asks for its options
// before it answers. The plugin under test is the real one.
type fakeKubelet struct {
	dir        string
	registered chan registration

	mu     sync.Mutex
	refuse int // how many Register calls to refuse before accepting
	gen    int // how many times it started: its restarts tell apart
	server *grpc.Server
	served chan struct{}
}

// registrar is the Registration service of one start of the fake kubelet.
type registrar struct {
	pluginapi.UnimplementedRegistrationServer
	k   *fakeKubelet
	gen int
}

// registration is one Register call the fake kubelet got.
type registration struct {
	gen     int // the fake kubelet's start that got it
	req     *pluginapi.RegisterRequest
	options *pluginapi.DevicePluginOptions // from the plugin, asked back
	err     error                          // what the fake kubelet answered
}

// startFakeKubelet starts a fake kubelet in dir; the test's cleanup stops it.
func startFakeKubelet(t *testing.T, dir string) *fakeKubelet {
	t.Helper()
	k := &fakeKubelet{dir: dir, registered: make(chan registration, 16)}
	k.start(t, true)
	t.Cleanup(k.stop)
	return k
}

// start listens on kubelet.sock; with cleanup, it first deletes every socket in the
// directory, as the kubelet's device manager does when it starts.
func (k *fakeKubelet) start(t *testing.T, cleanup bool) {
	t.Helper()
	if cleanup {
		entries, err := os.ReadDir(k.dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if e.Type()&os.ModeSocket != 0 {
				if err := os.Remove(filepath.Join(k.dir, e.Name())); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	l, err := net.Listen("unix", filepath.Join(k.dir, KubeletSocketName))
	if err != nil {
		t.Fatal(err)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.gen++
	k.server = grpc.NewServer()
	pluginapi.RegisterRegistrationServer(k.server, &registrar{k: k, gen: k.gen})
	k.served = make(chan struct{})
	go func(s *grpc.Server, served chan struct{}) {
		defer close(served)
		_ = s.Serve(l) // ends when the test stops the fake kubelet
	}(k.server, k.served)
}

// stop stops serving; closing the listener removes kubelet.sock.
func (k *fakeKubelet) stop() {
	k.mu.Lock()
	s, served := k.server, k.served
	k.server = nil
	k.mu.Unlock()
	if s != nil {
		s.Stop()
		<-served
	}
}

// restart is a kubelet's restart: stop, then start deleting the plugins' sockets.
func (k *fakeKubelet) restart(t *testing.T) {
	k.stop()
	k.start(t, true)
}

func (g *registrar) Register(ctx context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k := g.k
	r := registration{gen: g.gen, req: req}
	k.mu.Lock()
	refuse := k.refuse > 0
	if refuse {
		k.refuse--
	}
	k.mu.Unlock()
	if refuse {
		r.err = errors.New("refused by the test")
	} else {
		r.options, r.err = k.dialBack(ctx, req.Endpoint)
	}
	k.registered <- r
	return &pluginapi.Empty{}, r.err
}

func (k *fakeKubelet) dialBack(ctx context.Context, endpoint string) (*pluginapi.DevicePluginOptions, error) {
	conn, err := grpc.NewClient("unix://"+filepath.Join(k.dir, endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, testTimeout)
	defer cancel()
	return pluginapi.NewDevicePluginClient(conn).GetDevicePluginOptions(ctx, &pluginapi.Empty{})
}

// nextRegistration waits for the fake kubelet's next Register call.
func (k *fakeKubelet) nextRegistration(t *testing.T) registration {
	t.Helper()
	select {
	case r := <-k.registered:
		return r
	case <-time.After(testTimeout):
		t.Fatalf("no Register call within %v", testTimeout)
		return registration{}
	}
}

// registeredWithCurrent waits for a successful Register call to the fake kubelet's latest
// start; calls to an earlier start, which a restart can cut, are logged and skipped.
func (k *fakeKubelet) registeredWithCurrent(t *testing.T) registration {
	t.Helper()
	k.mu.Lock()
	current := k.gen
	k.mu.Unlock()
	for {
		r := k.nextRegistration(t)
		if r.gen == current && r.err == nil {
			return r
		}
		if r.gen == current {
			t.Fatalf("Register with the current kubelet: %v", r.err)
		}
		t.Logf("Register with an earlier start of the kubelet (%d; now %d): %v", r.gen, current, r.err)
	}
}

// tempDir is a short temporary directory: a unix socket's path has at most 107 bytes.
func tempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "dp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// newPlugin returns a plugin with n devices in dir, its other options changed by change
// (when not nil).
func newPlugin(t *testing.T, dir string, n int, change ...func(*Options)) *Plugin {
	t.Helper()
	opts := NewOptions()
	opts.Dir, opts.Devices = dir, n
	for _, f := range change {
		f(&opts)
	}
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// runPlugin runs p until the test ends, and then checks that Run returned no error.
func runPlugin(t *testing.T, p *Plugin) {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(testTimeout):
			t.Errorf("Run did not return within %v of its context's end", testTimeout)
		}
	})
}

// startRegistered starts a fake kubelet and a plugin with n devices (its other options
// changed by change), and waits for the plugin's first registration.
func startRegistered(t *testing.T, n int, change ...func(*Options)) (*Plugin, *fakeKubelet) {
	t.Helper()
	dir := tempDir(t)
	k := startFakeKubelet(t, dir)
	p := newPlugin(t, dir, n, change...)
	runPlugin(t, p)
	if r := k.nextRegistration(t); r.err != nil {
		t.Fatalf("first registration: %v", r.err)
	}
	return p, k
}

// dialPlugin connects to the plugin's socket as the kubelet does.
func dialPlugin(t *testing.T, p *Plugin) pluginapi.DevicePluginClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+p.SocketPath(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pluginapi.NewDevicePluginClient(conn)
}

// testContext is a context for one test's calls, bounded by testTimeout.
func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// healths is a device list as "GPU-0=Healthy GPU-1=Unhealthy ...", for comparing.
func healths(devices []*pluginapi.Device) []string {
	out := make([]string, 0, len(devices))
	for _, d := range devices {
		out = append(out, d.ID+"="+d.Health)
	}
	return out
}

// code is a gRPC error's status code.
func code(err error) string { return status.Code(err).String() }
