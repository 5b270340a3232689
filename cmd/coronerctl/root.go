package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes"

	"github.com/coroner-dev/coroner/cmd/coronerctl/chaos"
	"github.com/coroner-dev/coroner/cmd/coronerctl/check"
	"github.com/coroner-dev/coroner/cmd/coronerctl/explain"
	"github.com/coroner-dev/coroner/cmd/coronerctl/quarantine"
)

// version is coronerctl's version, set at build time with
// -ldflags "-X main.version=v0.3.0"; when unset, the module version or the VCS revision
// Go recorded in the binary (buildVersion).
var version = ""

// Exit codes.
const (
	exitOK      = 0
	exitFailed  = 1 // the command failed, or check found problems
	exitUsage   = 2 // a bad command line
	pluginName  = "kubectl-coroner"
	pluginShown = "kubectl coroner"
)

// usageError is a bad command line: one line on stderr, exit code 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// displayName is how the program is invoked: "kubectl coroner" when its binary is named
// kubectl-coroner (a kubectl plugin), else "coronerctl".
func displayName(argv0 string) string {
	if strings.HasPrefix(argv0, pluginName) {
		return pluginShown
	}
	return "coronerctl"
}

// buildVersion is the version recorded in the binary: -X main.version, else the main
// module's version (go install ...@v0.3.0), else the VCS revision of the build with
// "-dirty" for a modified tree, else "(devel)".
func buildVersion() string {
	if version != "" {
		return version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "(devel)"
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	if rev == "" {
		return "(devel)"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if modified == "true" {
		rev += "-dirty"
	}
	return "(devel) " + rev
}

// run runs the command line and returns the exit code.
func run(argv0 string, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	root := newRoot(displayName(argv0), stdin, stdout)
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	if cmd == nil {
		cmd = root
	}
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, check.ErrFailed):
		return exitFailed // the findings are printed
	case isUsage(err):
		fmt.Fprintf(stderr, "%s: %s\n", cmd.CommandPath(), oneLine(err))
		return exitUsage
	}
	fmt.Fprintf(stderr, "%s: %s\n", cmd.CommandPath(), oneLine(err))
	return exitFailed
}

func isUsage(err error) bool {
	var u usageError
	return errors.As(err, &u) || check.IsUsage(err) || explain.IsUsage(err)
}

func oneLine(err error) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), "\n", "; ")), " ")
}

// summaries, with "coronerctl" replaced by how the program is invoked.
const rootLong = `coronerctl: explain and check coroner's decisions.

  coronerctl explain job NAME        every pod of the Job: its state and cause of death, the rule that matched and the action
  coronerctl explain pod NAME        one pod (also job/NAME, pod/NAME; -A for every coroner-managed Job)
  coronerctl check -f job.yaml       validate a Job's failure policy offline
  coronerctl chaos ACTION ARG        inject a failure: evict, drain, preempt anywhere; partition, kill-kubelet, oom, device-fail in the lab
  coronerctl quarantine list         the nodes coroner-shim quarantined (--quarantine); quarantine lift NODE lifts one

Installed on the PATH as kubectl-coroner, it is also "kubectl coroner".`

const explainLong = `For each pod of the Job, existing or deleted: its state (Pending, Waiting, Running,
Restarting, Terminating, Succeeded, Failed, Deleted) and cause (exit codes, the OOM class
coroner-agent stamped, the disruption reason, why a container waits, the exits of in-place
restarts); for a failed pod, the podFailurePolicy rule that matches it and what that did to
the Job; then the Job's per-index state. Pods coroner-shim deleted are told from its Events
on the Job (their last state, its decisions). A Succeeded pod with an OOM stamp is called out.

TARGET is job/NAME, pod/NAME, "job NAME...", "pod NAME..." or NAME... (Jobs). "jobs" alone,
or no TARGET with -A, is every Job handed to coroner-shim (spec.managedBy coroner.dev/shim);
"pods" alone is every pod coroner stamped. -o json|yaml prints the documented report
(apiVersion coroner.dev/v1alpha1, kind JobReport or PodReport, a List for several).`

const explainExample = `  coronerctl explain job/train -n ml
  coronerctl explain train                  # a Job, as "job train"
  coronerctl explain pod/train-2-x7k2p -o yaml
  coronerctl explain -A -o json             # every coroner-managed Job
  coronerctl explain pods -A                # every pod coroner stamped`

const checkLong = `Validates the Jobs (and CronJobs) of a manifest offline with the API server's rules for
failure handling, plus coroner's lints. -f takes files, directories (-R to recurse) and -
for stdin; Lists (kubectl get -o yaml) are checked item by item. Prints one line per finding
(severity, field path, message), a hint shared by several Jobs once at the end; exits 0 when
there are only hints, 1 on any error or warning, 2 when the command line names nothing to
check.`

func named(name, text string) string {
	return strings.ReplaceAll(text, "coronerctl", name)
}

// newRoot builds the command tree; name is "coronerctl" or "kubectl coroner".
func newRoot(name string, stdin io.Reader, stdout io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "coronerctl",
		Short: "Explain and check coroner's decisions",
		Long:  named(name, rootLong),
		// The unknown or missing command is reported by RunE, on one line, exit code 2.
		Args: cobra.ArbitraryArgs,
		RunE: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("missing command; see %s --help", name)
			}
			return usagef("unknown command %q; see %s --help", args[0], name)
		},
		Version:       buildVersion(),
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	if name != "coronerctl" {
		root.Annotations = map[string]string{cobra.CommandDisplayNameAnnotation: name}
	}
	root.SetVersionTemplate(name + " {{.Version}}\n")
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(versionCmd(name), explainCmd(name), checkCmd(name), chaosCmd(name), quarantineCmd(name))
	return root
}

func versionCmd(name string) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), name, buildVersion())
			return err
		},
	}
}

func noArgs(_ *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("unexpected argument %q", args[0])
	}
	return nil
}

func explainCmd(name string) *cobra.Command {
	o := explain.NewOptions()
	cmd := &cobra.Command{
		Use:     "explain [TYPE[/NAME] | TYPE NAME... | NAME...] [-n NAMESPACE | -A] [-o text|json|yaml]",
		Short:   "What happened to a Job's pods and why",
		Long:    named(name, explainLong),
		Example: named(name, explainExample),
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.Run(cmd.Context(), args, cmd.OutOrStdout())
		},
		ValidArgsFunction: func(_ *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
			return completeTargets(o, args, toComplete)
		},
	}
	o.Flags.AddFlags(cmd.Flags())
	cmd.Flags().BoolVarP(&o.AllNamespaces, "all-namespaces", "A", false, "Every namespace: with no TARGET or \"jobs\", every coroner-managed Job; with \"pods\", every pod coroner stamped.")
	cmd.Flags().StringVarP(&o.Output, "output", "o", o.Output, "Output format: text, json or yaml.")
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{explain.OutputText, explain.OutputJSON, explain.OutputYAML}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

func checkCmd(name string) *cobra.Command {
	o := check.NewOptions()
	cmd := &cobra.Command{
		Use:   "check -f FILE|DIR|- [-R]",
		Short: "Validate a Job's failure policy offline",
		Long:  named(name, checkLong),
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usagef("unexpected argument %q; name files with -f", args[0])
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.Run(cmd.OutOrStdout(), cmd.InOrStdin())
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

func chaosCmd(name string) *cobra.Command {
	o := chaos.NewOptions()
	o.Flags = genericclioptions.NewConfigFlags(true)
	cmd := &cobra.Command{
		Use:   "chaos ACTION ARG [ARG]",
		Short: "Inject a failure on purpose: evict, drain, preempt; partition, kill-kubelet, oom, device-fail in the lab",
		Long:  named(name, chaos.Usage),
		Args: func(_ *cobra.Command, args []string) error {
			o.FromFlags()
			if err := o.Validate(args); err != nil {
				return usageError{err}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.Run(cmd.Context(), args, cmd.OutOrStdout())
		},
		ValidArgs: []string{"evict", "drain", "uncordon", "preempt", "unpreempt", "partition", "heal", "kill-kubelet", "start-kubelet", "oom", "devices", "device-fail", "device-heal"},
	}
	o.Flags.AddFlags(cmd.Flags())
	o.AddFlags(cmd.Flags())
	return cmd
}

// quarantineCmd is `quarantine list` and `quarantine lift NODE`, with kubectl's flags.
func quarantineCmd(name string) *cobra.Command {
	flags := genericclioptions.NewConfigFlags(true)
	client := func() (kubernetes.Interface, error) {
		cfg, err := flags.ToRESTConfig()
		if err != nil {
			return nil, fmt.Errorf("loading the client configuration: %w", err)
		}
		cfg.UserAgent = "coronerctl-quarantine"
		return kubernetes.NewForConfig(cfg)
	}
	cmd := &cobra.Command{
		Use:   "quarantine list | lift NODE",
		Short: "The nodes coroner-shim quarantined; lift one by hand",
		Long:  named(name, quarantine.Usage),
		Args:  cobra.ArbitraryArgs,
		RunE: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("missing subcommand: list, or lift NODE")
			}
			return usagef("unknown subcommand %q: list, or lift NODE", args[0])
		},
	}
	list := &cobra.Command{
		Use:   "list",
		Short: "Every node with the taint coroner.dev/quarantined: cause, since when, whether it schedules",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cs, err := client()
			if err != nil {
				return err
			}
			rows, err := quarantine.List(cmd.Context(), cs)
			if err != nil {
				return err
			}
			return quarantine.Print(cmd.OutOrStdout(), rows, time.Now())
		},
	}
	lift := &cobra.Command{
		Use:   "lift NODE",
		Short: "Remove the taint coroner.dev/quarantined of NODE (and nothing else), with your credentials",
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("lift takes one NODE, not %d arguments", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			cs, err := client()
			if err != nil {
				return err
			}
			return quarantine.Lift(cmd.Context(), cs, cmd.OutOrStdout(), args[0])
		},
	}
	flags.AddFlags(cmd.PersistentFlags())
	cmd.AddCommand(list, lift)
	return cmd
}
