// Package deviceplugin is a real kubelet device plugin for coroner's tests: it serves the
// extended resource coroner.dev/test-gpu with N devices (GPU-0, GPU-1, ...) over the device
// plugin API v1beta1 and lets a test or a separate process mark a device unhealthy or healthy
// again. Nothing below the kubelet is faked: the kubelet learns the devices' health from this
// plugin's ListAndWatch stream exactly as from a vendor's plugin, and reports it itself in the
// node's allocatable and, with ResourceHealthStatus (KEP-4680, beta and on in 1.36), in a pod's
// status.containerStatuses[].allocatedResourcesStatus.
//
// The parts, one file each:
//   - plugin.go: the Plugin, its devices and their health (SetHealth, Devices).
//   - service.go: the DevicePlugin gRPC service the kubelet calls (ListAndWatch, Allocate, ...).
//   - kubelet.go: Run, which serves the plugin's socket in the device-plugins directory,
//     registers with the kubelet's kubelet.sock there, and does both again when the kubelet
//     restarts (it deletes the plugins' sockets and creates a new kubelet.sock).
//   - inotify.go: the watch on that directory.
//   - control.go: the control API (HTTP over a unix socket) for another process, and its client.
//   - state.go: the files the node's other programs read (each device's health, which
//     Allocate mounts into the container; fake NVIDIA driver information files) and the Xid
//     line FailWithXid writes to the kernel log.
//
// Allocate gives each container the env vars CORONER_TEST_GPU (the allocated device IDs,
// comma-separated) and CORONER_TEST_GPU_PCI (their fake PCI addresses in the same order, the
// form an NVIDIA Xid kernel line names a GPU by), so a test can tell which device a pod holds.
// Device IDs are GPU-0, GPU-1, ...: they start with "GPU-" as an NVIDIA GPU's UUID (the ID
// NVIDIA's plugin gives) does. The PCI addresses start at Options.PCIBase: plugins whose
// nodes share a kernel log need bases of their own.
//
// The kubelet's device manager listens at the fixed path
// /var/lib/kubelet/device-plugins/kubelet.sock (pluginapi.KubeletSocket; no flag or config
// field moves it in 1.36) and deletes every socket in that directory when it starts. Several
// kubelets on one machine (the lab's process nodes) therefore each need their own view of the
// directory: a mount namespace per node with its own directory bind-mounted there, holding
// that node's containerd, kubelet and plugin alike (the kubelet's volume mounts must be seen
// by its containerd).
//
// The command cmd/coroner-test-gpu runs a Plugin with its control API. This package is test
// code: no product binary imports it (coroner-lab may, as it links the lab's code).
package deviceplugin
