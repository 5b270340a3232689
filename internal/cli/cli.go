// Package cli is what coroner's mains (cmd/, and test/lab/cmd/coroner-lab) share: flag
// parsing that prints the full usage only for --help and a single line for a bad flag, and
// the client configuration.
package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// ExitUsage is the exit code for a bad command line.
const ExitUsage = 2

// Parse parses args into fs. With --help it prints the usage (summary first) to stdout and
// exits 0; with a bad flag it prints one line to stderr and exits ExitUsage.
func Parse(fs *pflag.FlagSet, summary string, args []string) {
	fs.Init(fs.Name(), pflag.ContinueOnError)
	fs.SortFlags = false
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(args)
	if errors.Is(err, pflag.ErrHelp) {
		fmt.Fprintf(os.Stdout, "%s\n\nFlags:\n%s", summary, fs.FlagUsages())
		os.Exit(0)
	}
	if err != nil {
		Fail(fs.Name(), err)
	}
}

// Fail prints "name: err" on one line and exits ExitUsage.
func Fail(name string, err error) {
	fmt.Fprintf(os.Stderr, "%s: %s\n", name, oneLine(err))
	os.Exit(ExitUsage)
}

func oneLine(err error) string {
	s := err.Error()
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] == '\n' {
			out = append(out, ';', ' ')
			continue
		}
		out = append(out, s[i])
	}
	return string(out)
}

// RESTConfig loads the client configuration: the kubeconfig file when one is given, else
// the in-cluster service account, else $KUBECONFIG or ~/.kube/config.
func RESTConfig(kubeconfig string, qps float32, burst int, userAgent string) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else if cfg, err = rest.InClusterConfig(); err != nil {
		rules := clientcmd.NewDefaultClientConfigLoadingRules()
		cfg, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("loading the client configuration: %w", err)
	}
	cfg.QPS, cfg.Burst = qps, burst
	cfg.UserAgent = userAgent
	return cfg, nil
}

// UserClient is how a command-line tool (coronerctl) finds its cluster, as kubectl does:
// the kubeconfig file given, else $KUBECONFIG, else ~/.kube/config, with the context and
// namespace given or the kubeconfig's current ones (namespace "default" when it has none).
// It returns a clientset and the namespace.
func UserClient(kubeconfig, context, namespace, userAgent string) (kubernetes.Interface, string, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	overrides := &clientcmd.ConfigOverrides{CurrentContext: context}
	overrides.Context.Namespace = namespace
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides)
	cfg, err := cc.ClientConfig()
	if err != nil {
		return nil, "", fmt.Errorf("loading the client configuration: %w", err)
	}
	ns, _, err := cc.Namespace()
	if err != nil {
		return nil, "", err
	}
	cfg.UserAgent = userAgent
	cs, err := kubernetes.NewForConfig(cfg)
	return cs, ns, err
}

// Quote is a command-line argument as a shell would need it (for the "undo:" lines).
func Quote(s string) string {
	if s != "" && !strings.ContainsAny(s, " \t\n'\"\\$`;&|<>()*?[]{}~#!") {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
