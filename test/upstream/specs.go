package main

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"
)

// spec is one "[sig-apps] Job" spec of upstream's e2e suite, as Ginkgo lists it.
type spec struct {
	// Name is the full text Ginkgo matches --ginkgo.focus against: "[sig-apps] Job should
	// ...", with the framework's bracketed tags ([Conformance], [Serial], ...) in it.
	Name   string
	Labels []string
}

// focus is the --ginkgo.focus that selects this spec alone. Ginkgo matches it against the
// suite's description, a space and the spec's text: the name must end the string.
func (s spec) focus() string { return "(^| )" + regexp.QuoteMeta(s.Name) + "$" }

// exclusion is a spec that cannot say anything about coroner on the lab, and why.
type exclusion struct {
	// leaf is a substring of the spec's text, or empty to match by label.
	leaf string
	// label matches a Ginkgo label of the spec, when leaf is empty.
	label  string
	reason string
}

// exclusions are read from test/e2e/apps/job.go of k8s.io/kubernetes v1.36.3. Each one is
// listed in the table with its reason and run in neither pass; a spec that no rule names
// runs in both.
var exclusions = []exclusion{
	{
		leaf: "should allow to delegate reconciliation to external controller",
		reason: "sets its own spec.managedBy (example.com/custom-job-controller): the opt-in leaves " +
			"such a Job alone, so both passes would test the built-in controller",
	},
	{
		leaf: "should create Workload and PodGroup for gang-eligible Job",
		reason: "alpha gang scheduling (GenericWorkload, WorkloadWithJob: off by default, not enabled on " +
			"the lab): asserts scheduling.k8s.io/v1alpha2 Workload and PodGroup objects that only the " +
			"built-in controller makes",
	},
	{
		label: "Serial",
		reason: "[Serial]: 90 pods at once on one node (parallelism 90, each requesting a fifth of the " +
			"node's CPU), alone in the cluster; the lab's nodes share the machine's 2 cores",
	},
	{
		label:  "Feature:OffByDefault",
		reason: "needs a feature gate that is off by default, and the lab enables none",
	},
	{
		label:  "Disruptive",
		reason: "[Disruptive]: restarts or breaks cluster components",
	},
}

// excluded says why s cannot run on the lab, or "" when it runs.
func excluded(s spec) string {
	for _, e := range exclusions {
		if e.leaf != "" && strings.Contains(s.Name, e.leaf) {
			return e.reason
		}
		if e.leaf == "" && slices.Contains(s.Labels, e.label) {
			return e.reason
		}
	}
	return ""
}

// ginkgoReport is the part of Ginkgo's --ginkgo.json-report (a list of
// github.com/onsi/ginkgo/v2/types.Report) the runner reads.
type ginkgoReport struct {
	SpecReports []ginkgoSpecReport
}

type ginkgoSpecReport struct {
	ContainerHierarchyTexts  []string
	ContainerHierarchyLabels [][]string
	LeafNodeType             string
	LeafNodeText             string
	LeafNodeLabels           []string
	State                    string
	RunTime                  time.Duration
	Failure                  *struct {
		Message  string
		Location struct {
			FileName   string
			LineNumber int
		}
	}
}

func (r ginkgoSpecReport) name() string {
	return strings.Join(append(slices.Clone(r.ContainerHierarchyTexts), r.LeafNodeText), " ")
}

func (r ginkgoSpecReport) labels() []string {
	var l []string
	for _, c := range r.ContainerHierarchyLabels {
		l = append(l, c...)
	}
	return append(l, r.LeafNodeLabels...)
}

// readReport reads a --ginkgo.json-report file and returns its specs (It nodes), in order.
func readReport(path string) ([]ginkgoSpecReport, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var reports []ginkgoReport
	if err := json.Unmarshal(b, &reports); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var specs []ginkgoSpecReport
	for _, r := range reports {
		for _, s := range r.SpecReports {
			if s.LeafNodeType == "It" {
				specs = append(specs, s)
			}
		}
	}
	return specs, nil
}
