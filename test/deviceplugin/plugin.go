package deviceplugin

// plugin.go: the Plugin, its options, its devices and their health.

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/utils/clock"
)

const (
	// DefaultResourceName is the extended resource the plugin serves.
	DefaultResourceName = "coroner.dev/test-gpu"
	// DefaultSocketName is the plugin's socket file in the device-plugins directory.
	DefaultSocketName = "coroner-test-gpu.sock"
	// KubeletSocketName is the kubelet's registration socket in that directory.
	KubeletSocketName = "kubelet.sock"

	// EnvDevices is the env var Allocate sets: the allocated device IDs, comma-separated.
	EnvDevices = "CORONER_TEST_GPU"
	// EnvPCI is the env var Allocate sets: the allocated devices' PCI addresses, in the
	// order of EnvDevices, comma-separated.
	EnvPCI = "CORONER_TEST_GPU_PCI"

	// MaxDevices bounds Options.Devices: each device gets a PCI bus number of its own.
	MaxDevices = 128

	// ContainerHealthDir is where Allocate mounts each allocated device's health file in
	// the container, read-only: ContainerHealthDir/<ID> (with a StateDir).
	ContainerHealthDir = "/run/coroner-test-gpu"
)

// Options configure a Plugin. NewOptions gives the defaults.
type Options struct {
	// Dir is the kubelet's device-plugins directory: the plugin's socket and kubelet.sock
	// live there.
	Dir string
	// ResourceName is the extended resource served, DOMAIN/NAME.
	ResourceName string
	// SocketName is the plugin's socket file in Dir, the endpoint it registers.
	SocketName string
	// Devices is how many devices the plugin has: GPU-0 ... GPU-(Devices-1).
	Devices int
	// RegisterTimeout bounds one Register call to the kubelet (which dials the plugin back
	// before it answers).
	RegisterTimeout time.Duration
	// RetryMax is the longest wait between two attempts to register after a failure; the
	// first wait is a second and each next one doubles.
	RetryMax time.Duration
	// PCIBase is the PCI address of the first device: device i is on bus PCIBase.Bus+i of
	// domain PCIBase.Domain. Plugins on nodes that share a kernel log (the lab's process
	// nodes and kind nodes share this machine's) need bases of their own, so that an Xid
	// line names one device of one node.
	PCIBase PCIBase
	// StateDir, when set, is where the plugin keeps files a node's other programs read
	// (state.go): each device's health, which Allocate mounts into the container, and fake
	// NVIDIA driver information files that map a PCI address to a device ID.
	StateDir string
	// Kmsg is the kernel log device an Xid line is written to (FailWithXid).
	Kmsg string
}

// PCIBase is the domain and first bus of a plugin's devices.
type PCIBase struct {
	Domain uint16
	Bus    uint8
}

// DefaultPCIBase puts gpu 0 at 0000:10:00.0.
var DefaultPCIBase = PCIBase{Domain: 0, Bus: 0x10}

// ParsePCIBase reads "DDDD:BB" (hex), a PCI domain and bus.
func ParsePCIBase(s string) (PCIBase, error) {
	d, b, ok := strings.Cut(s, ":")
	if !ok || len(d) != 4 || len(b) != 2 {
		return PCIBase{}, fmt.Errorf("PCI base %q: want DDDD:BB, a domain and bus in hex (0001:10)", s)
	}
	dom, err1 := strconv.ParseUint(d, 16, 16)
	bus, err2 := strconv.ParseUint(b, 16, 8)
	if err1 != nil || err2 != nil {
		return PCIBase{}, fmt.Errorf("PCI base %q: want DDDD:BB, a domain and bus in hex (0001:10)", s)
	}
	return PCIBase{Domain: uint16(dom), Bus: uint8(bus)}, nil
}

// String is the "DDDD:BB" form ParsePCIBase reads.
func (b PCIBase) String() string { return fmt.Sprintf("%04x:%02x", b.Domain, b.Bus) }

// Address is the PCI address of the i-th device, DDDD:BB:00.0.
func (b PCIBase) Address(i int) string {
	return fmt.Sprintf("%04x:%02x:00.0", b.Domain, int(b.Bus)+i)
}

// NewOptions returns the defaults: two devices in the kubelet's usual directory.
func NewOptions() Options {
	return Options{
		Dir:             pluginapi.DevicePluginPath,
		ResourceName:    DefaultResourceName,
		SocketName:      DefaultSocketName,
		Devices:         2,
		RegisterTimeout: 10 * time.Second,
		RetryMax:        30 * time.Second,
		PCIBase:         DefaultPCIBase,
		Kmsg:            "/dev/kmsg",
	}
}

// Validate says what is wrong with o, if anything.
func (o Options) Validate() error {
	switch {
	case o.Dir == "" || !filepath.IsAbs(o.Dir):
		return fmt.Errorf("dir %q: must be an absolute path", o.Dir)
	case strings.Count(o.ResourceName, "/") != 1 || strings.HasPrefix(o.ResourceName, "kubernetes.io/"):
		return fmt.Errorf("resource name %q: must be an extended resource, DOMAIN/NAME", o.ResourceName)
	case o.SocketName == "" || strings.ContainsRune(o.SocketName, '/') || o.SocketName == KubeletSocketName || strings.HasPrefix(o.SocketName, "."):
		return fmt.Errorf("socket name %q: must be a file name of its own in the directory", o.SocketName)
	case o.Devices < 1 || o.Devices > MaxDevices:
		return fmt.Errorf("devices %d: must be between 1 and %d", o.Devices, MaxDevices)
	case o.RegisterTimeout <= 0 || o.RetryMax <= 0:
		return fmt.Errorf("register timeout and retry max must be positive")
	case int(o.PCIBase.Bus)+o.Devices-1 > 0xff:
		return fmt.Errorf("PCI base %s with %d devices: the last bus would be past ff", o.PCIBase, o.Devices)
	case o.StateDir != "" && !filepath.IsAbs(o.StateDir):
		return fmt.Errorf("state dir %q: must be an absolute path", o.StateDir)
	case o.Kmsg == "":
		return fmt.Errorf("no kernel log device")
	}
	return nil
}

// Device is one device as the plugin reports it.
type Device struct {
	// ID is the device's ID in the device plugin API, GPU-N.
	ID string `json:"id"`
	// Health is pluginapi.Healthy or pluginapi.Unhealthy.
	Health string `json:"health"`
	// PCI is the device's fake PCI address, DDDD:BB:DD.F.
	PCI string `json:"pci"`
}

// DeviceID is the ID of the i-th device, GPU-i. It starts with "GPU-" as the UUID of an
// NVIDIA GPU does, which NVIDIA's device plugin uses as the device ID: the fake driver
// information files (state.go) give it as the GPU UUID, and an agent that maps an Xid's
// PCI address to a device ID through them (agent/nvidia.UUIDsByAddress, which refuses a
// UUID without that prefix) finds it as on a real node.
func DeviceID(i int) string { return fmt.Sprintf("GPU-%d", i) }

// PCIAddress is the fake PCI address of the i-th device with DefaultPCIBase: bus 0x10+i
// on domain 0, so 0000:10:00.0 for GPU-0. An NVIDIA Xid kernel line names it
// "PCI:0000:10:00".
func PCIAddress(i int) string { return DefaultPCIBase.Address(i) }

// Plugin is a device plugin with a fixed set of devices whose health SetHealth changes.
// Run serves it to the kubelet.
type Plugin struct {
	opts  Options
	clock clock.Clock // times the retries of a failed registration
	// onRetry, when set (by tests), is called with each wait before a retry, once its
	// timer is made.
	onRetry func(time.Duration)

	mu      sync.Mutex
	devices []Device // in ID order, fixed at New but for Health
	// changed is closed, and replaced, whenever a device's health changes: each
	// ListAndWatch stream waits on it to send the new list.
	changed chan struct{}
}

// New returns a plugin whose devices are all healthy.
func New(opts Options) (*Plugin, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	p := &Plugin{opts: opts, clock: clock.RealClock{}, changed: make(chan struct{})}
	for i := range opts.Devices {
		p.devices = append(p.devices, Device{ID: DeviceID(i), Health: pluginapi.Healthy, PCI: opts.PCIBase.Address(i)})
	}
	return p, nil
}

// SocketPath is the plugin's socket: the kubelet connects to it.
func (p *Plugin) SocketPath() string { return filepath.Join(p.opts.Dir, p.opts.SocketName) }

// KubeletSocketPath is the kubelet's registration socket the plugin registers with.
func (p *Plugin) KubeletSocketPath() string { return filepath.Join(p.opts.Dir, KubeletSocketName) }

// Devices returns the devices and their current health, in ID order.
func (p *Plugin) Devices() []Device {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.devices)
}

// SetHealth marks the device healthy or unhealthy and returns it. With a StateDir the
// device's health file changes first (a program that watches it dies before the kubelet
// hears of it, as a CUDA program dies before a device plugin reports its GPU); then the
// change is sent to every ListAndWatch stream at once. Setting the health a device already
// has sends nothing.
func (p *Plugin) SetHealth(id string, healthy bool) (Device, error) {
	health := healthOf(healthy)
	p.mu.Lock()
	defer p.mu.Unlock()
	i := slices.IndexFunc(p.devices, func(d Device) bool { return d.ID == id })
	if i < 0 {
		return Device{}, &UnknownDeviceError{ID: id}
	}
	if p.devices[i].Health != health {
		if err := p.writeHealth(p.devices[i].ID, health); err != nil {
			return p.devices[i], err
		}
		p.devices[i].Health = health
		close(p.changed)
		p.changed = make(chan struct{})
	}
	return p.devices[i], nil
}

// UnknownDeviceError is SetHealth's or Allocate's error for a device the plugin does not have.
type UnknownDeviceError struct{ ID string }

func (e *UnknownDeviceError) Error() string { return fmt.Sprintf("no device %q", e.ID) }

// watchDevices returns the devices in the API's form and a channel closed at their next
// change.
func (p *Plugin) watchDevices() ([]*pluginapi.Device, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*pluginapi.Device, 0, len(p.devices))
	for _, d := range p.devices {
		out = append(out, &pluginapi.Device{ID: d.ID, Health: d.Health})
	}
	return out, p.changed
}

// lookup returns the devices of ids, or an error naming the first unknown one.
func (p *Plugin) lookup(ids []string) ([]Device, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]Device, 0, len(ids))
	for _, id := range ids {
		i := slices.IndexFunc(p.devices, func(d Device) bool { return d.ID == id })
		if i < 0 {
			return nil, &UnknownDeviceError{ID: id}
		}
		out = append(out, p.devices[i])
	}
	return out, nil
}
