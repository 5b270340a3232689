package explain

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/coroner-dev/coroner/api/v1alpha1"
)

// Write prints the report for people.
func (r *Report) Write(out io.Writer) error {
	w := &errWriter{w: out}
	js := &r.Job
	w.printf("Job %s/%s\n", js.Namespace, js.Name)
	managedBy := js.ManagedBy
	if managedBy == "" {
		managedBy = "(unset: the built-in Job controller)"
	}
	w.printf("  managedBy:   %s\n", managedBy)
	w.printf("  mode:        %s, completions %s, parallelism %s\n", js.Mode, intOrUnset(js.Completions), intOrUnset(js.Parallelism))
	var limits []string
	if js.BackoffLimitPerIndex != nil {
		limits = append(limits, fmt.Sprintf("backoffLimitPerIndex %d", *js.BackoffLimitPerIndex))
		if js.MaxFailedIndexes != nil {
			limits = append(limits, fmt.Sprintf("maxFailedIndexes %d", *js.MaxFailedIndexes))
		}
	} else {
		limits = append(limits, "backoffLimit "+intOrDefault(js.BackoffLimit, 6))
	}
	if js.PodReplacementPolicy != "" {
		limits = append(limits, "podReplacementPolicy "+js.PodReplacementPolicy)
	}
	w.printf("  limits:      %s\n", strings.Join(limits, ", "))
	w.printf("  status:      %s\n", js.State)
	w.printf("  pods:        %d active (%s ready), %d succeeded, %d failed, %s terminating\n",
		js.Active, intOrUnset(js.Ready), js.Succeeded, js.Failed, intOrUnset(js.Terminating))
	if js.Mode == "Indexed" {
		w.printf("  indexes:     completed %s; failed %s\n", orNone(js.CompletedIndexes), orNone(js.FailedIndexes))
	}

	if len(r.Rules) > 0 {
		w.printf("\nPod failure policy:\n")
		for _, rule := range r.Rules {
			w.printf("  %s\n", rule)
		}
	}

	var failed, deleted, other []PodReport
	plain := map[PodState]int{}
	for _, p := range r.Pods {
		switch {
		case p.State == StateFailed:
			failed = append(failed, p)
		case p.State == StateDeleted:
			deleted = append(deleted, p)
		case (p.State == StateSucceeded || p.State == StateRunning) && len(p.Warnings) == 0 && p.Restarts == 0:
			plain[p.State]++
		default:
			other = append(other, p)
		}
	}
	sort.SliceStable(failed, func(i, j int) bool { return failed[i].Finished.Before(failed[j].Finished) })

	w.printf("\nFailed pods (%d):\n", len(failed))
	if len(failed) == 0 {
		w.printf("  none\n")
	}
	for _, p := range failed {
		w.printf("%s  finished %s\n", podHead(p), stamp(p.Finished.Time))
		writeLines(w, p.Details)
		w.printf("    %-11s %s\n", "rule:", p.Rule)
		w.printf("    %-11s %s\n", "action:", p.Action)
		for _, d := range p.Decisions {
			w.printf("    %-11s %s\n", "recorded:", d)
		}
	}

	if len(deleted) > 0 {
		// What coroner-shim recorded of them (JobRecord). Those that succeeded are
		// counted, not listed (-o json lists them).
		var told []PodReport
		succeeded := 0
		for _, p := range deleted {
			if p.entry != nil && p.entry.Outcome == v1alpha1.OutcomeSucceeded {
				succeeded++
				continue
			}
			told = append(told, p)
		}
		w.printf("\nPods that are gone (%d, from coroner-shim's record):\n", len(deleted))
		for _, p := range told {
			w.printf("%s\n", podHead(p))
			w.printf("    %-11s %s\n", "cause:", p.Cause)
			writeLines(w, p.Details)
			if p.Rule != "" {
				w.printf("    %-11s %s\n", "rule:", p.Rule)
				w.printf("    %-11s %s\n", "action:", p.Action)
			}
		}
		if succeeded > 0 {
			w.printf("  and %d that succeeded\n", succeeded)
		}
	}

	if len(other) > 0 || len(plain) > 0 {
		w.printf("\nOther pods (%d):\n", len(other)+plain[StateRunning]+plain[StateSucceeded])
		for _, p := range other {
			w.printf("%s  %s: %s\n", podHead(p), p.State, p.Cause)
			for _, warn := range p.Warnings {
				w.printf("    %-11s %s\n", "WARNING:", warn)
			}
			for _, l := range p.Details {
				if l.Label == "history" || l.Label == "last exit" || l.Label == "oom" || l.Label == "disruption" || l.Label == "avoids" {
					w.printf("    %-11s %s\n", l.Label+":", l.Text)
				}
			}
		}
		var counts []string
		for _, st := range []PodState{StateRunning, StateSucceeded} {
			if n := plain[st]; n > 0 {
				counts = append(counts, fmt.Sprintf("%d %s", n, strings.ToLower(string(st))))
			}
		}
		if len(counts) > 0 {
			and := ""
			if len(other) > 0 {
				and = "and "
			}
			w.printf("  %s%s without restarts or warnings\n", and, strings.Join(counts, ", "))
		}
	}

	if len(r.Indexes) > 0 {
		w.printf("\nIndexes:\n")
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		ladder := slices.ContainsFunc(r.Indexes, func(ix IndexState) bool { return ix.Memory != "" })
		if ladder {
			fmt.Fprintln(tw, "  INDEX\tSTATE\tFAILURES\tIGNORED\tMEMORY\tPODS")
		} else {
			fmt.Fprintln(tw, "  INDEX\tSTATE\tFAILURES\tIGNORED\tPODS")
		}
		for _, ix := range r.Indexes {
			if ladder {
				fmt.Fprintf(tw, "  %d\t%s\t%d\t%d\t%s\t%s\n", ix.Index, ix.State, ix.Failures, ix.Ignored, orNone(ix.Memory), orNone(strings.Join(ix.Pods, ", ")))
				continue
			}
			fmt.Fprintf(tw, "  %d\t%s\t%d\t%d\t%s\n", ix.Index, ix.State, ix.Failures, ix.Ignored, orNone(strings.Join(ix.Pods, ", ")))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if c := int(ptrValue(js.Completions)); c > maxIndexRows {
			w.printf("  (only indexes with pods or failed are listed, of %d)\n", c)
		}
	}

	if r.NodeBlame != nil {
		writeNodeBlame(w, r.NodeBlame)
	}

	if len(r.Notes) > 0 {
		w.printf("\n")
		for _, n := range r.Notes {
			w.printf("Note: %s\n", n)
		}
	}
	return w.err
}

// WritePod prints one pod's report for people.
func (p *PodReport) Write(out io.Writer) error {
	w := &errWriter{w: out}
	w.printf("Pod %s/%s\n", p.Namespace, p.Name)
	if p.Job != "" {
		w.printf("  %-11s %s\n", "job:", p.Job)
	}
	if p.Index != nil {
		w.printf("  %-11s %d\n", "index:", *p.Index)
	}
	if p.Node != "" {
		w.printf("  %-11s %s\n", "node:", p.Node)
	}
	w.printf("  %-11s %s\n", "state:", p.State)
	w.printf("  %-11s %s\n", "cause:", p.Cause)
	if p.Finished != nil {
		w.printf("  %-11s %s\n", "finished:", stamp(p.Finished.Time))
	}
	for _, warn := range p.Warnings {
		w.printf("  %-11s %s\n", "WARNING:", warn)
	}
	for _, l := range p.Details {
		w.printf("  %-11s %s\n", l.Label+":", l.Text)
	}
	if p.Rule != "" {
		w.printf("  %-11s %s\n", "rule:", p.Rule)
		w.printf("  %-11s %s\n", "action:", p.Action)
	}
	for _, d := range p.Decisions {
		w.printf("  %-11s %s\n", "recorded:", d)
	}
	return w.err
}

func podHead(p PodReport) string {
	head := "  " + p.Name
	if p.Index != nil {
		head += fmt.Sprintf("  index %d", *p.Index)
	}
	if p.Node != "" {
		head += "  node " + p.Node
	}
	return head
}

func writeLines(w *errWriter, lines []Line) {
	for _, l := range lines {
		w.printf("    %-11s %s\n", l.Label+":", l.Text)
	}
}

func describeRule(rule batchv1.PodFailurePolicyRule) string {
	switch {
	case rule.OnExitCodes != nil:
		req := rule.OnExitCodes
		var vals []string
		for _, v := range req.Values {
			vals = append(vals, fmt.Sprint(v))
		}
		s := fmt.Sprintf("%s on exit codes %s [%s]", rule.Action, req.Operator, strings.Join(vals, ","))
		if req.ContainerName != nil {
			s += " of container " + *req.ContainerName
		}
		return s
	case len(rule.OnPodConditions) > 0:
		var conds []string
		for _, c := range rule.OnPodConditions {
			status := c.Status
			if status == "" {
				status = corev1.ConditionTrue
			}
			conds = append(conds, fmt.Sprintf("%s=%s", c.Type, status))
		}
		return fmt.Sprintf("%s on pod conditions %s", rule.Action, strings.Join(conds, ", "))
	}
	return fmt.Sprintf("%s (no requirement: never matches)", rule.Action)
}

// jobState is the Job's most telling condition.
func jobState(job *batchv1.Job) string {
	for _, t := range []batchv1.JobConditionType{batchv1.JobFailed, batchv1.JobComplete, batchv1.JobFailureTarget,
		batchv1.JobSuccessCriteriaMet, batchv1.JobSuspended} {
		for _, c := range job.Status.Conditions {
			if c.Type == t && c.Status == corev1.ConditionTrue {
				s := string(t)
				if c.Reason != "" {
					s += " (" + c.Reason
					if c.Message != "" {
						s += ": " + oneLine(c.Message)
					}
					s += ")"
				}
				return s
			}
		}
	}
	if job.Status.StartTime == nil {
		return "not started"
	}
	return "running"
}

func intOrUnset(p *int32) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprint(*p)
}

func intOrDefault(p *int32, def int32) string {
	if p == nil {
		return fmt.Sprint(def)
	}
	return fmt.Sprint(*p)
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// errWriter keeps the first write error.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	e.err = err
	return n, err
}

func (e *errWriter) printf(format string, args ...any) {
	fmt.Fprintf(e, format, args...)
}
