// Package metrics holds the node agent's Prometheus metrics (requirement A8), under the
// prefix coroner_agent_. They are registered once, by New, on the registry the caller
// passes, so that tests can have their own; nothing is registered on the global default
// registry.
//
// Label values:
//
//	kind     the stamp's kind (agent/classify.Kind): LimitOOM, NodeOOM,
//	         TerminationByKubelet, TerminalPhase, ExitHistory, DeviceFailure (DisruptionTarget),
//	         DeviceVerdict (coroner.dev/DeviceFailed)
//	reason   the stamp's reason (classify.Stamp.Reason): MemoryLimitExceeded, NodeOOMKill,
//	         the kubelet's status.reason (Evicted, Terminated, NodeShutdown, Preempting),
//	         Failed or Succeeded for TerminalPhase, Recorded or Replaced for ExitHistory
//	verdict  what an exit was (classify.OOMKind, with NotOOM for ""): NotOOM, LimitOOM,
//	         NodeOOM, UnknownOOM
//	reason   (dropped events) PodGone, OtherNode, NotInCache
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Namespace and Subsystem prefix every metric name: coroner_agent_.
const (
	Namespace = "coroner"
	Subsystem = "agent"
)

// Values of the "verdict" label of coroner_agent_container_exits_total.
const (
	VerdictNotOOM = "NotOOM"
)

// Values of the "reason" label of coroner_agent_dropped_events_total.
const (
	// DroppedPodGone: the container's pod was deleted (or re-created with a new UID)
	// before the agent could look at the exit.
	DroppedPodGone = "PodGone"
	// DroppedOtherNode: the container's pod is bound to another node; the agent writes
	// only pods of its own node (A7).
	DroppedOtherNode = "OtherNode"
	// DroppedNotInCache: the pod exists on this node but did not reach the agent's cache
	// in time (the watch is far behind).
	DroppedNotInCache = "NotInCache"
	// DroppedShutdown: the agent stopped (SIGTERM) before the stamp was written, its
	// shutdown grace period over (the API server slow or down).
	DroppedShutdown = "Shutdown"
)

// LatencyBuckets are the buckets of the latency histograms, in seconds: fine below a
// second, where the 200 ms goal of P2 lies, up to 80 s for the terminal phase's grace.
var LatencyBuckets = []float64{0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 2, 5, 10, 20, 40, 80}

// Metrics are the agent's metrics. The zero value is not usable: call New. Methods on a
// nil *Metrics record nothing.
type Metrics struct {
	// Stamps (coroner_agent_stamps_total) counts the stamps the agent wrote, that is
	// whose write changed the pod. Labels: kind, reason.
	Stamps *prometheus.CounterVec

	// DetectionLatency (coroner_agent_detection_latency_seconds, histogram) is the time
	// from the runtime's event to the successful patch of the stamp: from the
	// container's finishedAt (an exit) or containerd's OOM event time (an OOM kill of a
	// container that may keep running); for a terminal phase (A4), from the moment the
	// pod was both being deleted and without running containers, so it includes
	// --phase-grace; for TerminationByKubelet without a phase (A3), from when the agent
	// first saw the kubelet's reason. Label: kind.
	DetectionLatency *prometheus.HistogramVec

	// ObserveLatency (coroner_agent_observe_latency_seconds, histogram) is the first part
	// of DetectionLatency for a container exit or OOM kill: from the runtime's event to
	// when the agent's runtime watcher had it (the runtime's event delivery, or the
	// relist's period, and the CRI status read). Recorded only for stamps whose
	// observation time the agent knows: an exit's always, an OOM kill stamped from
	// containerd's OOM event only when that event was still the container's last one
	// (not when the exit came in before it was classified). Label: kind.
	ObserveLatency *prometheus.HistogramVec

	// WriteLatency (coroner_agent_write_latency_seconds, histogram) is the rest of
	// DetectionLatency for the same stamps: from when the runtime watcher had the event
	// to the successful patch (the agent's work queue, the classification with its wait
	// for the kernel log, the stamper's batch period, the API call and its retries).
	// Label: kind.
	WriteLatency *prometheus.HistogramVec

	// RuntimeConnected (coroner_agent_runtime_connected, gauge) is 1 while the container
	// runtime answers, 0 otherwise (/readyz then fails and says why).
	RuntimeConnected prometheus.Gauge

	// IgnoredContainers (coroner_agent_ignored_containers_total) counts the containers
	// without the kubelet's CRI labels (made by another CRI client), which the agent
	// ignores.
	IgnoredContainers prometheus.Counter

	// UnknownOOM (coroner_agent_unknown_oom_total) counts containers OOM-killed where
	// nothing said whose limit it was: nothing is stamped for them (see
	// classify.StampsForExit), so a rising count means evidence is missing (no kernel
	// log, cgroups gone before they were read). Exits from before the agent started,
	// which its first relist replays without their evidence, are not counted.
	UnknownOOM prometheus.Counter

	// Fenced (coroner_agent_fenced, gauge) is 1 while the agent has fenced its node
	// (A6, --fencing): its Lease has not been renewed for --fence-after, and it stops the
	// containers of the node's opted-in pods until a renewal succeeds again. Always 0
	// without --fencing.
	Fenced prometheus.Gauge

	// FenceStoppedContainers (coroner_agent_fence_stopped_containers_total) counts the
	// containers the agent stopped while fenced (a container the kubelet restarts
	// meanwhile is a new one, stopped and counted again).
	FenceStoppedContainers prometheus.Counter

	// ContainerExits (coroner_agent_container_exits_total) counts the container exits
	// the agent classified, with their pod found. Label: verdict.
	ContainerExits *prometheus.CounterVec

	// DroppedEvents (coroner_agent_dropped_events_total) counts container exits and OOM
	// kills left alone because of their pod, and stamps an agent stopping could not write
	// in its grace period. Label: reason (PodGone, OtherNode, NotInCache, Shutdown).
	DroppedEvents *prometheus.CounterVec

	// WriteErrors (coroner_agent_pod_write_errors_total) counts failed pod writes; each
	// is retried with backoff.
	WriteErrors prometheus.Counter

	// DeviceVerdicts (coroner_agent_device_verdicts_total) counts the device verdicts on
	// container deaths of pods holding devices (agent/classify.DecideDevice), restarts in
	// place included. Labels: resource (the failed device's; for none, each resource the
	// container held, "unknown" when none is known), signal (kubelet, driver, none).
	DeviceVerdicts *prometheus.CounterVec

	// DeviceLatency (coroner_agent_device_verdict_latency_seconds, histogram) is the time
	// from the later of the container's death and its device's turn to Unhealthy (or the
	// driver's fault) to the written coroner.dev/DeviceFailed condition; for signal none
	// from the death (it includes the window). Label: signal.
	DeviceLatency *prometheus.HistogramVec

	// PodWrites counts the pod patches the stamper sends (phase and conditions, the exit
	// history annotation; all through pods/status), failed ones included. Beside Stamps it
	// says how many API writes a stamp costs (the batch period merges a pod's stamps).
	PodWrites prometheus.Counter
}

// New creates the metrics and registers them on reg. It panics if reg already holds
// metrics of the same names (register once per registry).
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Stamps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: Subsystem,
			Name: "stamps_total",
			Help: "Stamps written on pods. kind: LimitOOM, NodeOOM, TerminationByKubelet, TerminalPhase, ExitHistory, DeviceFailure, DeviceVerdict; reason: the condition's reason, the kubelet's status.reason, the phase, or Recorded/Replaced for ExitHistory.",
		}, []string{"kind", "reason"}),
		DetectionLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Subsystem: Subsystem,
			Name:    "detection_latency_seconds",
			Help:    "Time from the runtime's event (container finishedAt, or containerd's OOM event) to the successful pod patch; for TerminalPhase from when the pod was deleted with no running container (includes --phase-grace). kind: as coroner_agent_stamps_total.",
			Buckets: LatencyBuckets,
		}, []string{"kind"}),
		ObserveLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Subsystem: Subsystem,
			Name:    "observe_latency_seconds",
			Help:    "Time from the runtime's event (container finishedAt, or containerd's OOM event) to when the agent's runtime watcher had it; the first part of coroner_agent_detection_latency_seconds, for exits and OOM kills. kind: as coroner_agent_stamps_total.",
			Buckets: LatencyBuckets,
		}, []string{"kind"}),
		WriteLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Subsystem: Subsystem,
			Name:    "write_latency_seconds",
			Help:    "Time from when the agent's runtime watcher had the event to the successful pod patch (work queue, classification, batch period, API call); the rest of coroner_agent_detection_latency_seconds, for exits and OOM kills. kind: as coroner_agent_stamps_total.",
			Buckets: LatencyBuckets,
		}, []string{"kind"}),
		RuntimeConnected: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace, Subsystem: Subsystem,
			Name: "runtime_connected",
			Help: "1 while the container runtime answers over CRI, 0 otherwise.",
		}),
		IgnoredContainers: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: Subsystem,
			Name: "ignored_containers_total",
			Help: "Containers without the kubelet's CRI labels, ignored.",
		}),
		UnknownOOM: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: Subsystem,
			Name: "unknown_oom_total",
			Help: "Containers OOM-killed without evidence of whose limit it was; nothing is stamped for them.",
		}),
		Fenced: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace, Subsystem: Subsystem,
			Name: "fenced",
			Help: "1 while the agent has fenced its node (--fencing: its Lease unrenewed for --fence-after; it stops the containers of opted-in pods), 0 otherwise.",
		}),
		FenceStoppedContainers: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: Subsystem,
			Name: "fence_stopped_containers_total",
			Help: "Containers of opted-in pods the agent stopped while fenced.",
		}),
		ContainerExits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: Subsystem,
			Name: "container_exits_total",
			Help: "Container exits classified. verdict: NotOOM, LimitOOM, NodeOOM, UnknownOOM.",
		}, []string{"verdict"}),
		DroppedEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: Subsystem,
			Name: "dropped_events_total",
			Help: "Container exits and OOM kills left alone. reason: PodGone (deleted), OtherNode (bound to another node), NotInCache (the watch is far behind).",
		}, []string{"reason"}),
		WriteErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: Subsystem,
			Name: "pod_write_errors_total",
			Help: "Failed pod writes; each is retried with backoff.",
		}),
		DeviceVerdicts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: Subsystem,
			Name: "device_verdicts_total",
			Help: "Device verdicts on container deaths of pods holding devices. resource: the failed device's (for none each resource held, unknown when not known); signal: kubelet (allocatedResourcesStatus), driver (a hardware Xid), none.",
		}, []string{"resource", "signal"}),
		DeviceLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Subsystem: Subsystem,
			Name:    "device_verdict_latency_seconds",
			Help:    "Time from the later of the container's death and its device turning Unhealthy (or the driver's fault) to the written coroner.dev/DeviceFailed condition; for signal none from the death (includes --device-window). signal: kubelet, driver, none.",
			Buckets: LatencyBuckets,
		}, []string{"signal"}),
		PodWrites: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: Subsystem,
			Name: "pod_writes_total",
			Help: "Pod patches sent to the API server (phase, conditions, exit history), failed ones included.",
		}),
	}
	reg.MustRegister(m.Stamps, m.DetectionLatency, m.ObserveLatency, m.WriteLatency, m.RuntimeConnected, m.IgnoredContainers,
		m.UnknownOOM, m.Fenced, m.FenceStoppedContainers, m.ContainerExits, m.DroppedEvents, m.WriteErrors, m.PodWrites,
		m.DeviceVerdicts, m.DeviceLatency)
	return m
}

// Stamped records a written stamp and its latency (negative latencies, from clock skew
// between the runtime and the agent, are recorded as 0).
func (m *Metrics) Stamped(kind, reason string, latencySeconds float64) {
	if m == nil {
		return
	}
	m.Stamps.WithLabelValues(kind, reason).Inc()
	m.DetectionLatency.WithLabelValues(kind).Observe(max(latencySeconds, 0))
}

// Observed records the observe stage of a written stamp (ObserveLatency); the caller
// skips unknown or negative latencies.
func (m *Metrics) Observed(kind string, latencySeconds float64) {
	if m == nil {
		return
	}
	m.ObserveLatency.WithLabelValues(kind).Observe(latencySeconds)
}

// Written records the write stage of a written stamp (WriteLatency); the caller skips
// unknown or negative latencies.
func (m *Metrics) Written(kind string, latencySeconds float64) {
	if m == nil {
		return
	}
	m.WriteLatency.WithLabelValues(kind).Observe(latencySeconds)
}

// Exit records a classified exit; verdict "" is NotOOM.
func (m *Metrics) Exit(verdict string) {
	if m == nil {
		return
	}
	if verdict == "" {
		verdict = VerdictNotOOM
	}
	m.ContainerExits.WithLabelValues(verdict).Inc()
}

// DeviceVerdict records a device verdict.
func (m *Metrics) DeviceVerdict(resource, signal string) {
	if m == nil {
		return
	}
	m.DeviceVerdicts.WithLabelValues(resource, signal).Inc()
}

// DeviceStamped records a written device verdict's latency (negative, from clock skew, as
// 0).
func (m *Metrics) DeviceStamped(signal string, latencySeconds float64) {
	if m == nil {
		return
	}
	m.DeviceLatency.WithLabelValues(signal).Observe(max(latencySeconds, 0))
}

// Dropped records an event left alone for reason.
func (m *Metrics) Dropped(reason string) {
	if m == nil {
		return
	}
	m.DroppedEvents.WithLabelValues(reason).Inc()
}

// Unknown records an OOM kill nobody could place.
func (m *Metrics) Unknown() {
	if m == nil {
		return
	}
	m.UnknownOOM.Inc()
}

// WriteFailed records a failed pod write.
func (m *Metrics) WriteFailed() {
	if m == nil {
		return
	}
	m.WriteErrors.Inc()
}

// SetRuntimeConnected sets the runtime connection gauge.
func (m *Metrics) SetRuntimeConnected(connected bool) {
	if m == nil {
		return
	}
	v := 0.0
	if connected {
		v = 1
	}
	m.RuntimeConnected.Set(v)
}

// SetFenced sets the fence gauge.
func (m *Metrics) SetFenced(fenced bool) {
	if m == nil {
		return
	}
	v := 0.0
	if fenced {
		v = 1
	}
	m.Fenced.Set(v)
}

// FenceStopped records a container stopped while fenced.
func (m *Metrics) FenceStopped() {
	if m == nil {
		return
	}
	m.FenceStoppedContainers.Inc()
}

// AddIgnored adds n ignored containers.
func (m *Metrics) AddIgnored(n uint64) {
	if m == nil || n == 0 {
		return
	}
	m.IgnoredContainers.Add(float64(n))
}

// Value returns the sum of the values of the samples c collects (for a histogram, its
// sample count): one labelled series, a whole vector, a plain counter or gauge. For tests
// and tools that read the agent's metrics in-process.
func Value(c prometheus.Collector) float64 {
	ch := make(chan prometheus.Metric, 64)
	go func() {
		c.Collect(ch)
		close(ch)
	}()
	var sum float64
	for m := range ch {
		var d dto.Metric
		if err := m.Write(&d); err != nil {
			continue
		}
		switch {
		case d.Counter != nil:
			sum += d.Counter.GetValue()
		case d.Gauge != nil:
			sum += d.Gauge.GetValue()
		case d.Histogram != nil:
			sum += float64(d.Histogram.GetSampleCount())
		}
	}
	return sum
}

// Wrote records a pod patch sent to the API server (PodWrites).
func (m *Metrics) Wrote() {
	if m == nil {
		return
	}
	m.PodWrites.Inc()
}
