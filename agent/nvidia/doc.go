// Package nvidia reads what NVIDIA's kernel driver says about its GPUs: the
// Xid reports it writes to the kernel log, and the per-GPU information files
// it serves under /proc/driver/nvidia/gpus. It is the groundwork for a device
// verdict (issue 37, point 2): a container that died because the GPU
// allocated to it failed.
//
// The chain from a kernel log record to a pod's device is:
//
//   - ParseXid reads an Xid report from a kernel log message:
//     "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen
//     off the bus." gives the GPU's PCI address, the Xid number, the process
//     (when the driver knows it) and the rest of the message.
//   - Classify says whether an Xid blames the device (BlameDevice) or the
//     application that used it (BlameApplication), the way NVIDIA's
//     k8s-device-plugin decides that a GPU is unhealthy; Catalog documents
//     the notable Xids with their sources.
//   - UUIDsByAddress maps each GPU's PCI address to its UUID ("GPU-..."),
//     the device ID NVIDIA's device plugin gives the kubelet, from the
//     driver's information files.
//
// Everything here is pure except UUIDsByAddress, which reads the directory
// it is given; nothing imports the agent.
package nvidia
