// Package explain is `coronerctl explain`: what happened to a Job's pods and why. For each
// pod of a Job, existing or deleted, its state and cause (container exits, the OOM class
// coroner-agent stamped, the disruption reason, a wait such as ErrImageNeverPull or
// CrashLoopBackOff, the exits of in-place restarts from coroner.dev/exit-history), for a
// failed pod the podFailurePolicy rule that matches it (shim/policy.Match on the live pod,
// as coroner-shim decides) and the consequence for the Job; then the Job's per-index
// state. Pods that are gone are told from coroner-shim's record of the Job (a JobRecord,
// package api/v1alpha1): the last state it recorded as each left, the rule that matched
// and what it did, why the shim deleted it. explain reads no Events: they are for people,
// and lossy.
//
// Build is a pure function of the Job, its pods and its JobRecord; Explain reads them
// through a Client. Reports print as text (Write) or, through cli-runtime's printers, as
// JSON or YAML of the documented types in types.go.
package explain

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/conditions"
)

// Output formats of -o.
const (
	OutputText = "text"
	OutputJSON = "json"
	OutputYAML = "yaml"
)

// UsageError is a command line explain cannot act on.
type UsageError struct{ msg string }

func (e *UsageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &UsageError{fmt.Sprintf(format, args...)}
}

// Kind is what a target names.
type Kind string

const (
	KindJob Kind = "job"
	KindPod Kind = "pod"
)

// Target is one thing to explain: a Job or a pod by name, or, with an empty Name, every
// coroner-managed Job or every pod coroner stamped.
type Target struct {
	Kind Kind
	Name string
}

// resourceKinds maps the resource names kubectl accepts to a Kind.
var resourceKinds = map[string]Kind{
	"job": KindJob, "jobs": KindJob, "job.batch": KindJob, "jobs.batch": KindJob,
	"pod": KindPod, "pods": KindPod, "po": KindPod,
}

// ParseTargets reads the arguments the way kubectl does: TYPE/NAME..., TYPE [NAME...], or
// NAME... (Jobs, as explain always took). Without arguments, allNamespaces means every
// coroner-managed Job.
func ParseTargets(args []string, allNamespaces bool) ([]Target, error) {
	if len(args) == 0 {
		if allNamespaces {
			return []Target{{Kind: KindJob}}, nil
		}
		return nil, usagef("name a Job or a pod: job/NAME, pod/NAME, job NAME, NAME (a Job), jobs or pods (all of them), or -A")
	}
	var out []Target
	if k, ok := resourceKinds[strings.ToLower(args[0])]; ok && !strings.Contains(args[0], "/") {
		if len(args) == 1 {
			return []Target{{Kind: k}}, nil
		}
		for _, name := range args[1:] {
			if strings.Contains(name, "/") {
				return nil, usagef("there is no need to specify a resource type as a separate argument when passing arguments in resource/name form (%q)", name)
			}
			out = append(out, Target{Kind: k, Name: name})
		}
		return out, nil
	}
	for _, a := range args {
		res, name, slash := strings.Cut(a, "/")
		if !slash {
			out = append(out, Target{Kind: KindJob, Name: a})
			continue
		}
		k, ok := resourceKinds[strings.ToLower(res)]
		if !ok {
			return nil, usagef("explain knows jobs and pods, not %q", res)
		}
		if name == "" {
			return nil, usagef("%q names no %s", a, k)
		}
		out = append(out, Target{Kind: k, Name: name})
	}
	return out, nil
}

// Client is what explain reads: the Jobs and pods through Interface, coroner-shim's
// JobRecords (package api/v1alpha1) through Dynamic. A nil Dynamic reads no records:
// reports then say that the pods that are gone are not told.
type Client struct {
	kubernetes.Interface
	Dynamic dynamic.Interface
}

// NewClient builds a Client for cfg.
func NewClient(cfg *rest.Config) (Client, error) {
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return Client{}, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return Client{}, err
	}
	return Client{Interface: kube, Dynamic: dyn}, nil
}

// Options are the flags of `coronerctl explain`.
type Options struct {
	// Flags are kubectl's kubeconfig, context and namespace flags.
	Flags         *genericclioptions.ConfigFlags
	AllNamespaces bool
	Output        string
}

// NewOptions returns the defaults.
func NewOptions() *Options {
	return &Options{Flags: genericclioptions.NewConfigFlags(true), Output: OutputText}
}

// Validate checks the flags.
func (o *Options) Validate() error {
	switch o.Output {
	case OutputText, OutputJSON, OutputYAML:
		return nil
	}
	return usagef("-o must be text, json or yaml, not %q", o.Output)
}

// Run explains the targets of args and prints them to w.
func (o *Options) Run(ctx context.Context, args []string, w io.Writer) error {
	if err := o.Validate(); err != nil {
		return err
	}
	targets, err := ParseTargets(args, o.AllNamespaces)
	if err != nil {
		return err
	}
	cfg, err := o.Flags.ToRESTConfig()
	if err != nil {
		return fmt.Errorf("loading the client configuration: %w", err)
	}
	cfg.UserAgent = "coronerctl"
	client, err := NewClient(cfg)
	if err != nil {
		return err
	}
	ns, _, err := o.Flags.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return err
	}
	if o.AllNamespaces {
		ns = metav1.NamespaceAll
	}
	objs, err := Explain(ctx, client, ns, targets)
	if err != nil {
		return err
	}
	return Print(objs, o.Output, w)
}

// Explain reads what the targets need from the API and builds a report for each: a
// *Report per Job, a *PodReport per pod. namespace "" is every namespace.
func Explain(ctx context.Context, client Client, namespace string, targets []Target) ([]runtime.Object, error) {
	var out []runtime.Object
	for _, t := range targets {
		switch {
		case t.Kind == KindJob && t.Name != "":
			if namespace == metav1.NamespaceAll {
				return nil, usagef("a Job by name needs a namespace: -n, not -A")
			}
			r, err := JobReport(ctx, client, namespace, t.Name)
			if err != nil {
				return nil, err
			}
			out = append(out, r)
		case t.Kind == KindJob:
			rs, err := managedJobs(ctx, client, namespace)
			if err != nil {
				return nil, err
			}
			out = append(out, rs...)
		case t.Name != "":
			if namespace == metav1.NamespaceAll {
				return nil, usagef("a pod by name needs a namespace: -n, not -A")
			}
			r, err := Pod(ctx, client, namespace, t.Name)
			if err != nil {
				return nil, err
			}
			out = append(out, r)
		default:
			rs, err := stampedPods(ctx, client, namespace)
			if err != nil {
				return nil, err
			}
			out = append(out, rs...)
		}
	}
	return out, nil
}

// Print writes the reports in the output format: text, or JSON or YAML through
// cli-runtime's printers (one object, a List when there are several or none).
func Print(objs []runtime.Object, format string, w io.Writer) error {
	if format == OutputText || format == "" {
		if len(objs) == 0 {
			_, err := fmt.Fprintln(w, "Nothing to explain: no coroner-managed Job, or no pod coroner stamped.")
			return err
		}
		for i, o := range objs {
			if i > 0 {
				if _, err := fmt.Fprintln(w); err != nil {
					return err
				}
			}
			var err error
			switch r := o.(type) {
			case *Report:
				err = r.Write(w)
			case *PodReport:
				err = r.Write(w)
			}
			if err != nil {
				return err
			}
		}
		return nil
	}
	pf := genericclioptions.NewJSONYamlPrintFlags()
	printer, err := pf.ToPrinter(format)
	if err != nil {
		return err
	}
	var obj runtime.Object = newList(objs)
	if len(objs) == 1 {
		obj = objs[0]
	}
	return printer.PrintObj(obj, w)
}

// JobReport reads the Job, its pods and its JobRecord and builds its Report.
func JobReport(ctx context.Context, client Client, namespace, name string) (*Report, error) {
	job, err := client.BatchV1().Jobs(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return reportOf(ctx, client, job)
}

// Job reads the Job, its pods and its JobRecord and prints the Report as text.
func Job(ctx context.Context, client Client, namespace, name string, w io.Writer) error {
	r, err := JobReport(ctx, client, namespace, name)
	if err != nil {
		return err
	}
	return r.Write(w)
}

func reportOf(ctx context.Context, client Client, job *batchv1.Job) (*Report, error) {
	pods, err := jobPods(ctx, client, job)
	if err != nil {
		return nil, err
	}
	rec, err := jobRecord(ctx, client, job.Namespace, job.Name)
	if err != nil {
		return nil, err
	}
	return Build(job, pods, rec), nil
}

// jobRecord reads coroner-shim's record of the Job named name; nil when there is none (or
// no Dynamic client, or the API server does not serve JobRecords: coroner is not
// installed, or an older version is).
func jobRecord(ctx context.Context, client Client, namespace, name string) (*v1alpha1.JobRecord, error) {
	if client.Dynamic == nil {
		return nil, nil
	}
	u, err := client.Dynamic.Resource(v1alpha1.GroupVersionResource).Namespace(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the JobRecord %s/%s: %w", namespace, name, err)
	}
	return v1alpha1.FromUnstructured(u)
}

// managedJobs reports every Job handed to coroner-shim in the namespace ("" for all).
func managedJobs(ctx context.Context, client Client, namespace string) ([]runtime.Object, error) {
	list, err := client.BatchV1().Jobs(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing Jobs: %w", err)
	}
	var out []runtime.Object
	for i := range list.Items {
		job := &list.Items[i]
		if ptrValue(job.Spec.ManagedBy) != conditions.ManagedBy {
			continue
		}
		r, err := reportOf(ctx, client, job)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// Pod explains one pod. A pod of a Job is explained as in its Job's report (rule,
// action, the shim's decisions); a pod that is gone is looked for in coroner-shim's
// records of the namespace's Jobs.
func Pod(ctx context.Context, client Client, namespace, name string) (*PodReport, error) {
	pod, err := client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return gonePod(ctx, client, namespace, name, err)
	}
	if err != nil {
		return nil, err
	}
	if ref := metav1.GetControllerOf(pod); ref != nil && ref.Kind == "Job" {
		job, err := client.BatchV1().Jobs(namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		if err == nil && job.UID == ref.UID {
			r, err := reportOf(ctx, client, job)
			if err != nil {
				return nil, err
			}
			for i := range r.Pods {
				if r.Pods[i].Name == name {
					return standalone(r.Pods[i]), nil
				}
			}
		}
	}
	return standalone(podReport(nil, pod)), nil
}

// gonePod finds the pod in coroner-shim's records of the namespace's Jobs, or returns
// notFound.
func gonePod(ctx context.Context, client Client, namespace, name string, notFound error) (*PodReport, error) {
	if client.Dynamic == nil {
		return nil, notFound
	}
	list, err := client.Dynamic.Resource(v1alpha1.GroupVersionResource).Namespace(namespace).List(ctx, metav1.ListOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("%w, and the API server serves no JobRecords (coroner-shim's records)", notFound)
	}
	if err != nil {
		return nil, fmt.Errorf("listing the JobRecords of %s: %w", namespace, err)
	}
	for i := range list.Items {
		rec, err := v1alpha1.FromUnstructured(&list.Items[i])
		if err != nil {
			return nil, err
		}
		if _, ok := rec.Pods[name]; !ok {
			continue
		}
		job, err := client.BatchV1().Jobs(namespace).Get(ctx, rec.Name, metav1.GetOptions{})
		if err != nil || job.UID != rec.JobUID {
			continue
		}
		r, err := reportOf(ctx, client, job)
		if err != nil {
			return nil, err
		}
		for i := range r.Pods {
			if r.Pods[i].Name == name {
				return standalone(r.Pods[i]), nil
			}
		}
	}
	return nil, fmt.Errorf("%w, and no coroner-shim record of a Job of %s has it", notFound, namespace)
}

// stampedPods reports every pod coroner stamped in the namespace ("" for all), with its
// Job's rule and action when a Job controls it.
func stampedPods(ctx context.Context, client Client, namespace string) ([]runtime.Object, error) {
	list, err := client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing pods: %w", err)
	}
	jobs := map[string]*batchv1.Job{}
	var out []runtime.Object
	for i := range list.Items {
		p := &list.Items[i]
		if !hasCoronerStamp(p) {
			continue
		}
		var job *batchv1.Job
		if ref := metav1.GetControllerOf(p); ref != nil && ref.Kind == "Job" {
			key := p.Namespace + "/" + ref.Name
			j, seen := jobs[key]
			if !seen {
				j, err = client.BatchV1().Jobs(p.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
				if err != nil && !apierrors.IsNotFound(err) {
					return nil, err
				}
				if err != nil || j.UID != ref.UID {
					j = nil
				}
				jobs[key] = j
			}
			job = j
		}
		out = append(out, standalone(podReport(job, p)))
	}
	return out, nil
}

func standalone(p PodReport) *PodReport {
	p.TypeMeta = typeMeta(KindPodReport)
	return &p
}

// jobPods lists the pods the Job's selector selects; Build keeps those it controls.
func jobPods(ctx context.Context, client Client, job *batchv1.Job) ([]*corev1.Pod, error) {
	sel := labels.SelectorFromSet(labels.Set{batchv1.ControllerUidLabel: string(job.UID)})
	if job.Spec.Selector != nil {
		s, err := metav1.LabelSelectorAsSelector(job.Spec.Selector)
		if err != nil {
			return nil, fmt.Errorf("the Job's selector: %w", err)
		}
		sel = s
	}
	list, err := client.CoreV1().Pods(job.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return nil, fmt.Errorf("listing the Job's pods: %w", err)
	}
	pods := make([]*corev1.Pod, 0, len(list.Items))
	for i := range list.Items {
		pods = append(pods, &list.Items[i])
	}
	return pods, nil
}

// IsUsage reports whether err is a UsageError.
func IsUsage(err error) bool {
	var u *UsageError
	return errors.As(err, &u)
}
