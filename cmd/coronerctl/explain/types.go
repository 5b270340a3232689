package explain

import (
	"maps"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/coroner-dev/coroner/api/v1alpha1"
)

// The documented output of `explain -o json|yaml`. Fields are only ever added; a change
// of meaning gets a new APIVersion. (One field went: goneDecisions, the decisions explain
// read from Events, left empty and so never printed since explain read JobRecords.)
const (
	// APIVersion is the apiVersion of the reports.
	APIVersion = "coroner.dev/v1alpha1"
	// KindJobReport is the kind of a Job's report, KindPodReport that of one pod's.
	KindJobReport = "JobReport"
	KindPodReport = "PodReport"
)

// PodState is the state explain gives a pod.
type PodState string

const (
	// StatePending: not scheduled yet, or its containers are being created.
	StatePending PodState = "Pending"
	// StateWaiting: a container cannot start (ErrImageNeverPull, ImagePullBackOff,
	// CreateContainerConfigError, ...): the pod is not running although its phase may say
	// Pending or Running.
	StateWaiting PodState = "Waiting"
	// StateRunning: every container started runs.
	StateRunning PodState = "Running"
	// StateRestarting: a container was restarted in place (restartPolicy OnFailure or
	// Always) or is crash-looping; the exits are in the details (the agent's
	// coroner.dev/exit-history annotation and the kubelet's last state).
	StateRestarting PodState = "Restarting"
	// StateTerminating: being deleted, not finished.
	StateTerminating PodState = "Terminating"
	StateSucceeded   PodState = "Succeeded"
	StateFailed      PodState = "Failed"
	// StateDeleted: the pod is gone; what is known of it comes from coroner-shim's record
	// of the Job (JobRecord: its last phase and cause, the decision, why the shim deleted
	// it).
	StateDeleted PodState = "Deleted"
)

// Report is what explain says about one Job (kind JobReport).
type Report struct {
	metav1.TypeMeta `json:",inline"`
	Job             JobSummary `json:"job"`
	// Rules are the Job's podFailurePolicy rules, described.
	Rules []string `json:"rules,omitempty"`
	// Pods are every pod of the Job, the existing ones (oldest first) then those only
	// coroner-shim's record remembers (StateDeleted), oldest recorded first. Each has a
	// cause.
	Pods []PodReport `json:"pods"`
	// Indexes is the per-index state of an Indexed Job.
	Indexes []IndexState `json:"indexes,omitempty"`
	// Record says what explain had of coroner-shim's record of the Job.
	Record RecordState `json:"record"`
	// Notes are remarks about the report itself.
	Notes []string `json:"notes,omitempty"`

	job *batchv1.Job
}

// JobSummary is the Job's spec and status in short.
type JobSummary struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// ManagedBy is spec.managedBy; empty for the built-in Job controller.
	ManagedBy string `json:"managedBy,omitempty"`
	// Mode is Indexed or NonIndexed.
	Mode                 string `json:"mode"`
	Completions          *int32 `json:"completions,omitempty"`
	Parallelism          *int32 `json:"parallelism,omitempty"`
	BackoffLimit         *int32 `json:"backoffLimit,omitempty"`
	BackoffLimitPerIndex *int32 `json:"backoffLimitPerIndex,omitempty"`
	MaxFailedIndexes     *int32 `json:"maxFailedIndexes,omitempty"`
	PodReplacementPolicy string `json:"podReplacementPolicy,omitempty"`
	// State is the Job's most telling condition ("Failed (BackoffLimitExceeded: ...)"),
	// else "running" or "not started".
	State            string `json:"state"`
	Active           int32  `json:"active"`
	Ready            *int32 `json:"ready,omitempty"`
	Succeeded        int32  `json:"succeeded"`
	Failed           int32  `json:"failed"`
	Terminating      *int32 `json:"terminating,omitempty"`
	CompletedIndexes string `json:"completedIndexes,omitempty"`
	FailedIndexes    string `json:"failedIndexes,omitempty"`
}

// PodReport is one pod: its state and why (kind PodReport when printed alone).
type PodReport struct {
	metav1.TypeMeta `json:",inline"`
	Namespace       string `json:"namespace"`
	Name            string `json:"name"`
	// Job is the name of the Job that controls the pod, if any.
	Job string `json:"job,omitempty"`
	// Index is the completion index (Indexed Jobs).
	Index *int     `json:"index,omitempty"`
	Node  string   `json:"node,omitempty"`
	State PodState `json:"state"`
	// Cause says in one line why the pod is in its state: how it died, why it waits,
	// what it restarted from.
	Cause string `json:"cause"`
	// Finished is when a finished pod's last container exited.
	Finished *metav1.Time `json:"finished,omitempty"`
	// Restarts is the sum of the containers' restart counts.
	Restarts int32 `json:"restarts,omitempty"`
	// Details are labelled lines (exit, oom, disruption, recovery, pod, history,
	// waiting, deleted, ...) in print order.
	Details []Line `json:"details,omitempty"`
	// Rule is the podFailurePolicy rule that matches a failed pod ("no rule matched",
	// "rule 0 (FailJob): container main exit code 42"), Action what it did to the Job.
	Rule   string `json:"rule,omitempty"`
	Action string `json:"action,omitempty"`
	// Decisions are what coroner-shim recorded deciding about a pod that still exists
	// (its outcome, rule and consequence), from the Job's record.
	Decisions []string `json:"decisions,omitempty"`
	// Warnings are what the reader must not miss, such as a Succeeded pod with an OOM kill.
	Warnings []string `json:"warnings,omitempty"`

	pod   *corev1.Pod
	entry *v1alpha1.Entry
}

// Line is a labelled line of a report.
type Line struct {
	Label string `json:"label"`
	Text  string `json:"text"`
}

// IndexState is one completion index of an Indexed Job.
type IndexState struct {
	Index int `json:"index"`
	// State is, in this order of precedence: completed (in status.completedIndexes),
	// failed (in status.failedIndexes), active (a pod of it runs or waits to), terminating
	// (its only pods are being deleted), then for an index with none of these, by the
	// Job's state: "unfinished: the Job failed (REASON)" (conditions Failed or
	// FailureTarget: it will never complete, whether or not it ran), "not needed: the Job
	// succeeded (REASON)" (Complete or SuccessCriteriaMet, as a successPolicy allows),
	// suspended (the Job is suspended), or pending (the Job runs: it waits for a pod).
	State string `json:"state"`
	// Failures counts the index's failures that count towards backoffLimitPerIndex,
	// Ignored those an Ignore rule matched, from the pods' annotations plus the pods'
	// own failures.
	Failures int32 `json:"failures"`
	Ignored  int32 `json:"ignored"`
	// Pods are "name (phase)" of the index's existing pods.
	Pods []string `json:"pods,omitempty"`
	// Memory is, for a Job with coroner.dev/oom-memory-retry whose index grew, the memory
	// its pods were given, smallest first: "main=24Mi -> main=48Mi".
	Memory string `json:"memory,omitempty"`
}

// List holds several reports (kind List, as kubectl's).
type List struct {
	metav1.TypeMeta `json:",inline"`
	Items           []runtime.Object `json:"items"`
}

func typeMeta(kind string) metav1.TypeMeta {
	return metav1.TypeMeta{APIVersion: APIVersion, Kind: kind}
}

func newList(items []runtime.Object) *List {
	return &List{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "List"}, Items: items}
}

// DeepCopyObject makes Report a runtime.Object, for cli-runtime's printers.
func (r *Report) DeepCopyObject() runtime.Object {
	c := *r
	c.Rules, c.Notes = slices.Clone(r.Rules), slices.Clone(r.Notes)
	c.Record.Dropped = maps.Clone(r.Record.Dropped)
	c.Pods = make([]PodReport, len(r.Pods))
	for i := range r.Pods {
		c.Pods[i] = *r.Pods[i].DeepCopyObject().(*PodReport)
	}
	c.Indexes = slices.Clone(r.Indexes)
	for i := range c.Indexes {
		c.Indexes[i].Pods = slices.Clone(c.Indexes[i].Pods)
	}
	return &c
}

// DeepCopyObject makes PodReport a runtime.Object.
func (p *PodReport) DeepCopyObject() runtime.Object {
	c := *p
	if p.Index != nil {
		ix := *p.Index
		c.Index = &ix
	}
	if p.Finished != nil {
		c.Finished = p.Finished.DeepCopy()
	}
	c.Details, c.Decisions, c.Warnings = slices.Clone(p.Details), slices.Clone(p.Decisions), slices.Clone(p.Warnings)
	return &c
}

// DeepCopyObject makes List a runtime.Object.
func (l *List) DeepCopyObject() runtime.Object {
	c := &List{TypeMeta: l.TypeMeta}
	for _, it := range l.Items {
		c.Items = append(c.Items, it.DeepCopyObject())
	}
	return c
}

var _ schema.ObjectKind = &metav1.TypeMeta{}
