package ledger

// Device evidence (the second source evidence.go's header describes): the health the
// kubelet reports for each device allocated to a pod's containers
// (status.containerStatuses[].allocatedResourcesStatus), kept as a state per (pod UID,
// container, resource, device ID) with the time the agent first saw each health, and the
// hardware faults a device's driver logged (NVIDIA Xid lines), kept as events keyed by
// device ID and joined to the containers through the device IDs their pods report (or
// the kubelet's PodResources API, LearnAllocation). A device verdict's facts
// (DeviceFacts) are built from both; the verdict itself is a work item of its own on the
// container (StartDevice, DevicePending, FinishDevice).

import (
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/coroner-dev/coroner/agent/classify"
	"github.com/coroner-dev/coroner/cri"
)

// Bounds of the device evidence. Health states are forgotten with their pod (Forget, or
// Expire once the pod has left the cache and the ledger), and at most DeviceMax are kept
// (the least recently reported go first). Driver faults are kept FaultTTL after they were
// read, at most FaultMax of them (the newest).
const (
	DeviceMax = 4096
	FaultTTL  = KernelTTL
	FaultMax  = 1024
)

// DeviceKey names one device allocated to one container of a pod (by the pod's
// metadata.uid).
type DeviceKey struct {
	PodUID       types.UID
	Container    string
	Resource, ID string
}

// DeviceReport is one device's health as a pod's status reports it.
type DeviceReport struct {
	Container, Resource, ID string
	Health                  corev1.ResourceHealthStatus
}

// DriverFault is a hardware fault a device's driver logged, for the device ID it maps to
// (an NVIDIA GPU's UUID, the device ID NVIDIA's device plugin reports).
type DriverFault struct {
	ID   string
	Code int
	// At is when the kernel logged it (when it was read, if the log's clock is not known).
	At      time.Time
	Message string
}

// deviceState is what is known of one device of one container.
type deviceState struct {
	health corev1.ResourceHealthStatus
	// since is when the agent first saw health; zero when not known (the pod was first
	// seen with it already).
	since time.Time
	// seen is when it was last reported (for DeviceMax).
	seen time.Time
}

// Device verdict states of a container (container.device).
const (
	deviceNone uint8 = iota
	devicePending
	deviceDone
)

// ObserveDevices records the device health a pod's status reports (reports, possibly
// empty for a pod that holds devices the kubelet does not report on), at now. A health
// first seen for a pod seen before, or a change, is dated now; a health first seen with
// the pod itself is dated zero (unknown: it may have turned long ago, as after the agent's
// restart). It returns the containers one of whose devices is now Unhealthy and was not
// at the last report, sorted.
func (l *Ledger) ObserveDevices(uid types.UID, reports []DeviceReport, now time.Time) (turned []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, known := l.evidence.devicePods[uid]
	if !known {
		l.evidence.devicePods[uid] = now
	}
	for _, r := range reports {
		k := DeviceKey{PodUID: uid, Container: r.Container, Resource: r.Resource, ID: r.ID}
		old, had := l.evidence.devices[k]
		st := deviceState{health: r.Health, since: old.since, seen: now}
		if !had || old.health != r.Health {
			st.since = now
			if !known {
				st.since = time.Time{}
			}
		}
		l.putDeviceLocked(k, st)
		if r.Health == corev1.ResourceHealthStatusUnhealthy && (!had || old.health != r.Health) && !slices.Contains(turned, r.Container) {
			turned = append(turned, r.Container)
		}
	}
	slices.Sort(turned)
	return turned
}

// LearnAllocation records device IDs allocated to a container as the kubelet's
// PodResources API lists them (no health: Unknown, unless the pod's status said one).
func (l *Ledger) LearnAllocation(uid types.UID, container, resource string, ids []string, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.evidence.devicePods[uid]; !ok {
		l.evidence.devicePods[uid] = now
	}
	for _, id := range ids {
		k := DeviceKey{PodUID: uid, Container: container, Resource: resource, ID: id}
		if _, ok := l.evidence.devices[k]; ok {
			continue
		}
		l.putDeviceLocked(k, deviceState{health: corev1.ResourceHealthStatusUnknown, seen: now})
	}
}

// putDeviceLocked keeps a device's state, forgetting the least recently reported one
// when DeviceMax are kept. l.mu is held.
func (l *Ledger) putDeviceLocked(k DeviceKey, st deviceState) {
	if _, ok := l.evidence.devices[k]; !ok && len(l.evidence.devices) >= DeviceMax {
		var oldest DeviceKey
		var at time.Time
		first := true
		for k2, s := range l.evidence.devices {
			if first || s.seen.Before(at) {
				oldest, at, first = k2, s.seen, false
			}
		}
		delete(l.evidence.devices, oldest)
	}
	l.evidence.devices[k] = st
}

// HasDevices reports whether a device is known for the pod's container (any container
// when container is "").
func (l *Ledger) HasDevices(uid types.UID, container string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for k := range l.evidence.devices {
		if k.PodUID == uid && (container == "" || k.Container == container) {
			return true
		}
	}
	return false
}

// LearnFault keeps a driver's hardware fault (read at now) and returns the containers
// holding its device, by the device IDs their pods report: their device verdicts may
// change.
func (l *Ledger) LearnFault(f DriverFault, now time.Time) []DeviceKey {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.evidence.faults.add(f, now, FaultMax)
	var holders []DeviceKey
	for k := range l.evidence.devices {
		if k.ID == f.ID {
			holders = append(holders, k)
		}
	}
	slices.SortFunc(holders, func(a, b DeviceKey) int {
		return strings.Compare(string(a.PodUID)+"/"+a.Container, string(b.PodUID)+"/"+b.Container)
	})
	return holders
}

// DeviceFacts copies what is known of the devices of the pod's container: their health,
// and the driver faults logged for their IDs (each named with the resource the device is
// allocated under). The caller adds the container's death.
func (l *Ledger) DeviceFacts(uid types.UID, container string) (devices []classify.DeviceHealth, faults []classify.DeviceFault) {
	l.mu.Lock()
	defer l.mu.Unlock()
	resources := map[string]string{} // device ID -> resource
	for k, s := range l.evidence.devices {
		if k.PodUID != uid || k.Container != container {
			continue
		}
		devices = append(devices, classify.DeviceHealth{Resource: k.Resource, ID: k.ID, Health: s.health, Since: s.since})
		resources[k.ID] = k.Resource
	}
	for _, a := range l.evidence.faults.recs {
		if r, ok := resources[a.rec.ID]; ok {
			faults = append(faults, classify.DeviceFault{Resource: r, ID: a.rec.ID, Code: a.rec.Code, At: a.rec.At, Message: a.rec.Message})
		}
	}
	slices.SortFunc(devices, func(a, b classify.DeviceHealth) int {
		return strings.Compare(a.Resource+"\x00"+a.ID, b.Resource+"\x00"+b.ID)
	})
	return devices, faults
}

// forgetDevicesLocked forgets the device evidence of a pod. l.mu is held.
func (l *Ledger) forgetDevicesLocked(uid types.UID) {
	delete(l.evidence.devicePods, uid)
	for k := range l.evidence.devices {
		if k.PodUID == uid {
			delete(l.evidence.devices, k)
		}
	}
}

// expireDevicesLocked forgets the device evidence of pods that are not live. l.mu is
// held.
func (l *Ledger) expireDevicesLocked(live map[types.UID]bool) {
	for uid := range l.evidence.devicePods {
		if !live[uid] {
			l.forgetDevicesLocked(uid)
		}
	}
	for k := range l.evidence.devices {
		if !live[k.PodUID] {
			delete(l.evidence.devices, k)
		}
	}
}

// StartDevice makes the device verdict on a container's exit pending; false when the
// container is not known or its verdict was started before.
func (l *Ledger) StartDevice(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.containers[id]
	if c == nil || c.exit == nil || c.device != deviceNone {
		return false
	}
	c.device = devicePending
	return true
}

// DevicePending returns the container's exit when its device verdict is pending.
func (l *Ledger) DevicePending(id string) (cri.ContainerEvent, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.containers[id]
	if c == nil || c.exit == nil || c.device != devicePending {
		return cri.ContainerEvent{}, false
	}
	return *c.exit, true
}

// PendingDevices returns the IDs of the containers named (by the pod's UID as the runtime
// knows it, and the container's name) whose device verdict is pending, sorted.
func (l *Ledger) PendingDevices(uid types.UID, containers ...string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var ids []string
	for id, c := range l.containers {
		if c.device == devicePending && types.UID(c.ev.PodUID) == uid && slices.Contains(containers, c.ev.ContainerName) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// FinishDevice claims a container's pending device verdict: false when it was claimed
// before (or never started).
func (l *Ledger) FinishDevice(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.containers[id]
	if c == nil || c.device != devicePending {
		return false
	}
	c.device = deviceDone
	return true
}
