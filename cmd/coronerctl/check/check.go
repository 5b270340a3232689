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
// kill, and long-running Jobs that do not ignore disruptions.
//
// Every finding is one line: the source and the Job, the severity, the field path and the
// message. Errors and warnings fail the check; hints do not.
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
	return append(fromFieldErrors(errs, ""), lint(spec, field.NewPath("spec"), managedBy)...)
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
	return out
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

// Manifest checks every Job and CronJob of a multi-document YAML (or JSON) stream; other
// objects are passed over. source names the stream in the results.
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
			return nil, fmt.Errorf("%s: reading document %d: %w", source, n, err)
		}
		js, err := utilyaml.ToJSON(raw)
		if err != nil {
			return nil, fmt.Errorf("%s: document %d is not YAML: %w", source, n, err)
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
		var tm struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := json.Unmarshal(d.json, &tm); err != nil {
			return nil, fmt.Errorf("%s: %w", src, err)
		}
		if tm.APIVersion != "batch/v1" || (tm.Kind != "Job" && tm.Kind != "CronJob") {
			continue
		}
		obj, _, err := strict.Decode(d.json, nil, nil)
		var unknown []Finding
		if err != nil {
			if !runtime.IsStrictDecodingError(err) {
				return nil, fmt.Errorf("%s: decoding the %s: %w", src, tm.Kind, err)
			}
			unknown = strictFindings(err)
		}
		res := Result{Source: src}
		switch o := obj.(type) {
		case *batchv1.Job:
			res.Object = objectName("Job", o.Namespace, o.Name, o.GenerateName)
			res.Findings = append(unknown, Job(o, managedBy)...)
		case *batchv1.CronJob:
			res.Object = objectName("CronJob", o.Namespace, o.Name, o.GenerateName)
			res.Findings = append(unknown, CronJob(o, managedBy)...)
		}
		results = append(results, res)
	}
	return results, nil
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
	ManagedBy string
}

// NewOptions returns the defaults.
func NewOptions() *Options {
	return &Options{ManagedBy: conditions.ManagedBy}
}

// AddFlags registers the options on fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringArrayVarP(&o.Files, "filename", "f", o.Files, "Manifest to check (YAML or JSON, several documents allowed; - for stdin); repeatable.")
	fs.StringVar(&o.ManagedBy, "managed-by", o.ManagedBy, "The spec.managedBy value that hands a Job to coroner-shim (its --managed-by).")
}

// Run checks the files and writes one line per finding to w, or one "ok" line per clean
// Job. It returns ErrFailed when any error or warning was found.
func (o *Options) Run(w io.Writer, stdin io.Reader) error {
	if len(o.Files) == 0 {
		return errors.New("no manifest: give one with -f FILE")
	}
	failed, jobs := false, 0
	for _, name := range o.Files {
		var r io.Reader
		if name == "-" {
			r, name = stdin, "<stdin>"
		} else {
			f, err := os.Open(name)
			if err != nil {
				return err
			}
			defer f.Close()
			r = f
		}
		results, err := Manifest(r, name, o.ManagedBy)
		if err != nil {
			return err
		}
		for _, res := range results {
			jobs++
			if len(res.Findings) == 0 {
				fmt.Fprintf(w, "%s: %s: ok\n", res.Source, res.Object)
			}
			for _, f := range res.Findings {
				fmt.Fprintf(w, "%s: %s: %s\n", res.Source, res.Object, f)
			}
			failed = failed || Fails(res.Findings)
		}
	}
	if jobs == 0 {
		return fmt.Errorf("no batch/v1 Job or CronJob in %s", strings.Join(o.Files, ", "))
	}
	if failed {
		return ErrFailed
	}
	return nil
}

// ErrFailed means the check found errors or warnings (it printed them).
var ErrFailed = errors.New("check failed")
