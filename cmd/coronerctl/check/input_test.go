package check

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/coroner-dev/coroner/conditions"
)

// kubectlList is what `kubectl get jobs -o yaml` prints: a v1 List of Jobs with their
// server-set fields and status, here with a ConfigMap slipped in.
const kubectlList = `apiVersion: v1
kind: List
metadata:
  resourceVersion: ""
items:
- apiVersion: batch/v1
  kind: Job
  metadata:
    creationTimestamp: "2026-01-02T03:04:05Z"
    generation: 1
    labels: {batch.kubernetes.io/job-name: train}
    name: train
    namespace: ml
    resourceVersion: "1234"
    uid: 0b7c6ad2-3c83-4a8c-9b5c-1f2e3d4c5b6a
  spec:
    backoffLimit: 6
    completionMode: NonIndexed
    completions: 1
    manualSelector: false
    managedBy: coroner.dev/shim
    parallelism: 1
    activeDeadlineSeconds: 600
    podReplacementPolicy: TerminatingOrFailed
    selector:
      matchLabels: {batch.kubernetes.io/controller-uid: 0b7c6ad2-3c83-4a8c-9b5c-1f2e3d4c5b6a}
    suspend: false
    template:
      metadata:
        creationTimestamp: null
        labels: {batch.kubernetes.io/controller-uid: 0b7c6ad2-3c83-4a8c-9b5c-1f2e3d4c5b6a, batch.kubernetes.io/job-name: train}
      spec:
        containers:
        - {name: main, image: busybox, imagePullPolicy: Always, resources: {}, terminationMessagePath: /dev/termination-log, terminationMessagePolicy: File}
        dnsPolicy: ClusterFirst
        restartPolicy: Never
        schedulerName: default-scheduler
        securityContext: {}
        terminationGracePeriodSeconds: 30
  status:
    active: 1
    ready: 0
    startTime: "2026-01-02T03:04:05Z"
    terminating: 0
    uncountedTerminatedPods: {}
- apiVersion: v1
  kind: ConfigMap
  metadata: {name: settings}
- apiVersion: batch/v1
  kind: Job
  metadata: {name: typo, namespace: ml}
  spec:
    managedBy: coroner.dev/shim
    activeDeadlineSeconds: 600
    podFailurePolicy:
      rules:
      - action: FailJob
        onPodConditions: [{type: coroner.dev/OOMKiled}]
    template:
      spec:
        restartPolicy: Never
        containers: [{name: main, image: busybox}]
`

// jobList is a JobList as the API returns it: the items have no kind.
const jobList = `{"apiVersion": "batch/v1", "kind": "JobList", "items": [
  {"metadata": {"name": "raw"}, "spec": {"managedBy": "coroner.dev/shim", "activeDeadlineSeconds": 60,
   "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox"}]}}}}
]}`

func TestManifestLists(t *testing.T) {
	cases := []struct {
		name  string
		input string
		// want is "source | object | findings joined by \n" per result.
		want []string
	}{
		{
			name:  "kubectl get -o yaml",
			input: kubectlList,
			want: []string{
				"m.yaml (item 1) | Job ml/train | ",
				"m.yaml (item 3) | Job ml/typo | warning: spec.podFailurePolicy.rules[0].onPodConditions[0].type: unknown condition type \"coroner.dev/OOMKiled\" (no such condition type), the rule never matches: did you mean coroner.dev/OOMKilled?",
			},
		},
		{
			name:  "a JobList whose items have no kind",
			input: jobList,
			want:  []string{"m.yaml (item 1) | Job raw | "},
		},
		{
			name:  "a List among other documents",
			input: "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n---\n" + jobList,
			want:  []string{"m.yaml (document 2, item 1) | Job raw | "},
		},
		{
			name:  "an empty List",
			input: "apiVersion: v1\nkind: List\nitems: []\n",
		},
		{
			name:  "an unknown field in an item",
			input: strings.Replace(jobList, `"activeDeadlineSeconds"`, `"activeDeadline"`, 1),
			want:  []string{`m.yaml (item 1) | Job raw | error: spec.activeDeadline: unknown field`},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			results, err := Manifest(strings.NewReader(tc.input), "m.yaml", conditions.ManagedBy)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, r := range results {
				var fs []string
				for _, f := range r.Findings {
					fs = append(fs, f.String())
				}
				got = append(got, r.Source+" | "+r.Object+" | "+strings.Join(fs, "\n"))
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %d results %q, want %q", len(got), got, tc.want)
			}
			for i := range got {
				if !strings.HasPrefix(got[i], tc.want[i]) || (strings.HasSuffix(tc.want[i], "| ") && got[i] != tc.want[i]) {
					t.Errorf("result %d = %q, want %q", i, got[i], tc.want[i])
				}
			}
		})
	}
}

// jobYAML is a Job handed to coroner without an Ignore rule on disruptions and without a
// deadline: clean but for the long-running hint.
func jobYAML(name string) string {
	return `apiVersion: batch/v1
kind: Job
metadata: {name: ` + name + `}
spec:
  managedBy: coroner.dev/shim
  template:
    spec:
      restartPolicy: Never
      containers: [{name: main, image: busybox}]
`
}

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, body := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func TestRunInputs(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"a.yaml":          jobYAML("a"),
		"b.yml":           jobYAML("b"),
		"c.json":          `{"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "c"}, "spec": {"managedBy": "coroner.dev/shim", "activeDeadlineSeconds": 60, "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox"}]}}}}`,
		"README.md":       jobYAML("not-read"),
		"x.YAML":          jobYAML("not-read-either"),
		"sub/d.yaml":      jobYAML("d"),
		"sub/deep/e.yaml": jobYAML("e"),
		"broken/f.yaml":   "apiVersion: batch/v1\nkind: Job\nmetadata: {name: [\n",
		"broken/g.yaml":   jobYAML("g"),
		"empty/h.txt":     "",
		"typo.yaml":       strings.Replace(jobYAML("typo"), "spec:\n  managedBy", "spec:\n  podFailurePolicy: {rules: [{action: Ignore, onPodConditions: [{type: DisruptonTarget}]}]}\n  managedBy", 1),
	})
	hint := "no Ignore rule on the DisruptionTarget condition for a long-running Job (no activeDeadlineSeconds): preemptions, evictions, drains and node OOM kills will count as failures of the Job"
	p := func(name string) string { return filepath.Join(dir, name) }
	cases := []struct {
		name      string
		files     []string
		recursive bool
		stdin     string
		want      string // the whole output
		wantErr   error  // ErrFailed, errUsage or nil
	}{
		{
			name:  "a directory: its manifests, not its subdirectories, the shared hint once",
			files: []string{dir},
			want: p("a.yaml") + ": Job a: ok\n" +
				p("b.yml") + ": Job b: ok\n" +
				p("c.json") + ": Job c: ok\n" +
				p("typo.yaml") + `: Job typo: warning: spec.podFailurePolicy.rules[0].onPodConditions[0].type: unknown condition type "DisruptonTarget" (no such condition type), the rule never matches: did you mean DisruptionTarget?` + "\n" +
				"hint (3 Jobs: Job a, Job b, Job typo): " + hint + "\n",
			wantErr: ErrFailed,
		},
		{
			name:      "-R: subdirectories too, in lexical order",
			files:     []string{filepath.Join(dir, "sub")},
			recursive: true,
			want: p("sub/d.yaml") + ": Job d: ok\n" +
				p("sub/deep/e.yaml") + ": Job e: ok\n" +
				"hint (2 Jobs: Job d, Job e): " + hint + "\n",
		},
		{
			name:  "a hint for one Job stays with it",
			files: []string{p("a.yaml"), p("c.json")},
			want: p("a.yaml") + ": Job a: hint: spec.podFailurePolicy: " + hint + "\n" +
				p("c.json") + ": Job c: ok\n",
		},
		{
			name:  "a file named directly needs no extension; stdin",
			files: []string{p("README.md"), "-"},
			stdin: jobYAML("in"),
			want: p("README.md") + ": Job not-read: ok\n" +
				"<stdin>: Job in: ok\n" +
				"hint (2 Jobs: Job not-read, Job in): " + hint + "\n",
		},
		{
			name:  "a manifest that does not parse fails the check, the others are still checked",
			files: []string{filepath.Join(dir, "broken")},
			want: p("broken/f.yaml") + ": error: document 1 is not YAML: yaml: line 3: did not find expected node content\n" +
				p("broken/g.yaml") + ": Job g: hint: spec.podFailurePolicy: " + hint + "\n",
			wantErr: ErrFailed,
		},
		{name: "no -f", wantErr: errUsage},
		{name: "a file that does not exist", files: []string{p("a.yaml"), p("nope.yaml")}, wantErr: errUsage},
		{name: "a directory without manifests", files: []string{filepath.Join(dir, "empty")}, wantErr: errUsage},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := NewOptions()
			o.Files, o.Recursive = tc.files, tc.recursive
			var out bytes.Buffer
			err := o.Run(&out, strings.NewReader(tc.stdin))
			switch {
			case tc.wantErr == errUsage:
				if !IsUsage(err) {
					t.Errorf("Run = %v, want a UsageError", err)
				}
				if out.Len() > 0 {
					t.Errorf("a usage error printed %q", out.String())
				}
				return
			case !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil):
				t.Errorf("Run = %v, want %v", err, tc.wantErr)
			}
			if out.String() != tc.want {
				t.Errorf("output:\n%s\nwant:\n%s", out.String(), tc.want)
			}
		})
	}
}

// errUsage stands for any UsageError in test tables.
var errUsage = errors.New("usage")

func TestCountedObjects(t *testing.T) {
	objs := []string{"Job a", "Job b", "Job c", "Job d", "Job e", "CronJob f", "Job g"}
	for _, tc := range []struct {
		n    int
		want string
	}{
		{2, "2 Jobs: Job a, Job b"},
		{5, "5 Jobs: Job a, Job b, Job c, Job d, Job e"},
		{7, "7 Jobs: Job a, Job b, Job c, Job d, Job e and 2 more"},
	} {
		if got := countedObjects(objs[:tc.n]); got != tc.want {
			t.Errorf("countedObjects(%d) = %q, want %q", tc.n, got, tc.want)
		}
	}
}
