package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes"

	"github.com/coroner-dev/coroner/internal/cli"
)

// Usage is the summary of `coronerctl chaos --help`.
const Usage = `coronerctl chaos ACTION ARG [flags]: inject a failure on purpose, to watch coroner handle it.
Each action prints what it did and how to undo it.

On any cluster (through the API server):
  evict POD          evict the pod through the eviction API (DisruptionTarget EvictionByEvictionAPI)
  drain NODE         cordon the node and evict its pods but DaemonSet and static ones, as kubectl drain
  uncordon NODE      make the node schedulable again (undoes drain)
  preempt NODE       a pod of higher priority that needs the node's CPU: the scheduler preempts the
                     pods of lower priority that request CPU there (DisruptionTarget PreemptionByScheduler)
  unpreempt NODE     delete that pod (undoes preempt)

In coroner's lab on this machine (make lab; root), or on a node of its kind cluster (make kind-lab):
  partition NODE     take the node off the network (its veth link down): NotReady, then tainted unreachable
  heal NODE          put it back (link up)
  kill-kubelet NODE  SIGKILL the node's kubelet; its containers keep running
  start-kubelet NODE start it again (undoes kill-kubelet)
  oom POD            make the kernel OOM-kill a task of the pod by lowering its cgroup's memory limit
                     to what it uses (a pod over its own limit); with --node, lower the limit of all
                     the node's pods instead (the node out of memory). The pod must be allocating.
  devices NODE       list the node's test GPUs (coroner.dev/test-gpu, the lab's device plugin) and their health
  device-fail NODE [DEVICE|pod/NAME]
                     turn a test GPU Unhealthy (default: the node's first healthy one; pod/NAME: the
                     one the pod holds): the kubelet reports it in the pod's allocatedResourcesStatus,
                     a program watching /run/coroner-test-gpu/DEVICE in the container sees it at once;
                     with --xid N, first the NVIDIA driver's Xid line N for its PCI address in the
                     node's kernel log
  device-heal NODE [DEVICE]
                     turn it Healthy again (default: every Unhealthy one of the node)
  device-xid NODE DEVICE|pod/NAME --xid N
                     only write the NVIDIA driver's Xid line N for the device's PCI address to the
                     node's kernel log, its health left as it is (NVIDIA's plugin leaves a GPU
                     Healthy on an application Xid: 13, 31, 43, 45, 68, 109)`

// Options are the flags of `coronerctl chaos`.
type Options struct {
	// Kubeconfig, Context and Namespace say which cluster and namespace; with Flags set
	// (kubectl's flags, as coronerctl registers them) they are read from Flags at Run.
	Kubeconfig string
	Context    string
	Namespace  string
	// Flags, when set, are kubectl's kubeconfig, context, namespace and credential flags.
	Flags *genericclioptions.ConfigFlags
	// Node makes oom lower the node's limit rather than the pod's.
	Node bool
	// Timeout bounds the wait of drain, preempt and oom.
	Timeout time.Duration
	// Image is the preemptor pod's image; PullPolicy its pull policy.
	Image      string
	PullPolicy string
	// Priority is the preemptor's priority.
	Priority int32
	// LabDir is the repository whose lab the node-side actions act on; default the
	// repository that holds the working directory or this program.
	LabDir string
	// Xid makes device-fail write the NVIDIA driver's Xid line of this number first.
	Xid int
}

// NewOptions returns the defaults.
func NewOptions() *Options {
	return &Options{Timeout: 2 * time.Minute, Image: defaultPreemptorImage, PullPolicy: string(corev1.PullIfNotPresent), Priority: defaultPreemptorPriority}
}

// AddClientFlags registers --kubeconfig, --context and -n on fs, for a command that
// does not register kubectl's flags (Flags).
func (o *Options) AddClientFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "Path to a kubeconfig file; default $KUBECONFIG, else ~/.kube/config.")
	fs.StringVar(&o.Context, "context", o.Context, "The kubeconfig context to use; default its current context.")
	fs.StringVarP(&o.Namespace, "namespace", "n", o.Namespace, "Namespace of the POD (evict, oom) or of the preemptor pod (preempt, unpreempt); default the context's namespace, else default.")
}

// AddFlags registers the options of the actions on fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&o.Node, "node", o.Node, "oom: lower the memory limit of all the pods of the POD's node (kubepods), so the node is out of memory, instead of the pod's own.")
	fs.DurationVar(&o.Timeout, "timeout", o.Timeout, "How long drain waits for the evicted pods, preempt for the preemptor to be scheduled, oom for an OOM kill.")
	fs.StringVar(&o.Image, "image", o.Image, "preempt: the preemptor pod's image (it only has to start; in the lab use registry.k8s.io/pause:coroner).")
	fs.StringVar(&o.PullPolicy, "image-pull-policy", o.PullPolicy, "preempt: the preemptor's imagePullPolicy: Always, IfNotPresent or Never.")
	fs.Int32Var(&o.Priority, "priority", o.Priority, "preempt: the preemptor's priority; pods of this priority or more are not preempted.")
	fs.StringVar(&o.LabDir, "lab-repo", o.LabDir, "The coroner repository whose lab partition, heal, kill-kubelet, start-kubelet, oom and the device actions act on; default the one that holds the working directory or coronerctl.")
	fs.IntVar(&o.Xid, "xid", o.Xid, "device-fail: first write the NVIDIA driver's Xid line of this number; device-xid: write only that line, the device's health left as it is (1-999; 79: fallen off the bus, 48: double-bit ECC) for the device's PCI address to the node's kernel log.")
}

// actions maps each action to whether it acts on a node or a pod, and whether it needs
// the lab.
var actions = map[string]struct {
	arg string // "NODE" or "POD"
	lab bool
	// optional names a second argument the action may take.
	optional string
}{
	"evict": {"POD", false, ""}, "drain": {"NODE", false, ""}, "uncordon": {"NODE", false, ""},
	"preempt": {"NODE", false, ""}, "unpreempt": {"NODE", false, ""},
	"partition": {"NODE", true, ""}, "heal": {"NODE", true, ""}, "kill-kubelet": {"NODE", true, ""},
	"start-kubelet": {"NODE", true, ""}, "oom": {"POD", true, ""},
	"devices": {"NODE", true, ""}, "device-fail": {"NODE", true, "DEVICE|pod/NAME"}, "device-heal": {"NODE", true, "DEVICE"},
	"device-xid": {"NODE", true, "DEVICE|pod/NAME"},
}

// Validate checks the arguments and flags before anything is done.
func (o *Options) Validate(args []string) error {
	if len(args) == 0 {
		return errors.New("missing ACTION; see coronerctl chaos --help")
	}
	a, ok := actions[args[0]]
	if !ok {
		return fmt.Errorf("unknown action %q; see coronerctl chaos --help", args[0])
	}
	if len(args) < 2 || args[1] == "" || len(args) > 3 || (len(args) == 3 && (a.optional == "" || args[2] == "")) {
		if a.optional != "" {
			return fmt.Errorf("usage: coronerctl chaos %s %s [%s]", args[0], a.arg, a.optional)
		}
		return fmt.Errorf("usage: coronerctl chaos %s %s", args[0], a.arg)
	}
	var errs []error
	if o.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("--timeout must be positive, got %v", o.Timeout))
	}
	switch corev1.PullPolicy(o.PullPolicy) {
	case corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever:
	default:
		errs = append(errs, fmt.Errorf("--image-pull-policy must be Always, IfNotPresent or Never, got %q", o.PullPolicy))
	}
	if o.Node && args[0] != "oom" {
		errs = append(errs, fmt.Errorf("--node is a flag of oom, not of %s", args[0]))
	}
	if o.Xid != 0 && args[0] != "device-fail" && args[0] != "device-xid" {
		errs = append(errs, fmt.Errorf("--xid is a flag of device-fail and device-xid, not of %s", args[0]))
	}
	if args[0] == "device-xid" && (o.Xid == 0 || len(args) != 3) {
		errs = append(errs, errors.New("usage: coronerctl chaos device-xid NODE DEVICE|pod/NAME --xid N"))
	}
	if o.Xid < 0 || o.Xid > 999 {
		errs = append(errs, fmt.Errorf("--xid must be an Xid number from 1 to 999, got %d", o.Xid))
	}
	if o.Priority <= 0 {
		errs = append(errs, fmt.Errorf("--priority must be positive, got %d", o.Priority))
	}
	return errors.Join(errs...)
}

// Run does the action of args ("partition lab-node-2") and prints what it did and how
// to undo it to w.
func (o *Options) Run(ctx context.Context, args []string, w io.Writer) error {
	if err := o.Validate(args); err != nil {
		return err
	}
	action, target := args[0], args[1]
	var undo string
	var err error
	if actions[action].lab {
		undo, err = o.runLab(ctx, action, args[1:], w)
	} else {
		undo, err = o.runCluster(ctx, action, target, w)
	}
	if undo != "" {
		// Also after an error: a drain that timed out has cordoned the node all the same.
		fmt.Fprintf(w, "undo: %s\n", undo)
	}
	return err
}

// client returns a clientset and the namespace of -n or the kubeconfig context.
func (o *Options) client() (kubernetes.Interface, string, error) {
	if o.Flags == nil {
		return cli.UserClient(o.Kubeconfig, o.Context, o.Namespace, "coronerctl-chaos")
	}
	if o.Flags.KubeConfig != nil && *o.Flags.KubeConfig == "" && o.Kubeconfig != "" {
		// The lab's kubeconfig, chosen by a lab action when none was given.
		*o.Flags.KubeConfig = o.Kubeconfig
	}
	cfg, err := o.Flags.ToRESTConfig()
	if err != nil {
		return nil, "", fmt.Errorf("loading the client configuration: %w", err)
	}
	cfg.UserAgent = "coronerctl-chaos"
	ns, _, err := o.Flags.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return nil, "", err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	return cs, ns, err
}

// FromFlags copies kubectl's flags (Flags) into Kubeconfig, Context and Namespace, which
// the actions read.
func (o *Options) FromFlags() {
	if o.Flags == nil {
		return
	}
	for _, f := range []struct{ dst, src *string }{{&o.Kubeconfig, o.Flags.KubeConfig}, {&o.Context, o.Flags.Context}, {&o.Namespace, o.Flags.Namespace}} {
		if f.src != nil {
			*f.dst = *f.src
		}
	}
}

func (o *Options) runCluster(ctx context.Context, action, target string, w io.Writer) (string, error) {
	cs, ns, err := o.client()
	if err != nil {
		return "", err
	}
	switch action {
	case "evict":
		return Evict(ctx, cs, w, ns, target)
	case "drain":
		return Drain(ctx, cs, w, target, DrainOptions{Timeout: o.Timeout})
	case "uncordon":
		return Uncordon(ctx, cs, w, target)
	case "preempt":
		return Preempt(ctx, cs, w, target, PreemptOptions{
			Namespace: ns, Image: o.Image, PullPolicy: corev1.PullPolicy(o.PullPolicy), Priority: o.Priority, Timeout: o.Timeout,
		})
	case "unpreempt":
		return Unpreempt(ctx, cs, w, target, ns)
	}
	return "", fmt.Errorf("unknown action %q", action)
}

// labProgram is the program that does the node-side actions: coroner-lab, which links
// the lab's code (test/lab, test/kind) so that coronerctl does not.
const labProgram = "coroner-lab"

// runLab has coroner-lab do a node-side action (partition, heal, kill-kubelet,
// start-kubelet, oom, devices, device-fail, device-heal) on this machine's lab or kind
// cluster: the coroner-lab beside
// coronerctl (make build puts both in _output/bin), else the one on PATH. Its output,
// the "undo:" line included, goes to w.
func (o *Options) runLab(ctx context.Context, action string, targets []string, w io.Writer) (string, error) {
	bin, err := findLabProgram()
	if err != nil {
		return "", err
	}
	args := append(append([]string{"chaos", action}, targets...), "--timeout="+o.Timeout.String())
	if o.Node {
		args = append(args, "--node")
	}
	if o.Xid != 0 {
		args = append(args, "--xid="+strconv.Itoa(o.Xid))
	}
	for _, f := range []struct{ name, value string }{{"kubeconfig", o.Kubeconfig}, {"context", o.Context}, {"namespace", o.Namespace}, {"lab-repo", o.LabDir}} {
		if f.value != "" {
			args = append(args, "--"+f.name+"="+f.value)
		}
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s %s: %w", labProgram, action, err)
	}
	return "", nil
}

// findLabProgram is coroner-lab beside this program, else on PATH.
func findLabProgram() (string, error) {
	if exe, err := os.Executable(); err == nil {
		if exe, err = filepath.EvalSymlinks(exe); err == nil {
			p := filepath.Join(filepath.Dir(exe), labProgram)
			if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
				return p, nil
			}
		}
	}
	if p, err := exec.LookPath(labProgram); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("partition, heal, kill-kubelet, start-kubelet, oom and the device actions act on coroner's lab or kind cluster on this machine, through %s (make build puts it beside coronerctl in _output/bin): not found beside coronerctl nor on PATH", labProgram)
}
