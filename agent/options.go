package agent

// The agent's flags: Options, their defaults, completion and validation.

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/coroner-dev/coroner/agent/nvidia"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/cri"
)

// Options are the settings of coroner-agent, filled from flags.
type Options struct {
	Kubeconfig          string
	NodeName            string
	RuntimeEndpoint     string
	RuntimeHostPrefix   string
	ContainerdNamespace string
	ContainerdEvents    bool
	RelistPeriod        time.Duration
	CgroupRoot          string
	KmsgPath            string
	NvidiaGPUsDir       string
	UserSpaceXids       bool
	PodResourcesSocket  string
	DeviceWindow        time.Duration
	PhaseGrace          time.Duration
	ExitHistorySize     int
	StampBatchPeriod    time.Duration
	ShutdownGrace       time.Duration
	Fencing             bool
	FenceAfter          time.Duration
	FenceSignal         string
	LeaseNamespace      string
	// PodName and PodNamespace are the agent's own pod ($POD_NAME, --pod-name;
	// $POD_NAMESPACE, else the Lease's namespace), named on its Lease with
	// --fence-signal=node-lease.
	PodName        string
	PodNamespace   string
	MetricsAddress string
	OOMScoreAdj    string
	QPS            float32
	Burst          int
}

// NewOptions returns the defaults; the Lease's namespace is $POD_NAMESPACE, else
// coroner-system.
func NewOptions() *Options {
	ns := os.Getenv("POD_NAMESPACE")
	if ns == "" {
		ns = "coroner-system"
	}
	return &Options{
		RuntimeEndpoint:     cri.EndpointAuto,
		ContainerdNamespace: "k8s.io",
		ContainerdEvents:    true,
		RelistPeriod:        time.Second,
		CgroupRoot:          "/sys/fs/cgroup",
		KmsgPath:            "/dev/kmsg",
		NvidiaGPUsDir:       nvidia.GPUsDir,
		PodResourcesSocket:  DefaultPodResourcesSocket,
		DeviceWindow:        DefaultDeviceWindow,
		PhaseGrace:          5 * time.Second,
		ExitHistorySize:     10,
		StampBatchPeriod:    100 * time.Millisecond,
		ShutdownGrace:       DefaultShutdownGrace,
		Fencing:             false,
		FenceAfter:          2 * time.Minute,
		FenceSignal:         conditions.FenceSignalNodeLease,
		LeaseNamespace:      ns,
		PodName:             os.Getenv("POD_NAME"),
		PodNamespace:        ns,
		MetricsAddress:      ":8090",
		OOMScoreAdj:         DefaultOOMScoreAdj,
		QPS:                 50,
		Burst:               100,
	}
}

// AddFlags registers every option on fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "Path to a kubeconfig file; empty means the in-cluster config (service account), then $KUBECONFIG.")
	fs.StringVar(&o.NodeName, "node-name", o.NodeName, "This node's name; default $NODE_NAME, else the hostname.")
	fs.StringVar(&o.RuntimeEndpoint, "runtime-endpoint", o.RuntimeEndpoint, "CRI endpoint of the container runtime (unix:///path/to/socket); \"auto\" (or empty): the first of "+strings.Join(cri.DefaultSockets, ", ")+" (under --runtime-host-prefix) that answers CRI, retried until one does.")
	fs.StringVar(&o.RuntimeHostPrefix, "runtime-host-prefix", o.RuntimeHostPrefix, "With --runtime-endpoint=auto: where the host's socket directories are mounted in the agent's container, prepended to every candidate (e.g. /host when the host's /run is mounted at /host/run); empty: at their own paths.")
	fs.StringVar(&o.ContainerdNamespace, "containerd-namespace", o.ContainerdNamespace, "containerd namespace of the kubelet's containers, for containerd's event stream.")
	fs.BoolVar(&o.ContainerdEvents, "containerd-events", o.ContainerdEvents, "Where the runtime is containerd, also follow its event service (task exits and OOM kills) on the same socket: exits are seen in tens of milliseconds instead of up to a relist period.")
	fs.DurationVar(&o.RelistPeriod, "relist-period", o.RelistPeriod, "How often to relist containers when the runtime has no GetContainerEvents stream.")
	fs.StringVar(&o.CgroupRoot, "cgroup-root", o.CgroupRoot, "Where the cgroup hierarchies are mounted, to read containers' memory counters (OOM evidence); empty turns cgroup reading off.")
	fs.StringVar(&o.KmsgPath, "kmsg-path", o.KmsgPath, "The kernel log device, to read the kernel's OOM kill reports (which cgroup hit its limit); needs CAP_SYSLOG; empty turns it off.")
	fs.StringVar(&o.NvidiaGPUsDir, "nvidia-gpus-dir", o.NvidiaGPUsDir, "The NVIDIA driver's GPU list (one directory per PCI address, with an information file), which maps the PCI address of an Xid in the kernel log to the GPU's UUID, the device ID of NVIDIA's device plugin; a hardware Xid then blames the GPU of the container holding it. A missing directory means no NVIDIA driver (said once); empty turns Xids off. procfs's /proc/driver is the host's in any container, so no mount is needed.")
	fs.BoolVar(&o.UserSpaceXids, "user-space-xids", o.UserSpaceXids, "Also read NVIDIA Xid lines that a program wrote to the kernel log (/dev/kmsg records of the user facility), not only the driver's (the kernel facility). For test clusters whose GPUs are emulated: the lab's test GPUs write their Xids so. Never for OOM kills, which are read from the kernel's records only. Off by default: on a real node only the driver's word counts.")
	fs.StringVar(&o.PodResourcesSocket, "pod-resources-socket", o.PodResourcesSocket, "The kubelet's PodResources API socket, asked which device IDs a dying container holds when its pod's status does not list them (no allocatedResourcesStatus: the kubelet's ResourceHealthStatus feature off, or a kubelet before 1.36). Asked only then, never at rest; a missing socket is said once. Empty turns it off.")
	fs.DurationVar(&o.DeviceWindow, "device-window", o.DeviceWindow, "How long after a container's death (non-zero exit) one of its devices turning Unhealthy, or a hardware Xid on its GPU, still explains the death: the program often dies of the fault before the device plugin reports it. The pod's coroner.dev/DeviceFailed=False (no device to blame) comes when it is over. Between 1s and 2m.")
	fs.DurationVar(&o.PhaseGrace, "phase-grace", o.PhaseGrace, "How long a deleted pod whose containers all exited may keep phase Running before the agent sets a terminal phase (the kubelet's chance to do it first).")
	fs.IntVar(&o.ExitHistorySize, "exit-history-size", o.ExitHistorySize, "How many container exits to keep in the coroner.dev/exit-history annotation of restarting pods.")
	fs.DurationVar(&o.StampBatchPeriod, "stamp-batch-period", o.StampBatchPeriod, "How long a pod's first pending stamp waits for others of the same pod: at most one write per pod per period.")
	fs.DurationVar(&o.ShutdownGrace, "shutdown-grace-period", o.ShutdownGrace, "On SIGTERM (a rollout, a node drain): how long the agent may go on classifying the exits it has seen and writing their pending stamps before it exits; keep it under the pod's terminationGracePeriodSeconds. 0: exit at once.")
	fs.BoolVar(&o.Fencing, "fencing", o.Fencing, "Fence the node (requirement A6): renew the Lease coroner-agent-<node> in --lease-namespace every --fence-after/4, and when no renewal has succeeded for --fence-after, stop the containers of the node's opted-in pods (coroner.dev/safe-to-forcefully-delete) until one does. Off: no Lease, nothing is ever stopped.")
	fs.DurationVar(&o.FenceAfter, "fence-after", o.FenceAfter, "With --fencing: how long without a Lease renewal (the API server lost) before the agent fences the node; at least 10s.")
	fs.StringVar(&o.FenceSignal, "fence-signal", o.FenceSignal, "With --fencing: what tells the agent that its node reaches the API server. node-lease (the default): its kubelet's own Lease in kube-node-lease, which the agent watches (no write at rest; the agent's Lease is written at start and after a fence); the node is fenced when that Lease has gone --fence-after without a renewal. agent-lease: the agent renews a Lease of its own every --fence-after/4 (a write per node every 10 s at most).")
	fs.StringVar(&o.PodName, "pod-name", o.PodName, "With --fencing and --fence-signal=node-lease: the agent's own pod (default $POD_NAME; its namespace is $POD_NAMESPACE), named on its Lease: the shim trusts a fence only from an agent whose pod was ready.")
	fs.StringVar(&o.LeaseNamespace, "lease-namespace", o.LeaseNamespace, "With --fencing: namespace of the agent's Lease (default $POD_NAMESPACE, else coroner-system).")
	fs.StringVar(&o.MetricsAddress, "metrics-bind-address", o.MetricsAddress, "host:port that serves /metrics and /healthz; \"0\" turns it off.")
	fs.StringVar(&o.OOMScoreAdj, "oom-score-adj", o.OOMScoreAdj, "The agent's own /proc/self/oom_score_adj, set at start: -999, the kubelet's and containerd's own, so that a node OOM kills every pod (Guaranteed pods get -997, their pause containers -998) before the agent that reports on the kill. Needs CAP_SYS_RESOURCE (the DaemonSet is privileged); where it cannot be set the agent logs why and goes on. Empty: keep the value the runtime gave (the QoS class's).")
	fs.Float32Var(&o.QPS, "kube-api-qps", o.QPS, "Steady queries per second to the API server (the pod writes and their Events); the kubelet's own default, since the agent writes about the same deaths the kubelet reports. At 5, a storm of 700 exits a minute left stamps 14s behind (make bench-agent-storm).")
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
	if cri.IsAuto(o.RuntimeEndpoint) {
		if o.RuntimeHostPrefix != "" && !strings.HasPrefix(o.RuntimeHostPrefix, "/") {
			errs = append(errs, fmt.Errorf("--runtime-host-prefix=%q: want an absolute path (or empty)", o.RuntimeHostPrefix))
		}
	} else {
		if u, err := url.Parse(o.RuntimeEndpoint); err != nil || u.Scheme != "unix" || u.Path == "" {
			errs = append(errs, fmt.Errorf("--runtime-endpoint=%q: want unix:///path/to/socket, or auto", o.RuntimeEndpoint))
		}
		if o.RuntimeHostPrefix != "" {
			errs = append(errs, fmt.Errorf("--runtime-host-prefix=%q applies to --runtime-endpoint=auto only; give the explicit endpoint's path as the agent sees it", o.RuntimeHostPrefix))
		}
	}
	if o.ContainerdNamespace == "" {
		errs = append(errs, errors.New("--containerd-namespace must not be empty"))
	}
	if o.RelistPeriod < 100*time.Millisecond {
		errs = append(errs, fmt.Errorf("--relist-period=%v: must be at least 100ms", o.RelistPeriod))
	}
	if o.CgroupRoot != "" && !strings.HasPrefix(o.CgroupRoot, "/") {
		errs = append(errs, fmt.Errorf("--cgroup-root=%q: want an absolute path (or empty for off)", o.CgroupRoot))
	}
	if o.KmsgPath != "" && !strings.HasPrefix(o.KmsgPath, "/") {
		errs = append(errs, fmt.Errorf("--kmsg-path=%q: want an absolute path (or empty for off)", o.KmsgPath))
	}
	if o.NvidiaGPUsDir != "" && !strings.HasPrefix(o.NvidiaGPUsDir, "/") {
		errs = append(errs, fmt.Errorf("--nvidia-gpus-dir=%q: want an absolute path (or empty for off)", o.NvidiaGPUsDir))
	}
	if o.PodResourcesSocket != "" && !strings.HasPrefix(o.PodResourcesSocket, "/") {
		errs = append(errs, fmt.Errorf("--pod-resources-socket=%q: want an absolute path (or empty for off)", o.PodResourcesSocket))
	}
	if o.DeviceWindow < time.Second || o.DeviceWindow > 2*time.Minute {
		errs = append(errs, fmt.Errorf("--device-window=%v: must be between 1s and 2m", o.DeviceWindow))
	}
	if o.StampBatchPeriod < 10*time.Millisecond || o.StampBatchPeriod > 10*time.Second {
		errs = append(errs, fmt.Errorf("--stamp-batch-period=%v: must be between 10ms and 10s", o.StampBatchPeriod))
	}
	if o.ShutdownGrace < 0 || o.ShutdownGrace > 5*time.Minute {
		errs = append(errs, fmt.Errorf("--shutdown-grace-period=%v: must be between 0 and 5m", o.ShutdownGrace))
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
	if o.Fencing {
		if msgs := validation.IsDNS1123Label(o.LeaseNamespace); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("--lease-namespace=%q: %s", o.LeaseNamespace, strings.Join(msgs, "; ")))
		}
		switch o.FenceSignal {
		case conditions.FenceSignalAgentLease:
		case conditions.FenceSignalNodeLease:
			if o.PodName == "" {
				errs = append(errs, errors.New("--fence-signal=node-lease needs the agent's pod: set $POD_NAME (the DaemonSet does, from metadata.name) or --pod-name; the shim trusts a fence only from an agent whose pod it sees ready"))
			} else if msgs := validation.IsDNS1123Subdomain(o.PodName); len(msgs) > 0 {
				errs = append(errs, fmt.Errorf("--pod-name=%q: %s", o.PodName, strings.Join(msgs, "; ")))
			}
		default:
			errs = append(errs, fmt.Errorf("--fence-signal=%q: want %s or %s", o.FenceSignal, conditions.FenceSignalNodeLease, conditions.FenceSignalAgentLease))
		}
	}
	if o.MetricsAddress != "0" && !strings.Contains(o.MetricsAddress, ":") {
		errs = append(errs, fmt.Errorf("--metrics-bind-address=%q: want host:port (or \"0\" for off)", o.MetricsAddress))
	}
	if _, _, err := o.oomScoreAdj(); err != nil {
		errs = append(errs, err)
	}
	if o.QPS <= 0 || float32(o.Burst) < o.QPS {
		errs = append(errs, fmt.Errorf("--kube-api-qps=%v, --kube-api-burst=%d: need 0 < qps <= burst", o.QPS, o.Burst))
	}
	return errors.Join(errs...)
}

// DefaultOOMScoreAdj is --oom-score-adj's default: the kubelet's own score.
const DefaultOOMScoreAdj = "-999"

// oomScoreAdj parses --oom-score-adj: set is false when it is empty (keep the score).
func (o *Options) oomScoreAdj() (v int, set bool, err error) {
	if o.OOMScoreAdj == "" {
		return 0, false, nil
	}
	v, err = strconv.Atoi(o.OOMScoreAdj)
	if err != nil || v < -1000 || v > 1000 {
		return 0, false, fmt.Errorf("--oom-score-adj=%q: want an integer from -1000 to 1000, or empty to keep the runtime's", o.OOMScoreAdj)
	}
	return v, true, nil
}
