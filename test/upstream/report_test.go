package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func TestJudge(t *testing.T) {
	pass, fail := outcome{State: "passed"}, outcome{State: "failed"}
	timedOut := outcome{State: "timedout"}
	for _, tc := range []struct {
		name             string
		builtIn, coroner outcome
		want             verdict
	}{
		{"both pass", pass, pass, same},
		{"coroner fails", pass, fail, regression},
		{"coroner times out", pass, timedOut, regression},
		{"both fail", fail, fail, bothFail},
		{"only the built-in controller fails", fail, pass, onlyBuilt},
		{"process left no report under both", outcome{State: "error"}, outcome{State: "error"}, bothFail},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := judge(tc.builtIn, tc.coroner); got != tc.want {
				t.Errorf("judge(%s, %s) = %s, want %s", tc.builtIn.State, tc.coroner.State, got, tc.want)
			}
		})
	}
}

func TestSummaryProblems(t *testing.T) {
	pass, fail := &outcome{State: "passed"}, &outcome{State: "failed", Failure: "boom"}
	s := summary{Rows: []row{
		{Spec: "[sig-apps] Job a", BuiltIn: pass, Coroner: pass},
		{Spec: "[sig-apps] Job b", BuiltIn: pass, Coroner: fail},
		{Spec: "[sig-apps] Job c", BuiltIn: fail, Coroner: fail},
		{Spec: "[sig-apps] Job d", Skipped: "why"},
		{Spec: "[sig-apps] Job e", BuiltIn: pass}, // interrupted before the coroner pass
	}}
	s.judge()
	wantVerdicts := []verdict{same, regression, bothFail, skipped, skipped}
	for i, r := range s.Rows {
		if r.Verdict != wantVerdicts[i] {
			t.Errorf("%s: verdict %s, want %s", r.Spec, r.Verdict, wantVerdicts[i])
		}
	}
	if s.Regressions != 1 {
		t.Errorf("regressions = %d, want 1", s.Regressions)
	}
	if len(s.Problems) != 2 || !strings.Contains(s.Problems[0], "coroner regression") || !strings.Contains(s.Problems[1], "not a coroner regression") {
		t.Errorf("problems = %q, want the regression, then the spec failing under both", s.Problems)
	}
}

func TestExcluded(t *testing.T) {
	for _, tc := range []struct {
		name    string
		spec    spec
		wantWhy string // a substring of the reason; "" when the spec runs
	}{
		{"conformance spec runs", spec{Name: "[sig-apps] Job should delete a job [Conformance]", Labels: []string{"Conformance"}}, ""},
		{"external controller", spec{Name: "[sig-apps] Job should allow to delegate reconciliation to external controller"}, "managedBy"},
		{"gang scheduling", spec{Name: "[sig-apps] Job should create Workload and PodGroup for gang-eligible Job [FeatureGate:GenericWorkload] [Alpha] [Feature:OffByDefault]",
			Labels: []string{"FeatureGate:GenericWorkload", "Alpha", "Feature:OffByDefault"}}, "gang"},
		{"serial", spec{Name: "[sig-apps] Job should run a job to completion with CPU requests [Serial]", Labels: []string{"Serial"}}, "90 pods"},
		{"beta gate on by default runs", spec{Name: "[sig-apps] Job should allow updating pod resources for a suspended job [FeatureGate:MutablePodResourcesForSuspendedJobs] [Beta]",
			Labels: []string{"FeatureGate:MutablePodResourcesForSuspendedJobs", "Beta"}}, ""},
		{"another gate off by default", spec{Name: "[sig-apps] Job x", Labels: []string{"Feature:OffByDefault"}}, "off by default"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := excluded(tc.spec)
			if tc.wantWhy == "" && got != "" || tc.wantWhy != "" && !strings.Contains(got, tc.wantWhy) {
				t.Errorf("excluded(%q) = %q, want %q", tc.spec.Name, got, tc.wantWhy)
			}
		})
	}
}

func TestFocusSelectsOneSpec(t *testing.T) {
	a := spec{Name: "[sig-apps] Job should run a job to completion when tasks sometimes fail and are locally restarted [Conformance]"}
	b := spec{Name: "[sig-apps] Job should run a job to completion when tasks sometimes fail and are not locally restarted"}
	re := regexp.MustCompile(a.focus())
	// What Ginkgo matches: the suite's description, a space, the spec's text.
	suite := func(name string) string { return "upstream sig-apps e2e (coroner) " + name }
	if !re.MatchString(suite(a.Name)) || re.MatchString(suite(b.Name)) || re.MatchString(suite(a.Name+" more")) {
		t.Errorf("focus %s must match %q alone", a.focus(), a.Name)
	}
}

func TestReadReport(t *testing.T) {
	// The shape of Ginkgo v2's --json-report: suite nodes beside the specs.
	const report = `[{"SuiteDescription":"x","SpecReports":[
 {"LeafNodeType":"SynchronizedBeforeSuite","State":"passed"},
 {"ContainerHierarchyTexts":["[sig-apps] Job"],"ContainerHierarchyLabels":[[]],"LeafNodeType":"It",
  "LeafNodeText":"should delete a job [Conformance]","LeafNodeLabels":["Conformance"],"State":"failed","RunTime":2500000000,
  "Failure":{"Message":"timed out\nwaiting","Location":{"FileName":"/m/test/e2e/apps/job.go","LineNumber":910}}},
 {"ContainerHierarchyTexts":["[sig-apps] Job"],"LeafNodeType":"It","LeafNodeText":"other","State":"skipped"}]}]`
	path := filepath.Join(t.TempDir(), "r.json")
	if err := os.WriteFile(path, []byte(report), 0o644); err != nil {
		t.Fatal(err)
	}
	specs, err := readReport(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(specs) != 2 {
		t.Fatalf("got %d specs, want the 2 It nodes", len(specs))
	}
	s := specs[0]
	if s.name() != "[sig-apps] Job should delete a job [Conformance]" || s.State != "failed" || s.Failure.Location.LineNumber != 910 {
		t.Errorf("spec = %+v", s)
	}
	if got := s.labels(); len(got) != 1 || got[0] != "Conformance" {
		t.Errorf("labels = %q", got)
	}
}
