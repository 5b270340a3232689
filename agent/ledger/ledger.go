// Package ledger is the node agent's record of its node's containers: what the runtime's
// events said of each container, what the agent read of its cgroups at them, where each
// of its work items (an exit, OOM events) stands, the runtime's states of the pods'
// containers, and the evidence that comes on streams of its own (the kernel's OOM kills,
// evidence.go), joined to the containers it names. Everything it holds expires
// (Expire): containers done for ContainerTTL, evidence older than its own TTL.
//
// It is pure bookkeeping: it reads no file, no socket and no clock, and calls nothing
// outside itself. Its inputs are plain values (cri.ContainerEvent, the cgroup Reading the
// caller took, kmsg.OOMKill, the time now); its outputs are copies, among them the
// classify.OOMFacts a classification needs (Snapshot). One lock guards all of it, taken
// once by each method, never held while anything else runs.
//
// The agent drives it in this order:
//
//   - an event: Observe (the identity, and the cgroups to read), then, for Started, OOM
//     and Exited (Reads), Record with the cgroups read, which says what is to be
//     classified (an Exit or an OOM item);
//   - the kernel's kills: LearnKill; drivers' device faults: LearnFault;
//   - a device verdict on an exit (devices.go): StartDevice, DevicePending, DeviceFacts,
//     FinishDevice;
//   - a work item: Pending, AwaitPod / PodConfirmed / Drop while its pod is looked for,
//     Snapshot, then KernelWait (wait once for late evidence) or FinishExit / FinishOOM,
//     which claim the item;
//   - a pod: Observed (the runtime's word on its containers), ObserveDevices (its
//     devices' health), LearnAllocation (the kubelet's PodResources), Forget (deleted);
//   - once a minute: Expire.
package ledger

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/coroner-dev/coroner/agent/cgroup"
	"github.com/coroner-dev/coroner/agent/classify"
	"github.com/coroner-dev/coroner/cri"
)

// Item is what a work item of a container is about.
type Item uint8

const (
	// Exit: classify the container's exit.
	Exit Item = iota
	// OOM: classify OOM kills in the container, which may still run.
	OOM
	numItems
)

func (k Item) String() string {
	if k == Exit {
		return "exit"
	}
	return "oom"
}

// Ledger is the record of a node's containers. The zero value is not usable: use New.
type Ledger struct {
	mu sync.Mutex
	// containers are the containers by ID (one CRI container: a restart is a new one).
	containers map[string]*container
	// observed are the containers' states by pod UID (the runtime's: a static pod's config
	// hash) and container name, as the runtime reports them (Observed).
	observed map[types.UID]map[string]observedState
	// evidence is what other sources than the runtime's events said (evidence.go).
	evidence evidence
	// pids is what is known about whose numbering PIDs are in: the agent's own PID
	// namespace, the host prefix learned from the kernel's paths, evidence that the
	// runtime's PIDs are not the kernel's (see learnKillLocked).
	pids classify.PIDFacts
	// prefixConflict: a kernel path named one of the node's containers under another
	// host prefix than the learned one (logged once).
	prefixConflict bool
}

// container is what the ledger knows about one container.
type container struct {
	ev cri.ContainerEvent // identity, as last seen (mergeEvent)
	// cgroup is the container's memory cgroup as the kernel prints it, podCgroup its
	// pod's; empty when unknown.
	cgroup, podCgroup string
	// pids are the container's processes seen in its cgroup.procs, in the agent's PID
	// numbering (the kernel's only in the init PID namespace); procCount how many
	// processes the last reading listed (0 for those the agent cannot see count too).
	// runtimePID is the container's init process as the runtime reports it
	// (cri.ContainerEvent.PID), in the runtime's numbering. Which of them may match a
	// kernel line is classify.TrustedPIDs's decision.
	pids       []int
	procCount  int
	runtimePID int
	// podAtStart is the pod cgroup's reading when the container was first seen running;
	// last and podLast the container's and the pod's at the last OOM event or at the
	// exit, whichever came last and found the cgroup (a container's cgroup is usually
	// gone by the time the runtime reports the exit).
	podAtStart    *cgroup.Memory
	last, podLast *cgroup.Memory
	// ooms are the times of containerd's OOM events; oomHandled how many of them were
	// classified.
	ooms       []time.Time
	oomHandled int
	// exit is the Exited event; exitDone once classified (or dropped).
	exit     *cri.ContainerEvent
	exitDone bool
	// unknownCounted: an UnknownOOM verdict was counted for this container.
	unknownCounted bool
	// replay: the OOM kill was found in the container's cgroup counters when it was
	// first seen running (see started); like an exit from before the agent's start, it
	// is not counted as an unknown OOM (an agent restarted again would count it again).
	replay bool
	// kernelWaited: the item waited once for late evidence.
	kernelWaited [numItems]bool
	// podWait is when an item of this container first missed its pod in the cache, and
	// podChecked whether the API server confirmed the pod is this node's.
	podWait    [numItems]time.Time
	podChecked bool
	// doneAt is when nothing more was to be done (for Expire).
	doneAt time.Time
	// device is where the device verdict on the exit stands (devices.go): none, pending
	// or done.
	device uint8
}

// observedState is a container's state as the runtime reports it, for Observed.
type observedState struct {
	attempt uint32
	state   classify.ContainerState
}

// New returns an empty ledger. pids is what the caller knows of its PID namespace
// (classify.PIDFacts.InitNamespace); the rest of it is learned from the kernel's kills.
func New(pids classify.PIDFacts) *Ledger {
	return &Ledger{
		containers: map[string]*container{},
		observed:   map[types.UID]map[string]observedState{},
		evidence:   newEvidence(),
		pids:       pids,
	}
}

// Status is a summary of what the ledger holds of one container (Container), for logs and
// tests.
type Status struct {
	// Exited: the Exited event is in; ExitDone: it was classified or dropped.
	Exited, ExitDone bool
	// OOMs is how many OOM events (containerd's, or a kill found counted at the start)
	// are in, OOMsHandled how many of them were classified or dropped.
	OOMs, OOMsHandled int
	// StartRead: the pod's cgroup was read when the container was first seen running.
	StartRead bool
	// PIDs is how many of its PIDs were seen; RuntimePID is the runtime's PID of its
	// init.
	PIDs, RuntimePID int
	// kernelWaited says, by Item, whether the item waited for late evidence (Waited).
	kernelWaited [numItems]bool
}

// Waited reports whether the container's item k waited for late evidence (KernelWait).
func (s Status) Waited(k Item) bool { return s.kernelWaited[k] }

// Done reports whether the container's exit and its OOM events were all classified (or
// dropped).
func (s Status) Done() bool { return s.ExitDone && s.OOMsHandled == s.OOMs }

// Container returns the summary of a container; false when the ledger does not know it.
func (l *Ledger) Container(id string) (Status, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.containers[id]
	if c == nil {
		return Status{}, false
	}
	return Status{Exited: c.exit != nil, ExitDone: c.exitDone, OOMs: len(c.ooms), OOMsHandled: c.oomHandled,
		StartRead: c.podAtStart != nil, PIDs: len(c.pids), RuntimePID: c.runtimePID, kernelWaited: c.kernelWaited}, true
}

// Len returns how many containers the ledger holds.
func (l *Ledger) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.containers)
}
