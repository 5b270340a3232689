// Package metrics holds the shim's Prometheus metrics (S8), the equivalents of the
// built-in Job controller's (k8s.io/kubernetes pkg/controller/job/metrics) under the
// prefix coroner_ instead of job_controller_. They are registered once, by New, on the
// registry the caller passes, so that tests can have their own; nothing is registered on
// the global default registry.
//
// Only the leader serves the Job metrics. Of the replicas of a leader-elected shim, only
// the one holding the Lease syncs Jobs, so a standby's coroner_managed_jobs would say 0 and
// its counters would stay flat beside the leader's: a Service spanning both replicas would
// answer with either, and sum() over the replicas would mix them. So every replica serves
// coroner_leader (1 on the leader, 0 on a standby) and the process's own go_* and process_*
// metrics, and only the leader serves the coroner_* Job metrics below (SetLeader gates
// them). Prometheus scrapes every replica (the coroner-shim-metrics Service's endpoints, or
// the ServiceMonitor in deploy/monitoring): the Job series come from whichever replica
// leads, with its pod as their instance, and "no shim leader" is sum(coroner_leader) < 1.
// A new leader's counters start at 0 on a new series, which rate() and increase() handle.
//
// Label values are the built-in controller's, so that dashboards carry over:
//
//	completion_mode  Indexed, NonIndexed
//	result           success, error (sync duration); succeeded, failed (everything else)
//	action           reconciling, tracking, pods_created, pods_deleted
//	reason           see each metric
//	status           succeeded, failed
//	backoff_limit    perIndex, global
//	event            add, delete
package metrics

import (
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/coroner-dev/coroner/shim/observe"
)

// Namespace is the prefix of every metric name.
const Namespace = "coroner"

// Values of the "action" label of coroner_job_sync_duration_seconds.
const (
	// ActionReconciling: pod creations or deletions issued by an earlier sync were not
	// observed yet, so the sync created and deleted nothing.
	ActionReconciling = "reconciling"
	// ActionTracking: the sync neither created nor deleted pods (the usual case).
	ActionTracking = "tracking"
	// ActionPodsCreated: the sync created pods.
	ActionPodsCreated = "pods_created"
	// ActionPodsDeleted: the sync deleted pods.
	ActionPodsDeleted = "pods_deleted"
)

// Values of the "result" label of coroner_job_sync_duration_seconds.
const (
	ResultSuccess = "success"
	ResultError   = "error"
)

// Values of the "result" and "status" labels of the other metrics.
const (
	Succeeded = "succeeded"
	Failed    = "failed"
)

// Values of the "backoff_limit" label of coroner_job_finished_indexes_total.
const (
	BackoffLimitPerIndex = "perIndex"
	BackoffLimitGlobal   = "global"
)

// Values of the "event" label of coroner_terminated_pods_tracking_finalizer_total.
const (
	EventAdd    = "add"
	EventDelete = "delete"
)

// Metrics are the shim's metrics. The zero value is not usable: call New.
type Metrics struct {
	// JobSyncDuration (coroner_job_sync_duration_seconds, histogram) is the time one
	// sync of a managed Job took. Labels: completion_mode, result (success, error),
	// action (reconciling, tracking, pods_created, pods_deleted).
	JobSyncDuration *prometheus.HistogramVec

	// JobsFinished (coroner_jobs_finished_total) counts the Jobs this shim marked
	// Complete or Failed. Labels: completion_mode, result (succeeded, failed), reason
	// (CompletionsReached, SuccessPolicy, BackoffLimitExceeded, DeadlineExceeded,
	// PodFailurePolicy, FailedIndexes, MaxFailedIndexesExceeded).
	JobsFinished *prometheus.CounterVec

	// JobPodsFinished (coroner_job_pods_finished_total) counts the finished pods the
	// shim has fully tracked: added to status.succeeded or status.failed. Labels:
	// completion_mode, result (succeeded, failed).
	JobPodsFinished *prometheus.CounterVec

	// PodFailuresHandledByFailurePolicy
	// (coroner_pod_failures_handled_by_failure_policy_total) counts failed pods by the
	// pod failure policy action applied to them. Label: action (FailJob, FailIndex,
	// Ignore, Count, or None when no rule matched or the Job has no policy).
	PodFailuresHandledByFailurePolicy *prometheus.CounterVec

	// JobFinishedIndexes (coroner_job_finished_indexes_total) counts the indexes of
	// Indexed Jobs that finished. Labels: status (succeeded, failed), backoff_limit
	// (perIndex when the Job has backoffLimitPerIndex, else global).
	JobFinishedIndexes *prometheus.CounterVec

	// JobPodsCreation (coroner_job_pods_creation_total) counts the pod creations the
	// shim issued. Labels: reason (new, recreate_terminating_or_failed,
	// recreate_failed), status (succeeded, failed).
	JobPodsCreation *prometheus.CounterVec

	// TerminatedPodsTrackingFinalizer
	// (coroner_terminated_pods_tracking_finalizer_total) counts terminated pods
	// (phase Succeeded or Failed) of managed Jobs as they gain (add) and lose (delete)
	// the batch.kubernetes.io/job-tracking finalizer, as the informer sees them; the
	// difference is the number of finished pods still waiting to be counted. Label:
	// event (add, delete).
	TerminatedPodsTrackingFinalizer *prometheus.CounterVec

	// ManagedJobs (coroner_managed_jobs, gauge) is the number of Jobs managed by this
	// shim that have not finished, as its informer sees them. No labels.
	ManagedJobs prometheus.Gauge
	// PodsRecovered counts the node-failure recoveries (Z1-Z4) by action (FailOrphan,
	// ForceTerminate, ClearDisruption, DeleteTerminal) and reason (NodeUnreachable,
	// NodeFenced, DeletionByPodGC, StaleDisruptionTarget), of the pods of managed Jobs and,
	// with --recover-pods=all, of the other opted-in pods.
	PodsRecovered *prometheus.CounterVec

	// JobMemoryGrowths (coroner_job_memory_growths_total) counts the failed pods, killed at
	// their own memory limit, whose replacement got more memory (coroner.dev/oom-memory-retry).
	// Label: completion_mode.
	JobMemoryGrowths *prometheus.CounterVec

	// JobDeviceFailures (coroner_job_device_failures_total) counts the failed pods the shim
	// decided with coroner-agent's DeviceFailure verdict (a device allocated to the pod had
	// failed when its container died). Labels: resource (the failing device's resource,
	// "nvidia.com/gpu"; "claim" for DRA claims; "unknown" when the verdict does not say),
	// action (Ignore, Count, FailJob, FailIndex, None: what the pod failure policy did).
	JobDeviceFailures *prometheus.CounterVec
	// JobDeviceVerdictWait (coroner_job_device_verdict_wait_seconds, histogram) is, for
	// each failed pod whose failure coroner-agent's device verdict could change, the time
	// from its container's death to the shim's decision. Label: verdict (DeviceFailure,
	// NoDeviceFailure, Missing: decided without it once --device-verdict-wait was over).
	JobDeviceVerdictWait *prometheus.HistogramVec

	// JobPodsAvoidingNodes (coroner_job_pods_avoiding_nodes_total) counts the pods created
	// with affinity away from the nodes that killed their predecessors
	// (coroner.dev/avoid-failed-nodes). Label: avoidance (preferred, required).
	JobPodsAvoidingNodes *prometheus.CounterVec
	// JobDisruptionBudget (coroner_job_disruption_budget_verdicts_total) counts the
	// disruption budgets' verdicts on failures an Ignore rule matched
	// (coroner.dev/disruption-budget). Labels: class (the budget's class, default for the
	// classes not named), verdict (charged: ignored within the budget; spent: counted).
	JobDisruptionBudget *prometheus.CounterVec

	// JobRecordWrites (coroner_job_record_writes_total) counts the shim's writes of
	// JobRecords (package api/v1alpha1), by verb (create, patch, delete) and result
	// (success, conflict, error); JobRecordBytes (coroner_job_record_bytes_total) the
	// bytes of their request bodies by verb, and JobRecordEntries
	// (coroner_job_record_entries_total) the pod entries recorded, by outcome
	// (Succeeded, Failed, Ignored, Deleted).
	JobRecordWrites  *prometheus.CounterVec
	JobRecordBytes   *prometheus.CounterVec
	JobRecordEntries *prometheus.CounterVec

	// NodeBlamedDeaths (coroner_node_blamed_deaths_total) counts the deaths of managed
	// Jobs' pods blamed on their node (conditions.NodeBlame), once per pod, with or without
	// --quarantine. Labels: node, cause (device, node-oom, node-pressure, node-lost).
	NodeBlamedDeaths *prometheus.CounterVec
	// NodesQuarantined (coroner_nodes_quarantined, gauge) is the number of nodes with the
	// taint coroner.dev/quarantined, as the shim's node cache sees them (--quarantine only).
	NodesQuarantined prometheus.Gauge
	// NodeQuarantines (coroner_node_quarantines_total) counts the nodes the shim tainted.
	// Label: cause (the taint's value).
	NodeQuarantines *prometheus.CounterVec
	// NodeQuarantinesSpared (coroner_node_quarantines_spared_total) counts the nodes left
	// untainted because --quarantine-max nodes were quarantined (once per new death).
	NodeQuarantinesSpared prometheus.Counter
	// NodeQuarantinesLifted (coroner_node_quarantines_lifted_total) counts the taints the
	// shim lifted after --quarantine-for without a new death.
	NodeQuarantinesLifted prometheus.Counter

	// Leader (coroner_leader, gauge) is 1 while this replica leads (holds the leader Lease,
	// or runs without leader election), 0 while it stands by. Always served. No labels.
	Leader prometheus.Gauge

	// leading gates the Job metrics above: they are collected only while it is true.
	leading *atomic.Bool
}

// leaderOnly collects its collectors only while leading is true. It describes them always,
// so that the registry checks their names and labels once, at registration.
type leaderOnly struct {
	leading    *atomic.Bool
	collectors []prometheus.Collector
}

func (l leaderOnly) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range l.collectors {
		c.Describe(ch)
	}
}

func (l leaderOnly) Collect(ch chan<- prometheus.Metric) {
	if !l.leading.Load() {
		return
	}
	for _, c := range l.collectors {
		c.Collect(ch)
	}
}

// New creates the metrics and registers them on reg. It panics if reg already holds
// metrics of the same names (register once per registry). The metrics start as the
// leader's (coroner_leader 1, the Job metrics served): a replica under leader election
// calls SetLeader(false) before it serves them.
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		leading: new(atomic.Bool),
		Leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace,
			Name:      "leader",
			Help:      "1 while this replica leads (holds the leader Lease, or runs without leader election) and serves the Job metrics, 0 while it stands by.",
		}),
		JobSyncDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace,
			Name:      "job_sync_duration_seconds",
			Help:      "The time it took to sync a Job. completion_mode: Indexed, NonIndexed; result: success, error; action: reconciling, tracking, pods_created, pods_deleted.",
			Buckets:   prometheus.ExponentialBuckets(0.004, 2, 15),
		}, []string{"completion_mode", "result", "action"}),
		JobsFinished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace,
			Name:      "jobs_finished_total",
			Help:      "The number of Jobs that finished. completion_mode: Indexed, NonIndexed; result: succeeded, failed; reason: the reason of the Complete or Failed condition.",
		}, []string{"completion_mode", "result", "reason"}),
		JobPodsFinished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace,
			Name:      "job_pods_finished_total",
			Help:      "The number of finished Pods that are fully tracked (counted in the Job status). completion_mode: Indexed, NonIndexed; result: succeeded, failed.",
		}, []string{"completion_mode", "result"}),
		PodFailuresHandledByFailurePolicy: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace,
			Name:      "pod_failures_handled_by_failure_policy_total",
			Help:      "The number of failed Pods by the pod failure policy action applied: FailJob, FailIndex, Ignore, Count, or None when no rule matched.",
		}, []string{"action"}),
		JobFinishedIndexes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace,
			Name:      "job_finished_indexes_total",
			Help:      "The number of finished indexes of Indexed Jobs. status: succeeded, failed; backoff_limit: perIndex, global.",
		}, []string{"status", "backoff_limit"}),
		JobPodsCreation: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace,
			Name:      "job_pods_creation_total",
			Help:      "The number of Pod creations issued. reason: new, recreate_terminating_or_failed, recreate_failed; status: succeeded, failed.",
		}, []string{"reason", "status"}),
		TerminatedPodsTrackingFinalizer: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace,
			Name:      "terminated_pods_tracking_finalizer_total",
			Help:      "The number of terminated Pods (phase Succeeded or Failed) of managed Jobs that gained (event add) or lost (event delete) the finalizer batch.kubernetes.io/job-tracking.",
		}, []string{"event"}),
		ManagedJobs: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace,
			Name:      "managed_jobs",
			Help:      "The number of Jobs managed by this shim that have not finished.",
		}),
		PodsRecovered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace,
			Name:      "pods_recovered_total",
			Help:      "Pods the shim recovered from a node failure (of managed Jobs, and other opted-in pods with --recover-pods=all). action: ForceTerminate (zombie or fenced node), FailOrphan (node gone), ClearDisruption (stale DisruptionTarget), DeleteTerminal (terminal pod being deleted on an unreachable node); reason: NodeUnreachable, NodeFenced, DeletionByPodGC, StaleDisruptionTarget.",
		}, []string{"action", "reason"}),
		JobMemoryGrowths: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace,
			Name:      "job_memory_growths_total",
			Help:      "Failed pods, killed at their own memory limit, whose replacement got more memory (coroner.dev/oom-memory-retry). completion_mode: Indexed, NonIndexed.",
		}, []string{"completion_mode"}),
		JobDeviceFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace,
			Name:      "job_device_failures_total",
			Help:      "Failed pods decided with coroner-agent's DeviceFailure verdict (a device allocated to the pod had failed). resource: the failing device's resource (claim for DRA claims, unknown when not said); action: Ignore, Count, FailJob, FailIndex, or None when no rule matched.",
		}, []string{"resource", "action"}),
		JobDeviceVerdictWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace,
			Name:      "job_device_verdict_wait_seconds",
			Help:      "For failed pods whose failure coroner-agent's device verdict could change, the time from the container's death to the shim's decision. verdict: DeviceFailure, NoDeviceFailure, or Missing (decided without it, --device-verdict-wait over).",
			Buckets:   []float64{0.5, 1, 2, 5, 10, 15, 20, 30, 45, 60, 120, 300},
		}, []string{"verdict"}),
		JobPodsAvoidingNodes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace,
			Name:      "job_pods_avoiding_nodes_total",
			Help:      "Pods created with node affinity away from the nodes that killed their predecessors (coroner.dev/avoid-failed-nodes). avoidance: preferred, required.",
		}, []string{"avoidance"}),
		JobDisruptionBudget: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace,
			Name:      "job_disruption_budget_verdicts_total",
			Help:      "Verdicts of Jobs' disruption budgets (coroner.dev/disruption-budget) on failures an Ignore rule matched. class: the budget's class (default for classes not named); verdict: charged (ignored within the budget), spent (counted, the budget spent).",
		}, []string{"class", "verdict"}),
		JobRecordWrites: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace,
			Name:      "job_record_writes_total",
			Help:      "Writes of JobRecords, the pods' stories kept for coronerctl explain. verb: create, patch, delete; result: success, conflict, error.",
		}, []string{"verb", "result"}),
		JobRecordBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace,
			Name:      "job_record_bytes_total",
			Help:      "Bytes of the request bodies of the successful JobRecord writes. verb: create, patch.",
		}, []string{"verb"}),
		JobRecordEntries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace,
			Name:      "job_record_entries_total",
			Help:      "Pod entries recorded in JobRecords by a successful write. outcome: Succeeded, Failed, Ignored, Deleted.",
		}, []string{"outcome"}),
		NodeBlamedDeaths: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace,
			Name:      "node_blamed_deaths_total",
			Help:      "Deaths of managed Jobs' pods blamed on their node, once per pod. node: the node; cause: device, node-oom, node-pressure, node-lost.",
		}, []string{"node", "cause"}),
		NodesQuarantined: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace,
			Name:      "nodes_quarantined",
			Help:      "Nodes with the taint coroner.dev/quarantined (with --quarantine).",
		}),
		NodeQuarantines: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace,
			Name:      "node_quarantines_total",
			Help:      "Nodes the shim tainted coroner.dev/quarantined. cause: the taint's value (device, node-oom, node-pressure, node-lost).",
		}, []string{"cause"}),
		NodeQuarantinesSpared: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: Namespace,
			Name:      "node_quarantines_spared_total",
			Help:      "Nodes left untainted, though they had the deaths a quarantine takes, because --quarantine-max nodes were quarantined (once per new death).",
		}),
		NodeQuarantinesLifted: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: Namespace,
			Name:      "node_quarantines_lifted_total",
			Help:      "Quarantine taints the shim lifted after --quarantine-for without a new death blamed on the node.",
		}),
	}
	reg.MustRegister(m.Leader, leaderOnly{leading: m.leading, collectors: []prometheus.Collector{
		m.JobSyncDuration,
		m.PodsRecovered,
		m.JobsFinished,
		m.JobPodsFinished,
		m.PodFailuresHandledByFailurePolicy,
		m.JobFinishedIndexes,
		m.JobPodsCreation,
		m.TerminatedPodsTrackingFinalizer,
		m.ManagedJobs,
		m.JobMemoryGrowths,
		m.JobDeviceFailures,
		m.JobDeviceVerdictWait,
		m.JobPodsAvoidingNodes,
		m.JobDisruptionBudget,
		m.JobRecordWrites,
		m.JobRecordBytes,
		m.JobRecordEntries,
		m.NodeBlamedDeaths,
		m.NodesQuarantined,
		m.NodeQuarantines,
		m.NodeQuarantinesSpared,
		m.NodeQuarantinesLifted,
	}})
	m.SetLeader(true)
	return m
}

// SetLeader records whether this replica leads: coroner_leader is set to 1 or 0, and the
// Job metrics are served only while it leads. A nil m records nothing.
func (m *Metrics) SetLeader(leading bool) {
	if m == nil {
		return
	}
	m.leading.Store(leading)
	v := 0.0
	if leading {
		v = 1
	}
	m.Leader.Set(v)
}

// Record adds the decisions of one carried-out Plan: pod failures by action, finished
// pods and indexes, device verdicts, and the finished Job. completionMode is Indexed or NonIndexed and
// backoffLimit is BackoffLimitPerIndex or BackoffLimitGlobal (observe.Observations does
// not carry the Job's shape). Zero and negative counts are skipped. A nil m records
// nothing.
func (m *Metrics) Record(obs observe.Observations, completionMode, backoffLimit string) {
	if m == nil {
		return
	}
	for action, n := range obs.PodFailures {
		if n > 0 {
			m.PodFailuresHandledByFailurePolicy.WithLabelValues(action).Add(float64(n))
		}
	}
	for result, n := range obs.PodsFinished {
		if n > 0 {
			m.JobPodsFinished.WithLabelValues(completionMode, result).Add(float64(n))
		}
	}
	for status, n := range obs.FinishedIndexes {
		if n > 0 {
			m.JobFinishedIndexes.WithLabelValues(status, backoffLimit).Add(float64(n))
		}
	}
	if obs.MemoryGrowths > 0 {
		m.JobMemoryGrowths.WithLabelValues(completionMode).Add(float64(obs.MemoryGrowths))
	}
	for k, n := range obs.DeviceFailures {
		if n > 0 {
			m.JobDeviceFailures.WithLabelValues(k.Resource, k.Action).Add(float64(n))
		}
	}
	for _, v := range obs.DeviceVerdicts {
		m.JobDeviceVerdictWait.WithLabelValues(v.Verdict).Observe(v.Seconds)
	}
	for avoidance, n := range obs.NodeAvoidances {
		m.JobPodsAvoidingNodes.WithLabelValues(avoidance).Add(float64(n))
	}
	for k, n := range obs.BudgetVerdicts {
		verdict, class, _ := strings.Cut(k, "/")
		m.JobDisruptionBudget.WithLabelValues(class, verdict).Add(float64(n))
	}
	if f := obs.JobFinished; f != nil {
		result := Failed
		if f.Succeeded {
			result = Succeeded
		}
		m.JobsFinished.WithLabelValues(completionMode, result, f.Reason).Inc()
	}
}

// PodsCreated adds n pod creations with the given reason and status (Succeeded or
// Failed). A nil m or n <= 0 records nothing.
func (m *Metrics) PodsCreated(reason observe.CreateReason, status string, n int) {
	if m == nil || n <= 0 {
		return
	}
	m.JobPodsCreation.WithLabelValues(string(reason), status).Add(float64(n))
}
