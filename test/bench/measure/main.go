package measure

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/coroner-dev/coroner/test/lab"
)

// Main runs the body of a benchmark program: it needs root (rootWhy says what for), keeps
// klog quiet, and gives run a context that SIGINT or SIGTERM ends. An error ends the
// program with status 1, printed after name.
func Main(name, rootWhy string, run func(context.Context) error) {
	fail := func(err error) {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
	if os.Geteuid() != 0 {
		fail(errors.New("root is needed (" + rootWhy + ")"))
	}
	QuietKlog("", 0)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		stop()
		fail(err)
	}
}

// UpLab is the lab that is up, its output sent to stderr, and a client of its API
// server; an error when no lab is up: a benchmark never brings one up or down.
func UpLab(ctx context.Context) (lab.Config, *kubernetes.Clientset, error) {
	cfg, err := lab.DefaultConfig()
	if err != nil {
		return cfg, nil, err
	}
	cfg.Out = os.Stderr
	up, err := cfg.IsUp(ctx)
	if err != nil {
		return cfg, nil, err
	}
	if !up {
		return cfg, nil, errors.New("the lab is not up (make lab; this bench never brings one up or down)")
	}
	cs, err := cfg.Clientset()
	return cfg, cs, err
}

// NodesFlag registers -nodes on fs: a comma-separated list of process nodes into nodes
// (empty: none), whose value so far is the default.
func NodesFlag(fs *flag.FlagSet, nodes *[]string, usage string) {
	fs.Func("nodes", usage+" (default "+strings.Join(*nodes, ",")+"; empty: none)", func(s string) error {
		*nodes = nil
		for n := range strings.SplitSeq(s, ",") {
			if n = strings.TrimSpace(n); n != "" {
				*nodes = append(*nodes, n)
			}
		}
		return nil
	})
}

// WithVMNode is nodes and, when vm and the lab's VM node is Ready, the VM node; note says
// why the VM node is left out, when it is.
func WithVMNode(ctx context.Context, cs kubernetes.Interface, nodes []string, vm bool) (names []string, note string) {
	names = slices.Clone(nodes)
	v := lab.VMNode().Name
	if !vm || slices.Contains(names, v) {
		return names, ""
	}
	if n, err := cs.CoreV1().Nodes().Get(ctx, v, metav1.GetOptions{}); err == nil && NodeReady(n) {
		return append(names, v), ""
	}
	return names, fmt.Sprintf("no VM node %s Ready in the lab: the process nodes only", v)
}
