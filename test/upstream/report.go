package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// verdict is what a spec's two outcomes say about coroner.
type verdict string

const (
	same       verdict = "ok"         // passed under both controllers
	regression verdict = "REGRESSION" // passed under the built-in controller, not under coroner
	bothFail   verdict = "FAILS-BOTH" // failed under both: the lab, the spec or a flake, not coroner
	onlyBuilt  verdict = "BUILTIN-FAILS"
	skipped    verdict = "skipped" // cannot apply (reason given) or not run
)

// judge compares a spec's outcome under the built-in controller with coroner's.
func judge(builtIn, coroner outcome) verdict {
	switch {
	case builtIn.passed() && coroner.passed():
		return same
	case builtIn.passed():
		return regression
	case coroner.passed():
		return onlyBuilt
	default:
		return bothFail
	}
}

// row is one spec of the table.
type row struct {
	Spec    string   `json:"spec"`
	Labels  []string `json:"labels,omitempty"`
	Skipped string   `json:"skipped,omitempty"`
	BuiltIn *outcome `json:"builtIn,omitempty"`
	Coroner *outcome `json:"coroner,omitempty"`
	Verdict verdict  `json:"verdict"`
}

// summary is the run's result: the table, the Job census of each pass, and why it fails.
type summary struct {
	Seed        int                  `json:"seed"`
	Parallel    int                  `json:"parallel"`
	Timeout     string               `json:"specTimeout"`
	Rows        []row                `json:"specs"`
	Census      map[string]jobCensus `json:"jobs"`
	Passes      map[string]string    `json:"passTook"`
	Took        string               `json:"took"`
	Problems    []string             `json:"problems,omitempty"`
	Regressions int                  `json:"regressions"`
}

// problems are the reasons the run fails: coroner regressions first, then specs the
// built-in controller failed (a comparison with a broken baseline says nothing: a flake
// or the lab, to be found), then what kept a pass from being what it claims.
func (s *summary) judge() {
	for i := range s.Rows {
		r := &s.Rows[i]
		if r.Skipped != "" || r.BuiltIn == nil || r.Coroner == nil {
			r.Verdict = skipped
			continue
		}
		r.Verdict = judge(*r.BuiltIn, *r.Coroner)
		switch r.Verdict {
		case regression:
			s.Regressions++
			s.Problems = append(s.Problems, fmt.Sprintf("coroner regression: %q passes under the built-in controller, %s under coroner: %s", r.Spec, r.Coroner.State, r.Coroner.Failure))
		case bothFail:
			s.Problems = append(s.Problems, fmt.Sprintf("fails under both controllers (not a coroner regression: the lab or a flake, find out why): %q: built-in %s: %s", r.Spec, r.BuiltIn.State, r.BuiltIn.Failure))
		case onlyBuilt:
			s.Problems = append(s.Problems, fmt.Sprintf("fails under the built-in controller only (a flake or the lab, find out why): %q: %s", r.Spec, r.BuiltIn.Failure))
		}
	}
}

// printTable writes the table: spec -> built-in / coroner, then the skipped specs with
// their reasons, the Job census and the problems.
func (s summary) printTable(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "spec\tbuilt-in\tcoroner\tverdict")
	var skippedRows []row
	for _, r := range s.Rows {
		if r.Skipped != "" {
			skippedRows = append(skippedRows, r)
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", short(r.Spec), cell(r.BuiltIn), cell(r.Coroner), r.Verdict)
	}
	tw.Flush()
	if len(skippedRows) > 0 {
		fmt.Fprintf(w, "\nnot run (cannot apply on the lab):\n")
		for _, r := range skippedRows {
			fmt.Fprintf(w, "  - %s\n      %s\n", short(r.Spec), r.Skipped)
		}
	}
	fmt.Fprintf(w, "\nJobs in the e2e namespaces, by spec.managedBy:")
	for _, pass := range []string{"built-in", "coroner"} {
		c := s.Census[pass]
		fmt.Fprintf(w, " %s pass %d (%s);", pass, c.Total, managedByCounts(c))
	}
	fmt.Fprintf(w, "\nseed %d, %d specs at a time, %s per spec; passes: built-in %s, coroner %s; %s in all\n",
		s.Seed, s.Parallel, s.Timeout, s.Passes["built-in"], s.Passes["coroner"], s.Took)
	for _, p := range s.Problems {
		fmt.Fprintf(w, "PROBLEM: %s\n", p)
	}
}

func managedByCounts(c jobCensus) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(c.ManagedBy)) {
		name := k
		if name == "" {
			name = "unset"
		}
		parts = append(parts, fmt.Sprintf("%s: %d", name, c.ManagedBy[k]))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

func cell(o *outcome) string {
	if o == nil {
		return "-"
	}
	return fmt.Sprintf("%s %s", o.State, o.Took.Round(time.Second))
}

// short drops the common prefix of the Job specs' names.
func short(name string) string { return strings.TrimPrefix(name, "[sig-apps] Job ") }
