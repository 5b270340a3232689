package main

import (
	"context"
	"strings"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/coroner-dev/coroner/cmd/coronerctl/explain"
	"github.com/coroner-dev/coroner/conditions"
)

// completeTargets completes explain's arguments: the resource words, then the names of
// the namespace's coroner-managed Jobs (or pods, after "pod" or "pod/"), as kubectl
// completes names. Without a cluster it offers the resource words only.
func completeTargets(o *explain.Options, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	const noFiles = cobra.ShellCompDirectiveNoFileComp
	kind, prefix := explain.KindJob, ""
	switch {
	case strings.HasPrefix(toComplete, "job/"), strings.HasPrefix(toComplete, "jobs/"):
		prefix = toComplete[:strings.Index(toComplete, "/")+1]
	case strings.HasPrefix(toComplete, "pod/"), strings.HasPrefix(toComplete, "pods/"), strings.HasPrefix(toComplete, "po/"):
		kind, prefix = explain.KindPod, toComplete[:strings.Index(toComplete, "/")+1]
	case len(args) > 0 && (args[0] == "pod" || args[0] == "pods" || args[0] == "po"):
		kind = explain.KindPod
	}
	var out []string
	if prefix == "" && len(args) == 0 {
		out = append(out, "job/", "pod/", "jobs", "pods")
	}
	names, err := listNames(o, kind)
	if err != nil {
		return out, noFiles | cobra.ShellCompDirectiveNoSpace
	}
	for _, n := range names {
		if c := prefix + n; strings.HasPrefix(c, toComplete) {
			out = append(out, c)
		}
	}
	return out, noFiles
}

func listNames(o *explain.Options, kind explain.Kind) ([]string, error) {
	cfg, err := o.Flags.ToRESTConfig()
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	ns, _, err := o.Flags.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return nil, err
	}
	ctx := context.Background()
	var names []string
	if kind == explain.KindPod {
		list, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, err
		}
		for _, p := range list.Items {
			names = append(names, p.Name)
		}
		return names, nil
	}
	list, err := client.BatchV1().Jobs(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for _, j := range list.Items {
		if j.Spec.ManagedBy != nil && *j.Spec.ManagedBy == conditions.ManagedBy {
			names = append(names, j.Name)
		}
	}
	return names, nil
}
