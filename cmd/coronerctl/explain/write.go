package explain

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
)

// Write prints the report for people.
func (r *Report) Write(out io.Writer) error {
	w := &errWriter{w: out}
	job := r.Job
	spec := &job.Spec
	w.printf("Job %s/%s\n", job.Namespace, job.Name)
	managedBy := ptrValue(spec.ManagedBy)
	if managedBy == "" {
		managedBy = "(unset: the built-in Job controller)"
	}
	w.printf("  managedBy:   %s\n", managedBy)
	mode := "NonIndexed"
	if indexed(job) {
		mode = "Indexed"
	}
	w.printf("  mode:        %s, completions %s, parallelism %s\n", mode, intOrUnset(spec.Completions), intOrUnset(spec.Parallelism))
	var limits []string
	if spec.BackoffLimitPerIndex != nil {
		limits = append(limits, fmt.Sprintf("backoffLimitPerIndex %d", *spec.BackoffLimitPerIndex))
		if spec.MaxFailedIndexes != nil {
			limits = append(limits, fmt.Sprintf("maxFailedIndexes %d", *spec.MaxFailedIndexes))
		}
	} else {
		limits = append(limits, "backoffLimit "+intOrDefault(spec.BackoffLimit, 6))
	}
	if spec.PodReplacementPolicy != nil {
		limits = append(limits, "podReplacementPolicy "+string(*spec.PodReplacementPolicy))
	}
	w.printf("  limits:      %s\n", strings.Join(limits, ", "))
	w.printf("  status:      %s\n", jobState(job))
	st := &job.Status
	w.printf("  pods:        %d active (%s ready), %d succeeded, %d failed, %s terminating\n",
		st.Active, intOrUnset(st.Ready), st.Succeeded, st.Failed, intOrUnset(st.Terminating))
	if indexed(job) {
		w.printf("  indexes:     completed %s; failed %s\n", orNone(st.CompletedIndexes), orNone(ptrValue(st.FailedIndexes)))
	}

	if pfp := spec.PodFailurePolicy; pfp != nil && len(pfp.Rules) > 0 {
		w.printf("\nPod failure policy:\n")
		for i, rule := range pfp.Rules {
			w.printf("  rule %d: %s\n", i, describeRule(rule))
		}
	}

	w.printf("\nFailed pods (%d):\n", len(r.Failed))
	if len(r.Failed) == 0 {
		w.printf("  none\n")
	}
	for _, fp := range r.Failed {
		head := "  " + fp.Pod.Name
		if fp.Index != noIndex {
			head += fmt.Sprintf("  index %d", fp.Index)
		}
		if fp.Pod.Spec.NodeName != "" {
			head += "  node " + fp.Pod.Spec.NodeName
		}
		w.printf("%s  finished %s\n", head, stamp(fp.Finished))
		for _, l := range fp.Cause {
			w.printf("    %-11s %s\n", l.Label+":", l.Text)
		}
		w.printf("    %-11s %s\n", "rule:", fp.Rule)
		w.printf("    %-11s %s\n", "action:", fp.Action)
	}

	if indexed(job) {
		w.printf("\nIndexes:\n")
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  INDEX\tSTATE\tFAILURES\tIGNORED\tPODS")
		for _, ix := range r.Indexes {
			var pods []string
			for _, p := range ix.Pods {
				pods = append(pods, fmt.Sprintf("%s (%s)", p.Name, podState(p)))
			}
			fmt.Fprintf(tw, "  %d\t%s\t%d\t%d\t%s\n", ix.Index, ix.State, ix.Failures, ix.Ignored, orNone(strings.Join(pods, ", ")))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if c := int(ptrValue(spec.Completions)); c > maxIndexRows {
			w.printf("  (only indexes with pods or failed are listed, of %d)\n", c)
		}
	}

	if len(r.Gone) > 0 {
		w.printf("\nDecisions about pods that are gone (from the shim's Events):\n")
		for _, m := range r.Gone {
			w.printf("  %s\n", m)
		}
	}
	if len(r.Notes) > 0 {
		w.printf("\n")
		for _, n := range r.Notes {
			w.printf("Note: %s\n", n)
		}
	}
	return w.err
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

func podState(p *corev1.Pod) string {
	if p.DeletionTimestamp != nil && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
		return "Terminating"
	}
	if p.Status.Phase == "" {
		return "Pending"
	}
	return string(p.Status.Phase)
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
