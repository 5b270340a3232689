package cri

import (
	"context"
	"time"
)

// Source yields container lifecycle events with pod identity. Watcher implements it.
type Source interface {
	// Events starts watching and returns the events; the channel is closed once ctx is
	// done and the watcher has stopped. Call it once.
	Events(ctx context.Context) <-chan ContainerEvent
	// Connected reports whether the runtime answered the last call.
	Connected() bool
}

// Kind is what happened to a container.
type Kind string

const (
	// Started: the container was seen running for the first time.
	Started Kind = "Started"
	// Exited: the container's main process ended; ExitCode, Reason and FinishedAt are set.
	Exited Kind = "Exited"
	// OOM: the container's memory cgroup ran out of memory and the kernel OOM-killed a
	// process in it (containerd's /tasks/oom). The container may keep running.
	OOM Kind = "OOM"
)

// Where an event was observed (ContainerEvent.Source).
const (
	SourceRelist     = "relist"
	SourceCRIEvents  = "cri-events"
	SourceContainerd = "containerd"
)

// The kubelet's CRI labels that identify a container's pod.
const (
	LabelPodName       = "io.kubernetes.pod.name"
	LabelPodNamespace  = "io.kubernetes.pod.namespace"
	LabelPodUID        = "io.kubernetes.pod.uid"
	LabelContainerName = "io.kubernetes.container.name"
)

// ContainerEvent is one lifecycle change of a container the kubelet created.
type ContainerEvent struct {
	Kind Kind

	PodNamespace, PodName, PodUID string
	ContainerName                 string
	// ContainerID is the runtime's id (without a containerd:// prefix); SandboxID the
	// pod sandbox's.
	ContainerID, SandboxID string
	// Attempt is the CRI attempt number, the kubelet's restart count of the container.
	Attempt uint32

	// ExitCode, Reason (e.g. "OOMKilled", "Error", "Completed") and Message are set on
	// Exited.
	ExitCode int32
	Reason   string
	Message  string
	// StartedAt and FinishedAt are the runtime's; zero when unknown.
	StartedAt, FinishedAt time.Time
	// OOMAt is when containerd published the OOM event (Kind OOM).
	OOMAt time.Time

	// CgroupPath is the container's cgroup as the runtime reports it (OCI
	// linux.cgroupsPath from the CRI verbose status): a path relative to each cgroup
	// hierarchy's root with the cgroupfs driver, "slice:prefix:name" with the systemd
	// driver (agent/cgroup.FromSystemd turns that into a path). Empty when unknown.
	CgroupPath string
	// MemoryLimit is the container's memory limit in bytes; 0 when none or unknown.
	MemoryLimit int64
	// PID is the container's init process as the runtime reports it (the "pid" of the
	// CRI verbose status), a number in the runtime's PID namespace: the kernel's own
	// numbering on an ordinary node, not on a nested one (kind). 0 when unknown (stream
	// events carry no verbose status; an exited container has none).
	PID int

	// Source says where the event was observed (SourceRelist, SourceCRIEvents,
	// SourceContainerd); ObservedAt when, by the watcher's clock.
	Source     string
	ObservedAt time.Time
}
