// Package nvidia reads what NVIDIA's kernel driver says about its GPUs: the
// Xid reports it writes to the kernel log, and the per-GPU information files
// it serves under /proc/driver/nvidia/gpus. It is the groundwork for a device
// verdict: a container that died because the GPU allocated to it failed.
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
// Limits the device verdict will have to mind: the UUID is the plugin's
// device ID only under its default --device-id-strategy=uuid (index gives
// "0", "1", ...); on a MIG-partitioned GPU the plugin hands out MIG devices
// ("MIG-..."), which an Xid names by the parent GPU's address and, when the
// driver attributes it, the GPU and compute instance numbers (Xid.GPUInstance,
// Xid.ComputeInstance), not by UUID; and an Xid report carries no PCI
// function, so a GPU the driver serves at a function other than 0 (an SR-IOV
// virtual function) is not found by it.
//
// Everything here is pure except UUIDsByAddress, which reads the directory
// it is given; nothing imports the agent.
package nvidia
