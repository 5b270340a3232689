package agent

// Device failures: the pods' device health (from the pod cache's events) into the ledger's
// evidence, and the device verdict on a container's death (classify.DecideDevice) from
// that evidence and the drivers' faults (gpus.go), to its stamps (classify.StampsForDevice):
//
//   - a device-holding pod's container dies with a non-zero exit (its exit classified,
//     work.go): its device verdict is started and queued (itemDevice);
//   - the verdict is judged at once; one that may still change (a device that turns
//     Unhealthy, or a fault logged, within the window after the death) is judged again at
//     the window's end, and earlier when new evidence for that container comes (a pod
//     update turning one of its devices Unhealthy, a hardware Xid on one of its GPUs);
//   - a pod the kubelet refused at admission because it could not allocate its device (one
//     turned Unhealthy after the scheduler placed the pod) is stamped at once;
//   - a pod the agent finds Failed, holding devices, without a DeviceFailed condition and
//     with a failed container the runtime no longer reports (its containers removed while
//     the agent was not running) is judged from its status (itemDevicePod).

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/coroner-dev/coroner/agent/classify"
	"github.com/coroner-dev/coroner/agent/ledger"
	"github.com/coroner-dev/coroner/agent/stamper"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/cri"
)

// DefaultDeviceWindow is --device-window's default: how long after a container's death a
// device turning Unhealthy (or a hardware fault logged) still explains it. See
// docs/choices.md for why 10 s.
const DefaultDeviceWindow = 10 * time.Second

// deviceResyncDelay is how long a Failed pod found without a device verdict waits before
// it is judged from its status: the runtime's exit, which the agent judges with better
// evidence, normally comes first.
const deviceResyncDelay = KernelBacklogWait

// observeDevices records the device health a device-holding pod's status reports, judges
// again now the pending verdicts of the containers one of whose devices turned Unhealthy,
// and queues the status judgement of a Failed pod that has no device verdict.
func (a *Agent) observeDevices(pod *corev1.Pod) {
	if !conditions.HoldsDevices(pod) {
		return
	}
	turned := a.ledger.ObserveDevices(pod.UID, deviceReports(pod), a.clock.Now())
	if len(turned) > 0 {
		a.requeueDevices(pod.UID, turned...)
	}
	if pod.Status.Phase == corev1.PodFailed && conditions.Find(&pod.Status, conditions.DeviceFailed) == nil {
		delay := deviceResyncDelay
		if _, refused := conditions.AdmissionDeviceFailure(pod); refused {
			delay = 0 // no container ran: no runtime exit will come
		}
		a.queue.AddAfter(devicePodItem(pod.UID), delay)
	}
}

// deviceReports flattens a pod's allocatedResourcesStatus.
func deviceReports(pod *corev1.Pod) []ledger.DeviceReport {
	var out []ledger.DeviceReport
	for _, list := range [][]corev1.ContainerStatus{pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses} {
		for _, cs := range list {
			for _, r := range cs.AllocatedResourcesStatus {
				for _, d := range r.Resources {
					h := d.Health
					if h == "" {
						h = corev1.ResourceHealthStatusUnknown
					}
					out = append(out, ledger.DeviceReport{Container: cs.Name, Resource: string(r.Name), ID: string(d.ResourceID), Health: h})
				}
			}
		}
	}
	return out
}

// requeueDevices queues the pending device verdicts of the pod's containers named.
func (a *Agent) requeueDevices(uid types.UID, containers ...string) {
	uids := []types.UID{uid}
	if pod := a.podByUID(uid); pod != nil && runtimeUID(pod) != uid {
		uids = append(uids, runtimeUID(pod))
	}
	for _, u := range uids {
		for _, id := range a.ledger.PendingDevices(u, containers...) {
			a.queue.Add(deviceItem(id))
		}
	}
}

// startDevice starts the device verdict on a classified exit of pod's container: a
// non-zero exit of a pod that holds devices (its spec or status says so, or the ledger
// knows devices of it).
func (a *Agent) startDevice(pod *corev1.Pod, x cri.ContainerEvent) {
	if x.ExitCode == 0 || !conditions.HoldsDevices(pod) && !a.ledger.HasDevices(pod.UID, "") {
		return
	}
	if a.ledger.StartDevice(x.ContainerID) {
		a.queue.Add(deviceItem(x.ContainerID))
	}
}

// processDevice judges a container's pending device verdict: final, it is claimed and
// stamped; else it is judged again at the window's end (not while draining: a new agent
// judges the pod from its status).
func (a *Agent) processDevice(ctx context.Context, id string) {
	x, ok := a.ledger.DevicePending(id)
	if !ok {
		return
	}
	pod := a.podByUID(types.UID(x.PodUID))
	if pod == nil {
		a.ledger.FinishDevice(id) // deleted: nothing to write
		return
	}
	logger := a.logger.WithValues("pod", klog.KObj(pod), "container", x.ContainerName, "containerID", shortID(id))
	now := a.clock.Now()
	if !a.draining.Load() && a.waitKernelBacklog(now) {
		a.queue.AddAfter(deviceItem(id), 50*time.Millisecond)
		return
	}
	devices, faults := a.ledger.DeviceFacts(pod.UID, x.ContainerName)
	if len(devices) == 0 && a.cfg.PodResources != nil {
		a.learnPodResources(ctx, logger, pod)
		devices, faults = a.ledger.DeviceFacts(pod.UID, x.ContainerName)
	}
	f := classify.DeviceFacts{Container: x.ContainerName, ExitCode: x.ExitCode, StartedAt: x.StartedAt,
		FinishedAt: nonZero(x.FinishedAt, x.ObservedAt), Devices: devices, Faults: faults, Now: now, Window: a.cfg.DeviceWindow}
	v := classify.DecideDevice(f)
	if !v.WaitUntil.IsZero() {
		if !a.draining.Load() {
			a.queue.AddAfter(deviceItem(id), max(v.WaitUntil.Sub(now), 0))
		}
		return
	}
	if !a.ledger.FinishDevice(id) {
		return
	}
	a.deviceJudged(logger, pod, v, f)
}

// processDevicePod judges, from its status, the failed containers of a Failed pod that
// holds devices and has no device verdict, when the runtime no longer reports them (the
// ledger does not know them): an agent restarted after they were removed. The first
// container a device failed is stamped; else the first failed container's verdict.
func (a *Agent) processDevicePod(uid types.UID) {
	pod := a.podByUID(uid)
	if pod == nil || pod.Status.Phase != corev1.PodFailed || conditions.Find(&pod.Status, conditions.DeviceFailed) != nil {
		return
	}
	now := a.clock.Now()
	if v, f, ok := classify.DecideAdmission(pod, now); ok {
		a.deviceJudged(a.logger.WithValues("pod", klog.KObj(pod), "from", "pod status"), pod, v, f)
		return
	}
	var first *classify.DeviceFacts
	var firstV classify.DeviceVerdict
	for _, list := range [][]corev1.ContainerStatus{pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses} {
		for _, cs := range list {
			t := cs.State.Terminated
			if t == nil || (t.ExitCode == 0 && t.Signal == 0) {
				continue
			}
			if _, id, ok := strings.Cut(t.ContainerID, "://"); ok {
				if _, known := a.ledger.Container(id); known {
					continue // the runtime's exit is (or was) judged with it
				}
			}
			devices, faults := a.ledger.DeviceFacts(pod.UID, cs.Name)
			f := classify.DeviceFacts{Container: cs.Name, ExitCode: t.ExitCode, Signal: t.Signal, StartedAt: t.StartedAt.Time,
				FinishedAt: t.FinishedAt.Time, Devices: devices, Faults: faults, Now: now, Window: a.cfg.DeviceWindow}
			v := classify.DecideDevice(f)
			if !v.WaitUntil.IsZero() {
				a.queue.AddAfter(devicePodItem(uid), max(v.WaitUntil.Sub(now), 0))
				return
			}
			if first == nil || (v.Failed && !firstV.Failed) {
				ff := f
				first, firstV = &ff, v
			}
		}
	}
	if first != nil {
		a.deviceJudged(a.logger.WithValues("pod", klog.KObj(pod), "container", first.Container, "from", "pod status"), pod, firstV, *first)
	}
}

// deviceJudged counts a final device verdict (not again for a pod that has one already:
// an agent restarted judges again what the runtime replays), logs it and hands its stamps
// to the stamper.
func (a *Agent) deviceJudged(logger klog.Logger, pod *corev1.Pod, v classify.DeviceVerdict, f classify.DeviceFacts) {
	signal := string(v.VerdictSignal())
	if conditions.Find(&pod.Status, conditions.DeviceFailed) == nil {
		if v.Failed {
			a.metrics.DeviceVerdict(v.Resource, signal)
		} else {
			for _, r := range heldResources(f.Devices) {
				a.metrics.DeviceVerdict(r, signal)
			}
		}
	}
	stamps := classify.StampsForDevice(pod, v, f)
	ref := stamper.PodRef{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID}
	var reqs []stamper.Request
	for _, s := range stamps {
		r := stamper.Request{Pod: ref, Stamp: s, EventTime: v.EventTime(f)}
		if s.Kind == classify.KindDeviceVerdict {
			r.DeviceSignal = signal
		}
		reqs = append(reqs, r)
	}
	a.stamper.Add(reqs...)
	switch {
	case v.Failed && len(stamps) == 0:
		logger.Info("Container died of a failed device; not stamped (restarted in place, or the pod has a DeviceFailed verdict already)",
			"exitCode", f.ExitCode, "resource", v.Resource, "device", v.ID, "signal", signal, "at", v.At)
	case v.Failed:
		logger.Info("Container died of a failed device", "exitCode", f.ExitCode, "resource", v.Resource, "device", v.ID,
			"signal", signal, "at", v.At, "code", v.Code)
	default:
		logger.V(2).Info("No device explains the container's death", "exitCode", f.ExitCode, "devices", len(f.Devices), "stamps", len(stamps))
	}
}

// heldResources lists the resources of devices, without repeats; "unknown" for none.
func heldResources(devices []classify.DeviceHealth) []string {
	var out []string
	for _, d := range devices {
		if !slices.Contains(out, d.Resource) {
			out = append(out, d.Resource)
		}
	}
	if len(out) == 0 {
		out = []string{"unknown"}
	}
	return out
}

// learnPodResources asks the kubelet's PodResources API which devices the pod's
// containers hold (for a pod whose status does not say) and teaches the ledger. A missing
// socket is said once; other errors at verbosity 1 (the verdict goes on without).
func (a *Agent) learnPodResources(ctx context.Context, logger klog.Logger, pod *corev1.Pod) {
	list, err := a.cfg.PodResources.List(ctx)
	if err != nil {
		if errors.Is(err, ErrNoPodResourcesSocket) {
			a.podResourcesOnce.Do(func() {
				logger.Info("The kubelet's PodResources socket is not there: devices the pods' statuses do not list cannot be known", "err", err.Error())
			})
		} else {
			logger.V(1).Info("Cannot list the kubelet's PodResources; judging without", "err", err.Error())
		}
		return
	}
	now := a.clock.Now()
	for _, d := range list {
		if d.Namespace == pod.Namespace && d.Pod == pod.Name {
			a.ledger.LearnAllocation(pod.UID, d.Container, d.Resource, d.IDs, now)
		}
	}
}
