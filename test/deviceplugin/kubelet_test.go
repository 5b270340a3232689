package deviceplugin

// kubelet_test.go: registration with the kubelet, and again after its restarts.

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/testing/protocmp"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	clocktesting "k8s.io/utils/clock/testing"
)

func TestRegisters(t *testing.T) {
	dir := tempDir(t)
	k := startFakeKubelet(t, dir)
	p := newPlugin(t, dir, 2)
	runPlugin(t, p)

	r := k.nextRegistration(t)
	if r.err != nil {
		t.Fatalf("Register: %v", r.err)
	}
	want := registration{
		gen: 1,
		req: &pluginapi.RegisterRequest{
			Version:      "v1beta1",
			Endpoint:     "coroner-test-gpu.sock",
			ResourceName: "coroner.dev/test-gpu",
			Options:      &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true},
		},
		options: &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true},
	}
	if diff := cmp.Diff(want, r, cmp.AllowUnexported(registration{}), protocmp.Transform()); diff != "" {
		t.Errorf("registration (-want +got):\n%s", diff)
	}
}

// TestWaitsForTheKubelet: a plugin started before the kubelet registers once kubelet.sock
// appears.
func TestWaitsForTheKubelet(t *testing.T) {
	dir := tempDir(t)
	p := newPlugin(t, dir, 1)
	runPlugin(t, p)
	// The plugin runs before the kubelet starts. (This fake kubelet does not delete the
	// plugin's socket; TestRegistersAgain has one that does.)
	if _, err := dialPlugin(t, p).GetDevicePluginOptions(testContext(t), &pluginapi.Empty{}, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
	k := &fakeKubelet{dir: dir, registered: make(chan registration, 16)}
	k.start(t, false)
	t.Cleanup(k.stop)

	if r := k.nextRegistration(t); r.err != nil {
		t.Fatalf("Register: %v", r.err)
	}
}

// TestRetriesARefusedRegistration: the kubelet refuses Register three times; the plugin
// tries again after 1 s, 2 s, then RetryMax (3 s here), on a fake clock.
func TestRetriesARefusedRegistration(t *testing.T) {
	dir := tempDir(t)
	k := startFakeKubelet(t, dir)
	k.refuse = 3
	opts := NewOptions()
	opts.Dir, opts.Devices, opts.RetryMax = dir, 1, 3*time.Second
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	fc := clocktesting.NewFakeClock(time.Now())
	retries := make(chan time.Duration, 4)
	p.clock, p.onRetry = fc, func(d time.Duration) { retries <- d }
	runPlugin(t, p)

	for i, want := range []time.Duration{time.Second, 2 * time.Second, 3 * time.Second} {
		if r := k.nextRegistration(t); r.err == nil {
			t.Fatalf("Register %d: the fake kubelet should have refused it", i+1)
		}
		select {
		case got := <-retries:
			if got != want {
				t.Errorf("wait before retry %d: %v, want %v", i+1, got, want)
			}
			fc.Step(got)
		case <-time.After(testTimeout):
			t.Fatalf("no retry scheduled within %v after refusal %d", testTimeout, i+1)
		}
	}
	if r := k.nextRegistration(t); r.err != nil {
		t.Fatalf("Register after the refusals: %v", r.err)
	}
}

// TestRegistersAgain: after each way the directory can change under it, the plugin serves on
// its socket and registers with the kubelet listening on kubelet.sock.
func TestRegistersAgain(t *testing.T) {
	cases := []struct {
		name   string
		change func(t *testing.T, k *fakeKubelet, p *Plugin)
	}{
		{
			name:   "kubelet restarts: sockets deleted, new kubelet.sock",
			change: func(t *testing.T, k *fakeKubelet, _ *Plugin) { k.restart(t) },
		},
		{
			name: "kubelet.sock replaced, plugin socket kept",
			change: func(t *testing.T, k *fakeKubelet, _ *Plugin) {
				k.stop()
				k.start(t, false)
			},
		},
		{
			name: "plugin socket deleted, kubelet.sock kept",
			change: func(t *testing.T, _ *fakeKubelet, p *Plugin) {
				if err := os.Remove(p.SocketPath()); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			name: "kubelet restarts twice",
			change: func(t *testing.T, k *fakeKubelet, _ *Plugin) {
				k.restart(t)
				k.restart(t)
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, k := startRegistered(t, 2)
			tc.change(t, k, p)

			// The plugin may register more than once for one change (it may see its socket
			// deleted before kubelet.sock created); it must end registered with the kubelet
			// now listening, and served.
			k.registeredWithCurrent(t)
			stream, err := dialPlugin(t, p).ListAndWatch(testContext(t), &pluginapi.Empty{})
			if err != nil {
				t.Fatal(err)
			}
			resp, err := stream.Recv()
			if err != nil {
				t.Fatalf("ListAndWatch after the change: %v", err)
			}
			if got := len(resp.Devices); got != 2 {
				t.Errorf("ListAndWatch after the change: %d devices, want 2", got)
			}
			for more := true; more; {
				select {
				case r := <-k.registered:
					if r.err != nil {
						t.Errorf("another Register after the change: %v", r.err)
					}
				default:
					more = false
				}
			}
		})
	}
}

// TestReplacesAStaleSocket: a file left at the plugin's socket path by an earlier run does
// not stop it.
func TestReplacesAStaleSocket(t *testing.T) {
	dir := tempDir(t)
	k := startFakeKubelet(t, dir)
	if err := os.WriteFile(filepath.Join(dir, DefaultSocketName), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	p := newPlugin(t, dir, 1)
	runPlugin(t, p)
	if r := k.nextRegistration(t); r.err != nil {
		t.Fatalf("Register: %v", r.err)
	}
}
