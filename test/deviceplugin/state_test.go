package deviceplugin

// state_test.go: the health files and their mounts, the fake NVIDIA driver files, and the
// Xid lines, read back with the agent's own parsers (agent/nvidia).

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/coroner-dev/coroner/agent/nvidia"
)

// withState gives the plugin a state directory and a kernel log (a plain file), and the
// PCI base 0003:20.
func withState(state, kmsg string) func(*Options) {
	return func(o *Options) {
		o.StateDir, o.Kmsg, o.PCIBase = state, kmsg, PCIBase{Domain: 3, Bus: 0x20}
	}
}

// shellWord is what a shell's "$(cat FILE)" makes of a file: its content without the
// trailing newlines.
func shellWord(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != healthFileSize {
		t.Errorf("%s has %d bytes, want always %d", path, len(b), healthFileSize)
	}
	return strings.TrimRight(string(b), "\n")
}

func TestStateFiles(t *testing.T) {
	state := tempDir(t)
	p, _ := startRegistered(t, 3, withState(state, filepath.Join(state, "kmsg")))

	// The agent's reader of the driver's directory maps each address to the device ID.
	uuids, err := nvidia.UUIDsByAddress(GPUsDir(state))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for a, id := range uuids {
		got[a.String()] = id
	}
	want := map[string]string{"0003:20:00.0": "GPU-0", "0003:21:00.0": "GPU-1", "0003:22:00.0": "GPU-2"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("UUIDsByAddress (-want +got):\n%s", diff)
	}
	b, err := os.ReadFile(filepath.Join(GPUsDir(state), "0003:21:00.0", "information"))
	if err != nil {
		t.Fatal(err)
	}
	info, err := nvidia.ParseInformation(string(b))
	if err != nil {
		t.Fatal(err)
	}
	if info.Model != "coroner test GPU" || info.Minor != 1 || info.Excluded {
		t.Errorf("information of GPU-1: %+v", info)
	}

	for _, d := range p.Devices() {
		if w := shellWord(t, HealthFile(state, d.ID)); w != "Healthy" {
			t.Errorf("health file of %s says %q at the start, want Healthy", d.ID, w)
		}
	}
}

func TestHealthFileBeforeListAndWatch(t *testing.T) {
	state := tempDir(t)
	// A file left by an earlier run, of another size, is rewritten whole.
	if err := os.MkdirAll(filepath.Join(state, "health"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(HealthFile(state, "GPU-1"), []byte("Unhealthy, says an old plugin\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p, _ := startRegistered(t, 2, withState(state, filepath.Join(state, "kmsg")))
	if w := shellWord(t, HealthFile(state, "GPU-1")); w != "Healthy" {
		t.Errorf("GPU-1's health file at the start: %q, want Healthy", w)
	}
	stream, err := dialPlugin(t, p).ListAndWatch(testContext(t), &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	file := HealthFile(state, "GPU-1")
	before, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		healthy bool
		want    string
	}{{false, "Unhealthy"}, {true, "Healthy"}, {false, "Unhealthy"}} {
		if _, err := p.SetHealth("GPU-1", step.healthy); err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		// When the kubelet hears of the change, the file says it already.
		if w := shellWord(t, file); w != step.want {
			t.Errorf("health file when the kubelet got %v: %q, want %q", healths(resp.Devices), w, step.want)
		}
		if w := shellWord(t, HealthFile(state, "GPU-0")); w != "Healthy" {
			t.Errorf("GPU-0's health file: %q", w)
		}
	}
	after, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	// The same file, not one renamed over it: a container's bind mount holds the inode.
	if !os.SameFile(before, after) {
		t.Errorf("the health file was replaced; it must be rewritten in place")
	}
}

func TestAllocateMountsHealthFiles(t *testing.T) {
	state := tempDir(t)
	p, _ := startRegistered(t, 3, withState(state, filepath.Join(state, "kmsg")))
	resp, err := dialPlugin(t, p).Allocate(testContext(t), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{"GPU-2", "GPU-0"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	want := &pluginapi.ContainerAllocateResponse{
		Envs: map[string]string{"CORONER_TEST_GPU": "GPU-2,GPU-0", "CORONER_TEST_GPU_PCI": "0003:22:00.0,0003:20:00.0"},
		Mounts: []*pluginapi.Mount{
			{ContainerPath: "/run/coroner-test-gpu/GPU-2", HostPath: filepath.Join(state, "health", "GPU-2"), ReadOnly: true},
			{ContainerPath: "/run/coroner-test-gpu/GPU-0", HostPath: filepath.Join(state, "health", "GPU-0"), ReadOnly: true},
		},
	}
	if diff := cmp.Diff(want, resp.ContainerResponses[0], protocmp.Transform()); diff != "" {
		t.Errorf("Allocate (-want +got):\n%s", diff)
	}
}

func TestXidLineParses(t *testing.T) {
	for _, tc := range []struct {
		pci     string
		code    int
		message string
	}{
		{"0003:21:00.0", 79, "GPU has fallen off the bus."},
		{"0000:10:00.0", 48, "double-bit (uncorrectable) ECC error in GPU memory"},
		{"0102:ff:00.0", 13, "graphics engine exception (an illegal instruction or address in a kernel)"},
		{"0001:10:00.0", 999, "injected by coroner-test-gpu"},
	} {
		line, err := XidLine(tc.pci, tc.code)
		if err != nil {
			t.Fatal(err)
		}
		x, ok, err := nvidia.ParseXid(line)
		if err != nil || !ok {
			t.Fatalf("ParseXid(%q) = %v, %v", line, ok, err)
		}
		want := nvidia.Xid{Address: mustAddress(t, tc.pci), GPUInstance: -1, ComputeInstance: -1, Code: tc.code, Message: tc.message}
		if diff := cmp.Diff(want, x); diff != "" {
			t.Errorf("ParseXid(%q) (-want +got):\n%s", line, diff)
		}
	}
	for _, code := range []int{0, -1, 1000} {
		if _, err := XidLine("0000:10:00.0", code); err == nil {
			t.Errorf("XidLine of Xid %d: no error", code)
		}
	}
}

func mustAddress(t *testing.T, s string) nvidia.Address {
	t.Helper()
	a, err := nvidia.ParseAddress(s)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestFailWithXid(t *testing.T) {
	state := tempDir(t)
	kmsg := filepath.Join(state, "kmsg")
	if err := os.WriteFile(kmsg, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	p, _ := startRegistered(t, 2, withState(state, kmsg))
	d, line, err := p.FailWithXid("GPU-1", 79)
	if err != nil {
		t.Fatal(err)
	}
	if d.Health != "Unhealthy" || shellWord(t, HealthFile(state, "GPU-1")) != "Unhealthy" {
		t.Errorf("after FailWithXid: %+v, health file %q", d, shellWord(t, HealthFile(state, "GPU-1")))
	}
	b, err := os.ReadFile(kmsg)
	if err != nil {
		t.Fatal(err)
	}
	// One write of "<level>message\n", as /dev/kmsg takes it; the kernel keeps the message.
	want := "<3>NVRM: Xid (PCI:0003:21:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
	if string(b) != want || "<3>"+line+"\n" != want {
		t.Errorf("kernel log got %q (line %q), want %q", b, line, want)
	}
	x, ok, err := nvidia.ParseXid(strings.TrimPrefix(strings.TrimSpace(string(b)), "<3>"))
	if err != nil || !ok || x.Address.String() != d.PCI || x.Code != 79 || !x.DeviceFault() {
		t.Errorf("ParseXid of the written line: %+v %v %v", x, ok, err)
	}

	var unknown *UnknownDeviceError
	if _, _, err := p.FailWithXid("GPU-7", 79); !errors.As(err, &unknown) {
		t.Errorf("FailWithXid of an unknown device: %v", err)
	}
	if _, _, err := p.FailWithXid("GPU-0", 0); err == nil {
		t.Errorf("FailWithXid of Xid 0: no error")
	}
	if got := p.Devices()[0].Health; got != "Healthy" {
		t.Errorf("GPU-0 after a refused Xid: %s", got)
	}
}

func TestFailWithXidWithoutKernelLog(t *testing.T) {
	state := tempDir(t)
	p, _ := startRegistered(t, 1, withState(state, filepath.Join(state, "no", "kmsg")))
	if _, _, err := p.FailWithXid("GPU-0", 79); err == nil || !strings.Contains(err.Error(), "kernel log") {
		t.Fatalf("FailWithXid without a kernel log: %v, want an error about it", err)
	}
	if got := p.Devices()[0].Health; got != "Healthy" {
		t.Errorf("the device after a failed Xid write: %s, want it unchanged", got)
	}
	if w := shellWord(t, HealthFile(state, "GPU-0")); w != "Healthy" {
		t.Errorf("health file after a failed Xid write: %q", w)
	}
}

func TestParsePCIBase(t *testing.T) {
	for in, want := range map[string]PCIBase{"0000:10": DefaultPCIBase, "0003:20": {3, 0x20}, "FFFF:ff": {0xffff, 0xff}} {
		got, err := ParsePCIBase(in)
		if err != nil || got != want {
			t.Errorf("ParsePCIBase(%q) = %v, %v; want %v", in, got, err, want)
		}
		if !strings.EqualFold(got.String(), in) {
			t.Errorf("%v.String() = %q, want %q", got, got.String(), in)
		}
	}
	for _, in := range []string{"", "10", "0000:1", "00000:10", "0000:100", "xyzw:10", "0000:10:00"} {
		if _, err := ParsePCIBase(in); err == nil {
			t.Errorf("ParsePCIBase(%q): no error", in)
		}
	}
}
