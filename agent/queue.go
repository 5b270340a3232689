package agent

// The work queue's items: what a worker is to do (work.go), queued by the runtime's
// events (events.go), the pod cache's (pods.go) and the work itself.

import (
	"k8s.io/apimachinery/pkg/types"

	"github.com/coroner-dev/coroner/agent/ledger"
)

// itemKind is what a work item is about.
type itemKind int

const (
	// itemExit: classify a container's exit (id: container ID).
	itemExit itemKind = iota
	// itemOOM: classify an OOM kill in a container that may still run (id: container ID).
	itemOOM
	// itemPod: the pod-level decision, A3 and A4 (id: pod UID).
	itemPod
	// itemDevice: the device verdict on a container's exit (id: container ID).
	itemDevice
	// itemDevicePod: the device verdict of a Failed pod, from its status (id: pod UID).
	itemDevicePod
)

func (k itemKind) String() string {
	switch k {
	case itemExit:
		return "exit"
	case itemOOM:
		return "oom"
	case itemDevice:
		return "device"
	case itemDevicePod:
		return "device-pod"
	}
	return "pod"
}

// item is a unit of work of the agent's queue.
type item struct {
	kind itemKind
	id   string
}

// containerItem is the work item of the ledger's item of a container.
func containerItem(k ledger.Item, containerID string) item {
	if k == ledger.Exit {
		return item{kind: itemExit, id: containerID}
	}
	return item{kind: itemOOM, id: containerID}
}

// deviceItem is the work item of a container's device verdict.
func deviceItem(containerID string) item { return item{kind: itemDevice, id: containerID} }

// devicePodItem is the work item of a Failed pod's device verdict from its status.
func devicePodItem(uid types.UID) item { return item{kind: itemDevicePod, id: string(uid)} }

// podItem is the work item of a pod-level decision.
func podItem(uid types.UID) item { return item{kind: itemPod, id: string(uid)} }

// ledgerItem is the ledger's item of a container's work item (itemExit or itemOOM).
func (it item) ledgerItem() ledger.Item {
	if it.kind == itemExit {
		return ledger.Exit
	}
	return ledger.OOM
}
