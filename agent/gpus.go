package agent

// NVIDIA GPUs: the driver's Xid reports, read with the kernel's OOM kills (kernel.go), are
// about a GPU by its PCI address; NVIDIA's device plugin names it by its UUID. The map
// between them comes from the driver's /proc/driver/nvidia/gpus (nvidia.UUIDsByAddress),
// read at the start and again when an Xid names an address it does not hold (a GPU the
// driver brought up later), at most once per gpuRereadMin.

import (
	"errors"
	"io/fs"
	"os"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/coroner-dev/coroner/agent/kmsg"
	"github.com/coroner-dev/coroner/agent/ledger"
	"github.com/coroner-dev/coroner/agent/nvidia"
)

// gpuRereadMin bounds how often an unknown address rereads the driver's GPU list.
const gpuRereadMin = 10 * time.Second

// gpuMap maps GPUs' PCI addresses to their UUIDs.
type gpuMap struct {
	dir string

	mu     sync.Mutex
	uuids  map[nvidia.Address]string
	readAt time.Time
	read   bool
}

// load reads the driver's GPU list; a missing directory (no NVIDIA driver) is said once,
// at info level, as is a list that could not all be read.
func (g *gpuMap) load(logger klog.Logger, now time.Time) {
	if g.dir == "" {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.reloadLocked(logger, now, true)
}

func (g *gpuMap) reloadLocked(logger klog.Logger, now time.Time, first bool) {
	g.readAt, g.read = now, true
	if _, err := os.Stat(g.dir); errors.Is(err, fs.ErrNotExist) {
		if first {
			logger.Info("No NVIDIA driver on this node (its GPU list is not there): Xid reports are not mapped to GPUs", "dir", g.dir)
		}
		g.uuids = map[nvidia.Address]string{}
		return
	}
	uuids, err := nvidia.UUIDsByAddress(g.dir)
	if err != nil {
		logger.Info("Some of the NVIDIA driver's GPU information could not be read; those GPUs' Xid reports are not mapped", "dir", g.dir, "err", err.Error())
	}
	g.uuids = uuids
	if first || len(uuids) > 0 {
		logger.V(1).Info("Read the NVIDIA driver's GPUs", "dir", g.dir, "gpus", len(uuids))
	}
}

// uuid returns the UUID of the GPU at addr, rereading the driver's list when addr is not
// in it (at most once per gpuRereadMin).
func (g *gpuMap) uuid(logger klog.Logger, addr nvidia.Address, now time.Time) (string, bool) {
	if g.dir == "" {
		return "", false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if u, ok := g.uuids[addr]; ok {
		return u, true
	}
	if !g.read || now.Sub(g.readAt) >= gpuRereadMin {
		g.reloadLocked(logger, now, !g.read)
	}
	u, ok := g.uuids[addr]
	return u, ok
}

// addXid takes an Xid report: a hardware one (nvidia.Classify) becomes a driver fault of
// the GPU's UUID in the ledger, and the containers holding that GPU whose device verdict
// is pending are judged again now; an application one blames no device and is only
// logged.
func (a *Agent) addXid(x kmsg.XidReport) {
	now := a.clock.Now()
	logger := a.logger.WithValues("xid", x.Xid.Code, "pci", x.Xid.Address.String())
	if !x.Xid.DeviceFault() {
		logger.V(1).Info("Application Xid: the program's error, not the GPU's; no device is blamed", "pid", x.Xid.PID, "message", x.Xid.Message)
		return
	}
	uuid, ok := a.gpus.uuid(logger, x.Xid.Address, now)
	if !ok {
		logger.Info("Hardware Xid for a GPU the NVIDIA driver does not list; no device can be blamed", "message", x.Xid.Message)
		return
	}
	at := x.Time
	if at.IsZero() {
		at = now
	}
	holders := a.ledger.LearnFault(ledger.DriverFault{ID: uuid, Code: x.Xid.Code, At: at, Message: x.Xid.Message}, now)
	logger.Info("Hardware Xid", "gpu", uuid, "at", at, "message", x.Xid.Message, "holders", len(holders))
	for _, h := range holders {
		a.requeueDevices(h.PodUID, h.Container)
	}
}
