package explain

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coroner-dev/coroner/conditions"
)

// jobEvents is what coroner-shim's Events on a Job say about its pods.
type jobEvents struct {
	// decisions are the PodFailurePolicy messages per pod name, oldest first.
	decisions map[string][]string
	// order is every pod name the Events mention, in order of first mention.
	order []string
	// deleted are the last states of the pods the shim deleted, per pod name (the last
	// Event about the pod wins).
	deleted map[string]conditions.DeletedPod
	// at is the time of the pod's last Event.
	at map[string]time.Time
	// other are the PodFailurePolicy messages about no single pod.
	other []string
}

// readEvents sorts the Job's Events (others are ignored) oldest first and reads them.
func readEvents(job *batchv1.Job, events []corev1.Event) *jobEvents {
	var evs []corev1.Event
	for _, e := range events {
		if e.InvolvedObject.UID == job.UID || (e.InvolvedObject.UID == "" && e.InvolvedObject.Kind == "Job" && e.InvolvedObject.Name == job.Name) {
			evs = append(evs, e)
		}
	}
	sort.SliceStable(evs, func(i, j int) bool { return eventTime(evs[i]).Before(eventTime(evs[j])) })
	je := &jobEvents{decisions: map[string][]string{}, deleted: map[string]conditions.DeletedPod{}, at: map[string]time.Time{}}
	mention := func(name string, e corev1.Event) {
		if _, seen := je.at[name]; !seen {
			je.order = append(je.order, name)
		}
		je.at[name] = eventTime(e)
	}
	for _, e := range evs {
		msg := strings.TrimPrefix(e.Message, conditions.AggregatedEventPrefix)
		switch e.Reason {
		case conditions.EventReasonPodFailurePolicy:
			ns, name, ok := conditions.PodOfDecision(msg)
			if !ok || ns != job.Namespace {
				if !ok {
					je.other = append(je.other, msg)
				}
				continue
			}
			if !slices.Contains(je.decisions[name], msg) {
				je.decisions[name] = append(je.decisions[name], msg)
			}
			mention(name, e)
		case conditions.EventReasonSuccessfulDelete:
			d, ok := conditions.ParseDeletedPodMessage(msg)
			if !ok {
				continue
			}
			je.deleted[d.Name] = d
			mention(d.Name, e)
		}
	}
	return je
}

// goneDecisions are the decision messages about pods not in live, oldest first.
func (je *jobEvents) goneDecisions(live map[string]bool) []string {
	var out []string
	for _, name := range je.order {
		if !live[name] {
			out = append(out, je.decisions[name]...)
		}
	}
	return out
}

// gonePods are the reports of the pods the Events mention that are not in live.
func (je *jobEvents) gonePods(job *batchv1.Job, live map[string]bool) []PodReport {
	var out []PodReport
	for _, name := range je.order {
		if live[name] {
			continue
		}
		pr := PodReport{Namespace: job.Namespace, Name: name, Job: job.Name, State: StateDeleted, Decisions: je.decisions[name]}
		d, deleted := je.deleted[name]
		if deleted {
			pr.Details = deletedDetails(d)
			if ix, err := strconv.Atoi(d.Index); err == nil {
				pr.Index = &ix
			}
			for _, c := range d.Containers {
				pr.Restarts += c.Restarts
			}
		}
		if pr.Index == nil && indexed(job) {
			if ix, ok := indexFromName(job, name); ok {
				pr.Index = &ix
			}
		}
		switch {
		case len(pr.Decisions) > 0:
			pr.Cause = decisionCause(pr.Decisions[len(pr.Decisions)-1])
		case deleted:
			pr.Cause = deletedCause(d)
		}
		if deleted && len(pr.Decisions) > 0 {
			pr.Details = append(pr.Details, Line{"deleted", deletedCause(d)})
		}
		if t := je.at[name]; !t.IsZero() {
			pr.Finished = &metav1.Time{Time: t}
		}
		out = append(out, pr)
	}
	return out
}

// decisionCause is the cause part of a decision message: what follows "pod ns/name: " in
// coroner's wording, the whole sentence in upstream's.
func decisionCause(msg string) string {
	if rest, ok := strings.CutPrefix(msg, conditions.PodDecisionPrefix); ok {
		if _, cause, ok := strings.Cut(rest, ": "); ok {
			return cause
		}
	}
	return msg
}

// deletedCause says in one line what a deleted pod's Event recorded: its telling exit,
// else its state, and why the shim deleted it.
func deletedCause(d conditions.DeletedPod) string {
	var what string
	for _, c := range d.Containers {
		kind := "container "
		if c.Init {
			kind = "init container "
		}
		switch {
		case c.State == "exited" && c.ExitCode != 0:
			what = kind + c.Name + " " + exitSummary(c.ExitCode, c.Reason, c.FinishedAt)
		case c.LastExit != nil && what == "":
			what = fmt.Sprintf("%s%s last %s, %d restarts, then %s", kind, c.Name, exitSummary(c.LastExit.ExitCode, c.LastExit.Reason, c.LastExit.FinishedAt), c.Restarts, containerState(c))
		case c.State == "waiting" && c.Reason != "" && what == "":
			what = kind + c.Name + " " + containerState(c)
		}
		if c.State == "exited" && c.ExitCode != 0 {
			break
		}
	}
	if what == "" {
		what = "phase " + string(d.Phase)
		if d.Phase == "" {
			what = "no last state recorded"
		}
	}
	if len(d.Conditions) > 0 {
		what += "; " + strings.Join(d.Conditions, "; ")
	}
	what += "; deleted by coroner-shim"
	if d.Why != "" {
		what += " (" + d.Why + ")"
	}
	return what
}

// deletedDetails are the lines of a deleted pod's recorded last state.
func deletedDetails(d conditions.DeletedPod) []Line {
	var out []Line
	if d.Phase != "" {
		out = append(out, Line{"last state", "phase " + string(d.Phase)})
	}
	for _, c := range d.Containers {
		kind := "container "
		if c.Init {
			kind = "init container "
		}
		text := kind + c.Name + " " + containerState(c)
		if c.LastExit != nil {
			text += ", last " + exitSummary(c.LastExit.ExitCode, c.LastExit.Reason, c.LastExit.FinishedAt)
		}
		if c.Restarts > 0 {
			text += fmt.Sprintf(", %d restarts", c.Restarts)
		}
		out = append(out, Line{"last state", text})
	}
	for _, c := range d.Conditions {
		out = append(out, Line{"condition", c})
	}
	return out
}

func containerState(c conditions.DeletedContainer) string {
	switch c.State {
	case "exited":
		return exitSummary(c.ExitCode, c.Reason, c.FinishedAt)
	case "waiting":
		if c.Reason != "" {
			return "waiting (" + c.Reason + ")"
		}
		return "waiting"
	}
	return c.State
}

func exitSummary(code int32, reason string, at time.Time) string {
	return exitText(&corev1.ContainerStateTerminated{ExitCode: code, Reason: reason, FinishedAt: metav1.Time{Time: at}})
}

// indexFromName reads the index of a pod named <job>-<index>-<suffix>, as the Job
// controllers name the pods of Indexed Jobs.
func indexFromName(job *batchv1.Job, name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, job.Name+"-")
	if !ok {
		return 0, false
	}
	v, _, ok := strings.Cut(rest, "-")
	if !ok {
		return 0, false
	}
	ix, err := strconv.Atoi(v)
	if err != nil || ix < 0 || (job.Spec.Completions != nil && ix >= int(*job.Spec.Completions)) {
		return 0, false
	}
	return ix, true
}

func eventTime(e corev1.Event) time.Time {
	switch {
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	}
	return e.CreationTimestamp.Time
}
