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
	// NodeBlame is, for a Job with coroner.dev/avoid-failed-nodes or
	// coroner.dev/disruption-budget (or pods coroner-shim marked with either), the nodes
	// its replacements avoid and why, and what its disruption budget has spent.
	NodeBlame *NodeBlameReport `json:"nodeBlame,omitempty"`
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

// NodeBlameReport is a Job's node-blame story (docs/explain.md, "When a node keeps
// killing pods").
type NodeBlameReport struct {
	// Avoidance is the Job's coroner.dev/avoid-failed-nodes (preferred, required, none);
	// empty when it has none, or one that does not parse: coroner-shim's
	// --avoid-failed-nodes then decides.
	Avoidance string `json:"avoidance,omitempty"`
	// Budget is the Job's coroner.dev/disruption-budget as written; empty when it has
	// none, or one that does not parse.
	Budget string `json:"budget,omitempty"`
	// Problems are the Job's annotations that do not parse, and what the shim does instead.
	Problems []string `json:"problems,omitempty"`
	// Groups are the indexes of an Indexed Job that have something to say (a node
	// blamed, a failure charged, a budget spent, a pod that cannot be scheduled), or the
	// Job as one group.
	Groups []BlameGroup `json:"groups,omitempty"`
}

// BlameGroup is one index (Index set), or a NonIndexed Job.
type BlameGroup struct {
	Index *int `json:"index,omitempty"`
	// Pod is the newest existing pod, whose coroner.dev/avoided-nodes is what the index
	// avoids now.
	Pod string `json:"pod,omitempty"`
	// Nodes are the nodes the newest pod avoids (oldest first), then those a death
	// blamed that it does not carry.
	Nodes []AvoidedNodeReport `json:"nodes,omitempty"`
	// Budgets are the classes the budget names, each with what it spent.
	Budgets []BudgetUse `json:"budgets,omitempty"`
	// Unschedulable says, for each pending pod that avoids nodes and that the scheduler
	// found no node for, "POD cannot be scheduled: it avoids nodes a, b
	// (avoid-failed-nodes: required); scheduler: MESSAGE".
	Unschedulable []string `json:"unschedulable,omitempty"`
}

// AvoidedNodeReport is a node that a death blamed.
type AvoidedNodeReport struct {
	Node string `json:"node"`
	// Class is the disruption class of the (latest) death that blamed it.
	Class string `json:"class"`
	// Pods are the pods of the group, existing or recorded, whose death blamed the node.
	Pods []string `json:"pods,omitempty"`
	// Avoided: the newest pod carries it in coroner.dev/avoided-nodes.
	Avoided bool `json:"avoided"`
}

// BudgetUse is what a disruption budget's class spent in a group.
type BudgetUse struct {
	Class string `json:"class"`
	// Charged counts the failures an Ignore rule ignored within the budget; Limit is the
	// budget.
	Charged int `json:"charged"`
	Limit   int `json:"limit"`
	// Spent: the next failure of the class counts (Charged reached Limit), or one did.
	Spent bool `json:"spent"`
	// Counted are the failed pods that counted because the budget was spent.
	Counted []string `json:"counted,omitempty"`
}

// DeepCopy copies the report.
func (nb *NodeBlameReport) DeepCopy() *NodeBlameReport {
	if nb == nil {
		return nil
	}
	c := *nb
	c.Problems = slices.Clone(nb.Problems)
	c.Groups = slices.Clone(nb.Groups)
	for i := range c.Groups {
		g := &c.Groups[i]
		if g.Index != nil {
			g.Index = ptrTo(*g.Index)
		}
		g.Nodes, g.Budgets, g.Unschedulable = slices.Clone(g.Nodes), slices.Clone(g.Budgets), slices.Clone(g.Unschedulable)
		for j := range g.Nodes {
			g.Nodes[j].Pods = slices.Clone(g.Nodes[j].Pods)
		}
		for j := range g.Budgets {
			g.Budgets[j].Counted = slices.Clone(g.Budgets[j].Counted)
		}
	}
	return &c
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
	c.NodeBlame = r.NodeBlame.DeepCopy()
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
