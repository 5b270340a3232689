// Package explain is `coronerctl explain job NAME`: for each failed pod of a Job, its cause
// of death (container exit codes, the OOM class coroner-agent stamped, the disruption
// reason), the podFailurePolicy rule that matches it (shim/policy.Match on the live pod,
// as coroner-shim decides) and the consequence for the Job; then the Job's per-index state
// with the failure counts of the pods' annotations, and the shim's recorded decisions about
// pods that are already gone.
//
// Build is a pure function of the Job, its pods and Events; Job reads them through a
// kubernetes.Interface and prints the Report.
package explain

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/pflag"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"

	"github.com/coroner-dev/coroner/cmd/internal/cli"
)

// Options are the flags of `coronerctl explain`.
type Options struct {
	Kubeconfig string
	Context    string
	Namespace  string
}

// AddFlags registers the options on fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "Path to a kubeconfig file; default $KUBECONFIG, else ~/.kube/config, else the in-cluster service account.")
	fs.StringVar(&o.Context, "context", o.Context, "The kubeconfig context to use; default its current context.")
	fs.StringVarP(&o.Namespace, "namespace", "n", o.Namespace, "Namespace of the Job; default the context's namespace, else default.")
}

// Run runs `explain job NAME` (args after "explain") and prints the report to w.
func (o *Options) Run(ctx context.Context, args []string, w io.Writer) error {
	if len(args) != 2 || (args[0] != "job" && args[0] != "jobs" && args[0] != "job.batch") {
		return errors.New("usage: coronerctl explain job NAME [-n NAMESPACE]")
	}
	client, ns, err := cli.UserClient(o.Kubeconfig, o.Context, o.Namespace, "coronerctl")
	if err != nil {
		return err
	}
	return Job(ctx, client, ns, args[1], w)
}

// Job reads the Job, its pods and its Events and prints the Report.
func Job(ctx context.Context, client kubernetes.Interface, namespace, name string, w io.Writer) error {
	job, err := client.BatchV1().Jobs(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	pods, err := jobPods(ctx, client, job)
	if err != nil {
		return err
	}
	events, err := client.CoreV1().Events(namespace).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("involvedObject.uid", string(job.UID)).String(),
	})
	if err != nil {
		return fmt.Errorf("listing the Job's events: %w", err)
	}
	return Build(job, pods, events.Items).Write(w)
}

// jobPods lists the pods the Job's selector selects; Build keeps those it controls.
func jobPods(ctx context.Context, client kubernetes.Interface, job *batchv1.Job) ([]*corev1.Pod, error) {
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
