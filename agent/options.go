// Package agent is coroner's node side: it watches the container runtime for exits, OOM
// kills and evictions on its own node and stamps the pods with why they died before they
// are deleted, and it can fence its node when it loses the API server.
package agent

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Options are the settings of coroner-agent, filled from flags.
type Options struct {
	Kubeconfig          string
	NodeName            string
	RuntimeEndpoint     string
	ContainerdNamespace string
	RelistPeriod        time.Duration
	PhaseGrace          time.Duration
	ExitHistorySize     int
	Fencing             bool
	FenceAfter          time.Duration
	MetricsAddress      string
	QPS                 float32
	Burst               int
}

// NewOptions returns the defaults.
func NewOptions() *Options {
	return &Options{
		RuntimeEndpoint:     "unix:///run/containerd/containerd.sock",
		ContainerdNamespace: "k8s.io",
		RelistPeriod:        time.Second,
		PhaseGrace:          5 * time.Second,
		ExitHistorySize:     10,
		Fencing:             false,
		FenceAfter:          2 * time.Minute,
		MetricsAddress:      ":8090",
		QPS:                 5,
		Burst:               10,
	}
}

// AddFlags registers every option on fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "Path to a kubeconfig file; empty means the in-cluster config (service account), then $KUBECONFIG.")
	fs.StringVar(&o.NodeName, "node-name", o.NodeName, "This node's name; default $NODE_NAME, else the hostname.")
	fs.StringVar(&o.RuntimeEndpoint, "runtime-endpoint", o.RuntimeEndpoint, "CRI endpoint of the container runtime (unix:// socket).")
	fs.StringVar(&o.ContainerdNamespace, "containerd-namespace", o.ContainerdNamespace, "containerd namespace of the kubelet's containers, for containerd's event stream.")
	fs.DurationVar(&o.RelistPeriod, "relist-period", o.RelistPeriod, "How often to relist containers when the runtime has no GetContainerEvents stream.")
	fs.DurationVar(&o.PhaseGrace, "phase-grace", o.PhaseGrace, "How long a deleted pod whose containers all exited may keep phase Running before the agent sets a terminal phase (the kubelet's chance to do it first).")
	fs.IntVar(&o.ExitHistorySize, "exit-history-size", o.ExitHistorySize, "How many container exits to keep in the coroner.dev/exit-history annotation of restarting pods.")
	fs.BoolVar(&o.Fencing, "fencing", o.Fencing, "Stop opted-in containers when the API server has been unreachable for --fence-after.")
	fs.DurationVar(&o.FenceAfter, "fence-after", o.FenceAfter, "How long without the API server before fencing.")
	fs.StringVar(&o.MetricsAddress, "metrics-bind-address", o.MetricsAddress, "host:port that serves /metrics and /healthz; \"0\" turns it off.")
	fs.Float32Var(&o.QPS, "kube-api-qps", o.QPS, "Steady queries per second to the API server.")
	fs.IntVar(&o.Burst, "kube-api-burst", o.Burst, "Burst of queries to the API server; at least --kube-api-qps.")
}

// Complete fills the node name from $NODE_NAME, then the hostname.
func (o *Options) Complete() error {
	if o.NodeName == "" {
		o.NodeName = os.Getenv("NODE_NAME")
	}
	if o.NodeName == "" {
		h, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("no --node-name, no $NODE_NAME, and no hostname: %w", err)
		}
		o.NodeName = strings.ToLower(h)
	}
	return nil
}

// Validate reports every invalid option at once.
func (o *Options) Validate() error {
	var errs []error
	if msgs := validation.IsDNS1123Subdomain(o.NodeName); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("node name %q: %s", o.NodeName, strings.Join(msgs, "; ")))
	}
	if u, err := url.Parse(o.RuntimeEndpoint); err != nil || u.Scheme != "unix" || u.Path == "" {
		errs = append(errs, fmt.Errorf("--runtime-endpoint=%q: want unix:///path/to/socket", o.RuntimeEndpoint))
	}
	if o.ContainerdNamespace == "" {
		errs = append(errs, errors.New("--containerd-namespace must not be empty"))
	}
	if o.RelistPeriod < 100*time.Millisecond {
		errs = append(errs, fmt.Errorf("--relist-period=%v: must be at least 100ms", o.RelistPeriod))
	}
	if o.PhaseGrace < 0 {
		errs = append(errs, fmt.Errorf("--phase-grace=%v: must not be negative", o.PhaseGrace))
	}
	if o.ExitHistorySize < 1 || o.ExitHistorySize > 50 {
		errs = append(errs, fmt.Errorf("--exit-history-size=%d: must be between 1 and 50", o.ExitHistorySize))
	}
	if o.Fencing && o.FenceAfter < 10*time.Second {
		errs = append(errs, fmt.Errorf("--fence-after=%v: must be at least 10s, or a blip would stop workloads", o.FenceAfter))
	}
	if o.MetricsAddress != "0" && !strings.Contains(o.MetricsAddress, ":") {
		errs = append(errs, fmt.Errorf("--metrics-bind-address=%q: want host:port (or \"0\" for off)", o.MetricsAddress))
	}
	if o.QPS <= 0 || float32(o.Burst) < o.QPS {
		errs = append(errs, fmt.Errorf("--kube-api-qps=%v, --kube-api-burst=%d: need 0 < qps <= burst", o.QPS, o.Burst))
	}
	return errors.Join(errs...)
}
