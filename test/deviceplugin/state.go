package deviceplugin

// state.go: the files the plugin keeps for the node's other programs, and the Xid line it
// writes to the kernel log.
//
// Under Options.StateDir (the lab: /var/lib/coroner-test-gpu on every node):
//
//	health/<ID>                          the device's health, "Healthy" or "Unhealthy";
//	                                     Allocate mounts it read-only at
//	                                     /run/coroner-test-gpu/<ID> in the container
//	nvidia/gpus/<PCI>/information        a fake NVIDIA driver information file, in the
//	                                     driver's format, whose "GPU UUID" is the device ID
//
// so that a test program can die when its GPU fails, as a CUDA program does:
//
//	while [ "$(cat /run/coroner-test-gpu/$CORONER_TEST_GPU)" = Healthy ]; do sleep 0.1; done; exit 1
//
// and an agent given nvidia/gpus as the driver's directory (the real one is
// /proc/driver/nvidia/gpus) maps an Xid's PCI address to the device ID as on a node with
// NVIDIA GPUs.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/coroner-dev/coroner/agent/nvidia"
)

// healthFileSize is the size of every health file. A health file is bind-mounted into
// containers, so it is rewritten in place (a new file renamed over it would not be the
// inode the container sees), and always whole at offset 0 with the same size, so that a
// reader never sees it empty or cut short: "Healthy" is padded with newlines, which a
// shell's command substitution drops.
const healthFileSize = 10

// healthContent is the content of a health file for a device of health h.
func healthContent(h string) []byte {
	b := []byte(h)
	for len(b) < healthFileSize {
		b = append(b, '\n')
	}
	return b
}

// HealthFile is the health file of device id under the state directory dir.
func HealthFile(dir, id string) string { return filepath.Join(dir, "health", id) }

// GPUsDir is the fake NVIDIA driver directory under the state directory dir, the
// equivalent of /proc/driver/nvidia/gpus.
func GPUsDir(dir string) string { return filepath.Join(dir, "nvidia", "gpus") }

// writeState writes every device's health file and information file. Run calls it before
// it serves the kubelet: a plugin that starts has healthy devices, whatever the files of an
// earlier run said.
func (p *Plugin) writeState() error {
	if p.opts.StateDir == "" {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, d := range p.devices {
		if err := p.writeHealth(d.ID, d.Health); err != nil {
			return err
		}
		dir := filepath.Join(GPUsDir(p.opts.StateDir), d.PCI)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "information"), []byte(information(d)), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// writeHealth writes the health file of device id in place. The caller holds p.mu.
func (p *Plugin) writeHealth(id, health string) error {
	if p.opts.StateDir == "" {
		return nil
	}
	path := HealthFile(p.opts.StateDir, id)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	_, err = f.WriteAt(healthContent(health), 0)
	if err == nil {
		err = f.Truncate(healthFileSize) // a file of another size, left by an older plugin
	}
	return errors.Join(err, f.Close())
}

// information is the NVIDIA driver's information file for d, with the driver's separators
// (nv_procfs_read_gpu_info in open-gpu-kernel-modules' kernel-open/nvidia/nv-procfs.c) and
// the device ID as the GPU UUID.
func information(d Device) string {
	lines := [][2]string{
		{"Model: \t\t ", "coroner test GPU"},
		{"IRQ:   \t\t ", "0"},
		{"GPU UUID: \t ", d.ID},
		{"Video BIOS: \t ", "??.??.??.??.??"},
		{"Bus Type: \t ", "PCIe"},
		{"DMA Size: \t ", "47 bits"},
		{"DMA Mask: \t ", "0x7fffffffffff"},
		{"Bus Location: \t ", d.PCI},
		{"Device Minor: \t ", strings.TrimPrefix(d.ID, "GPU-")},
		{"GPU Excluded:\t ", "No"},
	}
	var b strings.Builder
	for _, l := range lines {
		b.WriteString(l[0] + l[1] + "\n")
	}
	return b.String()
}

// MinXid and MaxXid bound the Xid numbers FailWithXid writes.
const (
	MinXid = 1
	MaxXid = 999
)

// XidLine is the Xid report the NVIDIA driver prints for an error code on the GPU at the
// PCI address pci (DDDD:BB:DD.F): "NVRM: Xid (PCI:DDDD:BB:DD): CODE, pid='<unknown>',
// name=<unknown>, DESCRIPTION", the form of krcReportXid in open-gpu-kernel-modules when no
// process is attributed, with the driver's own words for Xid 79 and the description of
// agent/nvidia's catalog (or "injected by coroner-test-gpu") for the others.
func XidLine(pci string, code int) (string, error) {
	if code < MinXid || code > MaxXid {
		return "", fmt.Errorf("xid %d: want a number from %d to %d", code, MinXid, MaxXid)
	}
	a, err := nvidia.ParseAddress(pci)
	if err != nil {
		return "", err
	}
	msg := "injected by coroner-test-gpu"
	if code == 79 {
		msg = "GPU has fallen off the bus."
	} else if e, ok := nvidia.Lookup(code); ok {
		msg = e.Description
	}
	return fmt.Sprintf("NVRM: Xid (PCI:%04x:%02x:%02x): %d, pid='<unknown>', name=<unknown>, %s", a.Domain, a.Bus, a.Device, code, msg), nil
}

// writeKmsg writes line to the kernel log device at path, at level 3 (error). The kernel
// gives a line written there the user facility, not the kernel's (a reader can tell it from
// the driver's own). Each write opens the device anew: the kernel rate-limits writes per
// open file (printk_devkmsg=ratelimit, 10 lines a 5 s burst) and drops the rest silently.
func writeKmsg(path, line string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("kernel log: %w", err)
	}
	_, err = f.Write([]byte("<3>" + line + "\n"))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("kernel log %s: %w", path, err)
	}
	return nil
}

// FailWithXid writes the Xid report of code for device id to the kernel log (Options.Kmsg),
// then marks the device unhealthy (SetHealth), in the order of a real GPU failure: the
// driver's report, the program's death, the device plugin's health. It returns the device
// and the line written. Nothing changes when the line cannot be written.
func (p *Plugin) FailWithXid(id string, code int) (Device, string, error) {
	d, line, err := p.WriteXid(id, code)
	if err != nil {
		return d, "", err
	}
	d, err = p.SetHealth(id, false)
	return d, line, err
}

// WriteXid writes an Xid line of code for the device's PCI address to its node's kernel
// log and leaves its health as it is: what a driver logs when NVIDIA's plugin does not
// (yet) mark the GPU Unhealthy (an application Xid, which it skips; a hardware one it has
// not read yet). It returns the device and the line.
func (p *Plugin) WriteXid(id string, code int) (Device, string, error) {
	devices, err := p.lookup([]string{id})
	if err != nil {
		return Device{}, "", err
	}
	line, err := XidLine(devices[0].PCI, code)
	if err != nil {
		return devices[0], "", err
	}
	if err := writeKmsg(p.opts.Kmsg, line); err != nil {
		return devices[0], "", err
	}
	return devices[0], line, nil
}

// healthOf is pluginapi's word for healthy.
func healthOf(healthy bool) string {
	if healthy {
		return pluginapi.Healthy
	}
	return pluginapi.Unhealthy
}
