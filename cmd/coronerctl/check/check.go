// Package check is `coronerctl check -f job.yaml`: it validates the Jobs of a manifest
// offline, with the rules the API server applies to a Job's failure handling, and adds
// coroner's own lints.
//
// The API rules are those of the v1.36 API server (pkg/apis/batch/validation), re-implemented
// here on a copy of the Job with the API server's defaults applied, with the same field
// paths and messages: podFailurePolicy, backoffLimitPerIndex, maxFailedIndexes,
// podReplacementPolicy, successPolicy, managedBy, completionMode, the counts, the restart
// policy and the container names the rules refer to, plus the size limits of Indexed Jobs
// (shim/indexes.CheckLimits). Unknown and duplicate fields are errors, as with
// kubectl's default strict field validation. The rest of the pod template is not checked:
// the API server remains the judge of that.
//
// The lints are coroner's (see lint.go): a Job not handed to coroner-shim, onExitCodes
// rules that cannot match under restartPolicy OnFailure, exit code 137 taken for an OOM
// kill, long-running Jobs that do not ignore disruptions, Jobs whose pods ask for devices
// but would count a device failure (devices.go), condition types that nothing
// sets (with the known type meant, condtypes.go), opt-in annotations with a value other
// than "true" or on the Job instead of its pod template (annotations.go), the node-blame
// annotations coroner.dev/avoid-failed-nodes and coroner.dev/disruption-budget (syntax,
// a Job not handed to coroner, a budget no Ignore rule uses, required avoidance on a
// template pinned to one node, nodeblame.go), and rules that can never fire because
// earlier ones match every pod they would (shadow.go).
//
// Input is files, directories (input.go) and stdin, each a stream of documents, Lists
// (`kubectl get -o yaml`) checked item by item. Every finding is one line: the source and
// the Job, the severity, the field path and the message; a hint given for several Jobs is
// written once, at the end. Errors and warnings fail the check; hints do not.
package check

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/util/validation/field"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/coroner-dev/coroner/conditions"
)

// Severity grades a finding.
type Severity int

const (
	// Hint: worth knowing, does not fail the check.
	Hint Severity = iota
	// Warning: coroner will not do what the Job's author probably wants; fails the check.
	Warning
	// Error: the API server would reject the Job, or a rule can never work; fails the check.
	Error
)

func (s Severity) String() string {
	switch s {
	case Error:
		return "error"
	case Warning:
		return "warning"
	}
	return "hint"
}

// Finding is one reason.
type Finding struct {
	Severity Severity
	// Field is the path of the field, such as spec.podFailurePolicy.rules[0].action.
	Field string
	// Message says what is wrong, as the API server would for its own rules.
	Message string
	// Lint is true for coroner's own findings, false for the API server's rules.
	Lint bool
}

func (f Finding) String() string {
	if f.Field == "" {
		return fmt.Sprintf("%s: %s", f.Severity, f.Message)
	}
	return fmt.Sprintf("%s: %s: %s", f.Severity, f.Field, f.Message)
}

// Fails reports whether any finding fails the check (an error or a warning).
func Fails(findings []Finding) bool {
	for _, f := range findings {
		if f.Severity >= Warning {
			return true
		}
	}
	return false
}

// Job checks a Job as written in a manifest (not defaulted). managedBy is the value that
// hands a Job to coroner-shim (conditions.ManagedBy unless the shim runs with another
// --managed-by).
func Job(job *batchv1.Job, managedBy string) []Finding {
	spec := withDefaults(&job.Spec)
	errs := validateJobMeta(&job.ObjectMeta, spec)
	errs = append(errs, validateJobSpec(spec, field.NewPath("spec"))...)
	out := append(fromFieldErrors(errs, ""), lint(spec, field.NewPath("spec"), managedBy)...)
	jobAt := annotationsAt{job.Annotations, field.NewPath("metadata", "annotations")}
	out = append(out, lintMemoryRetry(jobAt, spec, managedBy)...)
	out = append(out, lintNodeBlame(jobAt, spec, managedBy)...)
	out = append(out, lintNodeBlamePlacement([]annotationsAt{{job.Spec.Template.Annotations, field.NewPath("spec", "template", "metadata", "annotations")}}, jobAt)...)
	return append(out, lintOptIn(
		[]annotationsAt{{job.Annotations, field.NewPath("metadata", "annotations")}},
		annotationsAt{job.Spec.Template.Annotations, field.NewPath("spec", "template", "metadata", "annotations")})...)
}

// CronJob checks the Job template of a CronJob, with the field paths of the CronJob.
func CronJob(cj *batchv1.CronJob, managedBy string) []Finding {
	const prefix = "spec.jobTemplate."
	spec := withDefaults(&cj.Spec.JobTemplate.Spec)
	errs := validateJobSpec(spec, field.NewPath("spec"))
	out := fromFieldErrors(errs, prefix)
	for _, f := range lint(spec, field.NewPath("spec"), managedBy) {
		f.Field = prefix + f.Field
		out = append(out, f)
	}
	jt := field.NewPath("spec", "jobTemplate")
	jobAt := annotationsAt{cj.Spec.JobTemplate.Annotations, jt.Child("metadata", "annotations")}
	out = append(out, lintMemoryRetry(jobAt, spec, managedBy)...)
	out = append(out, lintNodeBlame(jobAt, spec, managedBy)...)
	out = append(out, lintNodeBlamePlacement([]annotationsAt{
		{cj.Annotations, field.NewPath("metadata", "annotations")},
		{cj.Spec.JobTemplate.Spec.Template.Annotations, jt.Child("spec", "template", "metadata", "annotations")},
	}, jobAt)...)
	return append(out, lintOptIn(
		[]annotationsAt{
			{cj.Annotations, field.NewPath("metadata", "annotations")},
			{cj.Spec.JobTemplate.Annotations, jt.Child("metadata", "annotations")},
		},
		annotationsAt{cj.Spec.JobTemplate.Spec.Template.Annotations, jt.Child("spec", "template", "metadata", "annotations")})...)
}

func fromFieldErrors(errs field.ErrorList, prefix string) []Finding {
	out := make([]Finding, 0, len(errs))
	for _, e := range errs {
		out = append(out, Finding{Severity: Error, Field: prefix + e.Field, Message: e.ErrorBody()})
	}
	return out
}

// Result is the outcome for one Job (or CronJob) of a manifest.
type Result struct {
	// Source names the file and, when it has several, the document (counted from 1).
	Source string
	// Object is "Job name" or "CronJob name", with the namespace when the manifest sets one.
	Object   string
	Findings []Finding
}

var scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := batchv1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}()

// strict decodes JSON into the scheme's types and reports unknown and duplicate fields.
var strict = kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, scheme, scheme, kjson.SerializerOptions{Strict: true})

// Manifest checks every Job and CronJob of a multi-document YAML (or JSON) stream, and of
// the lists in it (kind List, as `kubectl get -o yaml` prints, JobList, CronJobList); other
// objects are passed over. source names the stream in the results and in the error, if
// any part of it cannot be read.
func Manifest(r io.Reader, source, managedBy string) ([]Result, error) {
	reader := utilyaml.NewYAMLReader(bufio.NewReader(r))
	type doc struct {
		n    int
		json []byte
	}
	var docs []doc
	for n := 1; ; n++ {
		raw, err := reader.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, &sourceError{source, fmt.Errorf("reading document %d: %w", n, err)}
		}
		js, err := utilyaml.ToJSON(raw)
		if err != nil {
			return nil, &sourceError{source, fmt.Errorf("document %d is not YAML: %w", n, err)}
		}
		if t := bytes.TrimSpace(js); len(t) == 0 || string(t) == "null" {
			n-- // an empty document (comments, a trailing ---) is not counted
			continue
		}
		docs = append(docs, doc{n, js})
	}
	var results []Result
	for _, d := range docs {
		src := source
		if len(docs) > 1 {
			src = fmt.Sprintf("%s (document %d)", source, d.n)
		}
		tm, err := typeOf(d.json)
		if err != nil {
			return nil, &sourceError{src, err}
		}
		itemKind, isList := listKinds[tm]
		if !isList {
			res, ok, err := checkObject(d.json, tm, src, managedBy)
			if err != nil {
				return nil, err
			}
			if ok {
				results = append(results, res)
			}
			continue
		}
		var list struct {
			Items []json.RawMessage `json:"items"`
		}
		if err := json.Unmarshal(d.json, &list); err != nil {
			return nil, &sourceError{src, err}
		}
		for i, item := range list.Items {
			isrc := fmt.Sprintf("%s (item %d)", source, i+1)
			if len(docs) > 1 {
				isrc = fmt.Sprintf("%s (document %d, item %d)", source, d.n, i+1)
			}
			itm, err := typeOf(item)
			if err != nil {
				return nil, &sourceError{isrc, err}
			}
			if itm == (metav1.TypeMeta{}) {
				// The items of a JobList or CronJobList, as the API returns them, have no kind.
				itm = itemKind
			}
			res, ok, err := checkObject(item, itm, isrc, managedBy)
			if err != nil {
				return nil, err
			}
			if ok {
				results = append(results, res)
			}
		}
	}
	return results, nil
}

// sourceError is a manifest (or a document, or an item of a List) that could not be
// read: source names it as Result.Source does.
type sourceError struct {
	source string
	err    error
}

func (e *sourceError) Error() string { return e.source + ": " + e.err.Error() }
func (e *sourceError) Unwrap() error { return e.err }

// listKinds are the lists whose items are checked, each with the kind of its items when
// they do not say (metav1.TypeMeta{} for any).
var listKinds = map[metav1.TypeMeta]metav1.TypeMeta{
	{APIVersion: "v1", Kind: "List"}:              {},
	{APIVersion: "batch/v1", Kind: "JobList"}:     {APIVersion: "batch/v1", Kind: "Job"},
	{APIVersion: "batch/v1", Kind: "CronJobList"}: {APIVersion: "batch/v1", Kind: "CronJob"},
}

func typeOf(js []byte) (metav1.TypeMeta, error) {
	var tm metav1.TypeMeta
	err := json.Unmarshal(js, &tm)
	return tm, err
}

// checkObject checks one object (a document or a list item) of type tm; ok is false for
// anything but a batch/v1 Job or CronJob.
func checkObject(js []byte, tm metav1.TypeMeta, src, managedBy string) (res Result, ok bool, err error) {
	if tm.APIVersion != "batch/v1" || (tm.Kind != "Job" && tm.Kind != "CronJob") {
		return Result{}, false, nil
	}
	gvk := batchv1.SchemeGroupVersion.WithKind(tm.Kind)
	obj, _, err := strict.Decode(js, &gvk, nil)
	var unknown []Finding
	if err != nil {
		if !runtime.IsStrictDecodingError(err) {
			return Result{}, false, &sourceError{src, fmt.Errorf("decoding the %s: %w", tm.Kind, err)}
		}
		unknown = strictFindings(err)
	}
	res = Result{Source: src}
	switch o := obj.(type) {
	case *batchv1.Job:
		res.Object = objectName("Job", o.Namespace, o.Name, o.GenerateName)
		res.Findings = append(unknown, Job(o, managedBy)...)
	case *batchv1.CronJob:
		res.Object = objectName("CronJob", o.Namespace, o.Name, o.GenerateName)
		res.Findings = append(unknown, CronJob(o, managedBy)...)
	default:
		return Result{}, false, &sourceError{src, fmt.Errorf("decoding the %s: got a %T", tm.Kind, obj)}
	}
	return res, true, nil
}

func objectName(kind, namespace, name, generateName string) string {
	if name == "" {
		name = generateName + "*"
	}
	if namespace != "" {
		name = namespace + "/" + name
	}
	return kind + " " + name
}

// strictFindings turns a strict decoding error (`unknown field "spec.x"`, `duplicate field
// "spec.y"`) into errors on those fields.
func strictFindings(err error) []Finding {
	sde, ok := runtime.AsStrictDecodingError(err)
	if !ok {
		return []Finding{{Severity: Error, Message: err.Error()}}
	}
	var out []Finding
	for _, e := range sde.Errors() {
		msg := e.Error()
		what, quoted, ok := strings.Cut(msg, ` "`)
		if path, err := strconv.Unquote(`"` + quoted); ok && err == nil {
			out = append(out, Finding{Severity: Error, Field: path, Message: what})
			continue
		}
		out = append(out, Finding{Severity: Error, Message: msg})
	}
	return out
}

// Options are the flags of `coronerctl check`.
type Options struct {
	Files     []string
	Recursive bool
	ManagedBy string
}

// NewOptions returns the defaults.
func NewOptions() *Options {
	return &Options{ManagedBy: conditions.ManagedBy}
}

// AddFlags registers the options on fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringArrayVarP(&o.Files, "filename", "f", o.Files, "Manifest to check: a file (YAML or JSON, several documents or a List allowed), a directory (its *.yaml, *.yml and *.json files) or - for stdin; repeatable.")
	fs.BoolVarP(&o.Recursive, "recursive", "R", o.Recursive, "Process the directories given with -f recursively.")
	fs.StringVar(&o.ManagedBy, "managed-by", o.ManagedBy, "The spec.managedBy value that hands a Job to coroner-shim (its --managed-by).")
}

// Run checks the files and writes one line per finding to w, or one "ok" line per Job
// without errors or warnings. A hint given for several Jobs is written once, after them,
// with the number of Jobs it applies to. Run returns ErrFailed when any error or warning
// was found (a manifest that does not parse is one), and a UsageError when the command
// line names nothing it can check: no -f, a file or directory that cannot be read, no Job
// or CronJob in them.
func (o *Options) Run(w io.Writer, stdin io.Reader) error {
	if len(o.Files) == 0 {
		return usageErrorf("no manifest: give one with -f FILE, -f DIR or -f -")
	}
	inputs, err := expand(o.Files, o.Recursive)
	if err != nil {
		return err
	}
	var results []Result
	failed := false
	for _, in := range inputs {
		var data []byte
		if in == "-" {
			in = "<stdin>"
			if data, err = io.ReadAll(stdin); err != nil {
				return usageErrorf("reading stdin: %v", err)
			}
		} else if data, err = os.ReadFile(in); err != nil {
			return usageErrorf("%v", err)
		}
		res, err := Manifest(bytes.NewReader(data), in, o.ManagedBy)
		if err != nil {
			// The manifest is what is checked: one that does not parse is a problem found.
			source, msg := in, err.Error()
			if se := (*sourceError)(nil); errors.As(err, &se) {
				source, msg = se.source, se.err.Error()
			}
			fmt.Fprintf(w, "%s: %s: %s\n", source, Error, strings.ReplaceAll(msg, "\n", "; "))
			failed = true
			continue
		}
		results = append(results, res...)
	}
	if len(results) == 0 && !failed {
		return usageErrorf("no batch/v1 Job or CronJob in %s", strings.Join(o.Files, ", "))
	}
	if report(w, results) || failed {
		return ErrFailed
	}
	return nil
}

// report writes the results and says whether they fail the check. Hints given, with the
// same message, for more than one object are written once at the end.
func report(w io.Writer, results []Result) bool {
	objects := map[string][]string{}
	var order []string
	for _, res := range results {
		seen := map[string]bool{}
		for _, f := range res.Findings {
			if f.Severity != Hint || seen[f.Message] {
				continue
			}
			seen[f.Message] = true
			if objects[f.Message] == nil {
				order = append(order, f.Message)
			}
			objects[f.Message] = append(objects[f.Message], res.Object)
		}
	}
	shared := func(f Finding) bool { return f.Severity == Hint && len(objects[f.Message]) > 1 }

	failed := false
	for _, res := range results {
		inline := 0
		for _, f := range res.Findings {
			if shared(f) {
				continue
			}
			inline++
			fmt.Fprintf(w, "%s: %s: %s\n", res.Source, res.Object, f)
		}
		if inline == 0 {
			fmt.Fprintf(w, "%s: %s: ok\n", res.Source, res.Object)
		}
		failed = failed || Fails(res.Findings)
	}
	for _, msg := range order {
		if objs := objects[msg]; len(objs) > 1 {
			fmt.Fprintf(w, "%s (%s): %s\n", Hint, countedObjects(objs), msg)
		}
	}
	return failed
}

// countedObjects is "3 Jobs: Job a, Job b, CronJob c", naming at most five.
func countedObjects(objs []string) string {
	const named = 5
	if len(objs) <= named {
		return fmt.Sprintf("%d Jobs: %s", len(objs), strings.Join(objs, ", "))
	}
	return fmt.Sprintf("%d Jobs: %s and %d more", len(objs), strings.Join(objs[:named], ", "), len(objs)-named)
}

// ErrFailed means the check found errors or warnings (it printed them).
var ErrFailed = errors.New("check failed")

// UsageError means the command line named nothing the check could read: coronerctl
// exits 2 on it, as on a bad flag.
type UsageError struct{ msg string }

func (e *UsageError) Error() string { return e.msg }

func usageErrorf(format string, args ...any) error {
	return &UsageError{msg: fmt.Sprintf(format, args...)}
}

// IsUsage reports whether err is, or wraps, a UsageError.
func IsUsage(err error) bool {
	var u *UsageError
	return errors.As(err, &u)
}
