// Package shim is coroner's control plane: a Job controller for batch/v1 Jobs whose
// spec.managedBy names coroner. The decisions it takes are pure functions in its
// sub-packages (policy, indexes, backoff); this package holds the options and the wiring.
package shim

import (
	"errors"
	"fmt"
	"github.com/coroner-dev/coroner/api/v1alpha1"
	"net"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/controller"
	"github.com/coroner-dev/coroner/shim/policy"
	"github.com/coroner-dev/coroner/shim/quarantine"
	"github.com/coroner-dev/coroner/shim/recoverer"
)

// Options are the settings of coroner-shim, filled from flags.
type Options struct {
	Kubeconfig string
	ManagedBy  string
	QPS        float32
	Burst      int
	Workers    int

	LeaderElect     bool
	LeaseNamespace  string
	LeaseName       string
	LeaseDuration   time.Duration
	RenewDeadline   time.Duration
	RetryPeriod     time.Duration
	MetricsAddress  string
	HealthAddress   string
	ShutdownGrace   time.Duration
	PodBackoffBase  time.Duration
	PodBackoffMax   time.Duration
	ZombieThreshold time.Duration
	// OOMVerdictWait is how long a Failed pod whose container was OOM-killed waits for
	// the agent's verdict before its failure is decided (policy.AwaitingVerdict).
	OOMVerdictWait time.Duration
	// DeviceVerdictWait is how long a Failed pod that held devices and whose container
	// died waits for the agent's device verdict before its failure is decided
	// (policy.AwaitingDeviceVerdict).
	DeviceVerdictWait time.Duration
	// AvoidFailedNodes is the avoidance of failed nodes of the Jobs without
	// coroner.dev/avoid-failed-nodes: none, preferred or required.
	AvoidFailedNodes string
	// AgentNamespace is where the agents' fencing Leases are (Z2); FenceMargin is added
	// to an agent's fence-after before its silence counts as fenced.
	AgentNamespace string
	FenceMargin    time.Duration
	// StaleDisruptionAfter is how long DisruptionTarget may stay True on a pod that is not
	// deleted before the shim clears it (Z4).
	StaleDisruptionAfter time.Duration
	// RecoverPods is "all" (every opted-in pod, as Kueue) or "managed" (only the pods of
	// managed Jobs): whose pods node-failure recovery covers.
	RecoverPods string
	// JobRecords turns the Jobs' JobRecords on (what coronerctl explain reads);
	// JobRecordMaxPods bounds the entries of one.
	JobRecords       bool
	JobRecordMaxPods int

	// The quarantine of nodes that keep killing pods (shim/quarantine): off unless
	// Quarantine; QuarantineMax is "N" or "P%" (quarantine.ParseMax).
	Quarantine       bool
	QuarantineDeaths int
	QuarantineWindow time.Duration
	QuarantineFor    time.Duration
	QuarantineMax    string
}

// NewOptions returns the defaults.
func NewOptions() *Options {
	ns := os.Getenv("POD_NAMESPACE")
	if ns == "" {
		ns = "coroner-system"
	}
	return &Options{
		ManagedBy:         conditions.ManagedBy,
		QPS:               50,
		Burst:             100,
		Workers:           5,
		LeaderElect:       true,
		LeaseNamespace:    ns,
		LeaseName:         "coroner-shim",
		LeaseDuration:     15 * time.Second,
		RenewDeadline:     10 * time.Second,
		RetryPeriod:       2 * time.Second,
		MetricsAddress:    ":8080",
		HealthAddress:     ":8081",
		ShutdownGrace:     30 * time.Second,
		PodBackoffBase:    10 * time.Second,
		PodBackoffMax:     10 * time.Minute,
		ZombieThreshold:   60 * time.Second,
		OOMVerdictWait:    30 * time.Second,
		DeviceVerdictWait: policy.DefaultDeviceVerdictWait,
		AvoidFailedNodes:  string(v1alpha1.AvoidNone),
		AgentNamespace:    ns,
		FenceMargin:       15 * time.Second,

		StaleDisruptionAfter: 2 * time.Minute,
		RecoverPods:          string(recoverer.RecoverAll),
		JobRecords:           true,
		JobRecordMaxPods:     controller.DefaultRecordMaxPods,

		QuarantineDeaths: quarantine.DefaultDeaths,
		QuarantineWindow: quarantine.DefaultWindow,
		QuarantineFor:    quarantine.DefaultFor,
		QuarantineMax:    quarantine.DefaultMax,
	}
}

// AddFlags registers every option on fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "Path to a kubeconfig file; empty means the in-cluster config (service account), then $KUBECONFIG.")
	fs.StringVar(&o.ManagedBy, "managed-by", o.ManagedBy, "The spec.managedBy value of the Jobs this controller manages; every other Job is left alone.")
	fs.Float32Var(&o.QPS, "kube-api-qps", o.QPS, "Steady queries per second to the API server, for the two controllers' requests together (leader election has its own).")
	fs.IntVar(&o.Burst, "kube-api-burst", o.Burst, "Burst of queries to the API server; at least --kube-api-qps.")
	fs.IntVar(&o.Workers, "workers", o.Workers, "Jobs synced concurrently.")
	fs.BoolVar(&o.LeaderElect, "leader-elect", o.LeaderElect, "Run only while holding the leader Lease, so that several replicas can run.")
	fs.StringVar(&o.LeaseNamespace, "leader-elect-resource-namespace", o.LeaseNamespace, "Namespace of the leader Lease (default $POD_NAMESPACE, else coroner-system).")
	fs.StringVar(&o.LeaseName, "leader-elect-resource-name", o.LeaseName, "Name of the leader Lease.")
	fs.DurationVar(&o.LeaseDuration, "leader-elect-lease-duration", o.LeaseDuration, "How long a non-leader waits after the last renewal before taking the Lease.")
	fs.DurationVar(&o.RenewDeadline, "leader-elect-renew-deadline", o.RenewDeadline, "How long the leader retries renewing before it gives up leadership; less than the lease duration.")
	fs.DurationVar(&o.RetryPeriod, "leader-elect-retry-period", o.RetryPeriod, "Interval between attempts to acquire or renew the Lease.")
	fs.StringVar(&o.MetricsAddress, "metrics-bind-address", o.MetricsAddress, "host:port that serves Prometheus metrics at /metrics; \"0\" turns it off. Every replica serves coroner_leader (1 on the leader, 0 on a standby); only the leader serves the Job metrics (coroner_managed_jobs, ...).")
	fs.StringVar(&o.HealthAddress, "health-probe-bind-address", o.HealthAddress, "host:port that serves /healthz and /readyz; \"0\" turns it off.")
	fs.DurationVar(&o.ShutdownGrace, "shutdown-grace-period", o.ShutdownGrace, "How long to let in-flight syncs finish after SIGTERM.")
	fs.DurationVar(&o.PodBackoffBase, "pod-failure-backoff-base", o.PodBackoffBase, "First delay before a failed pod is replaced; it doubles with each further failure (S4, S6).")
	fs.DurationVar(&o.PodBackoffMax, "pod-failure-backoff-max", o.PodBackoffMax, "Upper bound of the replacement delay.")
	fs.DurationVar(&o.ZombieThreshold, "zombie-threshold", o.ZombieThreshold, "How long after its deletion time an opted-in pod (annotation coroner.dev/safe-to-forcefully-delete or Kueue's) may stay terminating on an unreachable node before it is failed and force-deleted (Z1).")
	fs.DurationVar(&o.OOMVerdictWait, "oom-verdict-wait", o.OOMVerdictWait, "How long a Failed pod whose container was OOM-killed, with neither coroner.dev/OOMKilled nor DisruptionTarget, waits for coroner-agent's verdict (limit or node OOM) before its failure is decided, when the Job's podFailurePolicy has a rule on pod conditions: the agent stamps before the kubelet's Failed unless it is down at that moment (restarting, or killed by the same node OOM). 0 decides at once.")
	fs.DurationVar(&o.DeviceVerdictWait, "device-verdict-wait", o.DeviceVerdictWait, "How long a Failed pod that holds devices (extended resources, DRA claims) and whose container died (a non-zero exit or a signal), with neither DisruptionTarget=True nor coroner.dev/DeviceFailed, waits for coroner-agent's device verdict after that container finished before its failure is decided, when the verdict can change what the Job's podFailurePolicy does with it (a rule on DisruptionTarget or coroner.dev/DeviceFailed that an earlier rule does not pre-empt). The agent gives its verdict within 10 s of the death (it waits that long for a device to turn Unhealthy). 0 decides at once.")
	fs.StringVar(&o.AvoidFailedNodes, "avoid-failed-nodes", o.AvoidFailedNodes, "How the Jobs without the annotation coroner.dev/avoid-failed-nodes avoid the nodes that killed their pods (a node OOM kill, a failing device, node pressure, a lost node): none, preferred (a preferred node affinity term) or required (a required one; a replacement may then wait for another node). The annotation overrides it per Job.")
	fs.StringVar(&o.AgentNamespace, "agent-namespace", o.AgentNamespace, "Namespace of coroner-agent's fencing Leases (coroner-agent-<node>); default $POD_NAMESPACE, else coroner-system (Z2).")
	fs.DurationVar(&o.FenceMargin, "fence-margin", o.FenceMargin, "Added to an agent's --fence-after before a node whose agent stopped renewing its Lease counts as fenced, and its opted-in pods are recovered without waiting (Z2): clock skew, the agent's relist period, the time to stop containers.")
	fs.StringVar(&o.RecoverPods, "recover-pods", o.RecoverPods, "Whose pods stuck on a lost node are recovered: \"all\" recovers every pod opted in by annotation (coroner.dev/safe-to-forcefully-delete, or Kueue's kueue.x-k8s.io/safe-to-forcefully-terminate or kueue.x-k8s.io/safe-to-forcefully-delete, set to \"true\"), whoever owns it (a built-in Job, a JobSet, a bare pod...), as Kueue's failure recovery does: Z1 and Z2, and the forced deletion of a terminal pod being deleted on an unreachable node; such pods are watched only on the nodes tainted unreachable (one watch of a node's pods, from the taint until it goes), as stripped copies. \"managed\" recovers only the pods of the Jobs this shim manages (Z1-Z4). Orphans (Z3) and stale DisruptionTargets (Z4) are handled for managed Jobs' pods only, either way.")
	fs.BoolVar(&o.JobRecords, "job-records", o.JobRecords, "Keep, for every managed Job, a JobRecord (coroner.dev/v1alpha1, CRD in deploy/base/jobrecord-crd.yaml) with each pod that left the Job: its last phase, cause of death, the podFailurePolicy decision, why the shim deleted it; coronerctl explain reads it. Needs the CRD installed (checked at start). false keeps none: explain then tells only the pods that exist.")
	fs.IntVar(&o.JobRecordMaxPods, "job-record-max-pods", o.JobRecordMaxPods, "The most pod entries one JobRecord keeps (about 500 bytes each as stored, the API server's managedFields included; at most 2500, as an object must stay under etcd's 1.5 MiB); past it the oldest go first in the order Deleted, Ignored, Failed, counted in the record's dropped field.")
	fs.DurationVar(&o.StaleDisruptionAfter, "stale-disruption-after", o.StaleDisruptionAfter, "How long DisruptionTarget=True may stay on a pod that is not being deleted before the shim sets it False (Z4).")

	// The node quarantine (shim/quarantine).
	fs.BoolVar(&o.Quarantine, "quarantine", o.Quarantine, "Quarantine the nodes that keep killing pods: a node on which --quarantine-deaths pods of managed Jobs died within --quarantine-window of a cause that blames the node (device, node-oom, node-pressure, node-lost) gets the taint coroner.dev/quarantined=<cause>:NoSchedule (running pods stay), lifted after --quarantine-for without another such death, or by hand (coronerctl quarantine lift NODE). Needs the RBAC to patch nodes (deploy/base/shim-rbac.yaml). The deaths are counted in coroner_node_blamed_deaths_total either way.")
	fs.IntVar(&o.QuarantineDeaths, "quarantine-deaths", o.QuarantineDeaths, "Deaths blamed on a node within --quarantine-window that quarantine it (with --quarantine).")
	fs.DurationVar(&o.QuarantineWindow, "quarantine-window", o.QuarantineWindow, "The window in which --quarantine-deaths deaths quarantine a node (with --quarantine).")
	fs.DurationVar(&o.QuarantineFor, "quarantine-for", o.QuarantineFor, "How long a quarantined node must go without a death blamed on it before its taint is lifted (with --quarantine). After a restart of the shim, which keeps the deaths in memory, a node tainted before is kept this long from the restart.")
	fs.StringVar(&o.QuarantineMax, "quarantine-max", o.QuarantineMax, "The most nodes quarantined at once: a number (3) or a percentage of the nodes (10%, rounded down), at least 1. A node that would go past it is spared, with a QuarantineSpared Event on it (with --quarantine).")
}

// Validate reports every invalid option at once.
func (o *Options) Validate() error {
	var errs []error
	if o.ManagedBy == "" || o.ManagedBy == "kubernetes.io/job-controller" {
		errs = append(errs, fmt.Errorf("--managed-by=%q: must name a controller other than the built-in one", o.ManagedBy))
	} else if msgs := validateDomainPrefixedPath(o.ManagedBy); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("--managed-by=%q: %s", o.ManagedBy, strings.Join(msgs, "; ")))
	}
	if o.QPS <= 0 {
		errs = append(errs, fmt.Errorf("--kube-api-qps=%v: must be positive", o.QPS))
	}
	if float32(o.Burst) < o.QPS {
		errs = append(errs, fmt.Errorf("--kube-api-burst=%d: must be at least --kube-api-qps (%v)", o.Burst, o.QPS))
	}
	if o.Workers < 1 {
		errs = append(errs, fmt.Errorf("--workers=%d: must be at least 1", o.Workers))
	}
	if o.LeaderElect {
		if o.LeaseNamespace == "" || o.LeaseName == "" {
			errs = append(errs, errors.New("--leader-elect needs --leader-elect-resource-namespace and --leader-elect-resource-name"))
		}
		if o.RetryPeriod <= 0 || o.RenewDeadline <= o.RetryPeriod || o.LeaseDuration <= o.RenewDeadline {
			errs = append(errs, fmt.Errorf("leader election: need 0 < retry period (%v) < renew deadline (%v) < lease duration (%v)",
				o.RetryPeriod, o.RenewDeadline, o.LeaseDuration))
		}
	}
	errs = append(errs, ValidateAddress("--metrics-bind-address", o.MetricsAddress), ValidateAddress("--health-probe-bind-address", o.HealthAddress))
	if o.ShutdownGrace < 0 {
		errs = append(errs, fmt.Errorf("--shutdown-grace-period=%v: must not be negative", o.ShutdownGrace))
	}
	if o.PodBackoffBase <= 0 || o.PodBackoffMax < o.PodBackoffBase {
		errs = append(errs, fmt.Errorf("--pod-failure-backoff-base=%v, --pod-failure-backoff-max=%v: need 0 < base <= max", o.PodBackoffBase, o.PodBackoffMax))
	}
	if o.FenceMargin <= 0 {
		errs = append(errs, fmt.Errorf("--fence-margin=%v: must be positive (clocks differ)", o.FenceMargin))
	}
	if o.StaleDisruptionAfter <= 0 {
		errs = append(errs, fmt.Errorf("--stale-disruption-after=%v: must be positive", o.StaleDisruptionAfter))
	}
	if o.AgentNamespace == "" {
		errs = append(errs, errors.New("--agent-namespace must not be empty"))
	}
	if r := recoverer.RecoverScope(o.RecoverPods); r != recoverer.RecoverAll && r != recoverer.RecoverManaged {
		errs = append(errs, fmt.Errorf("--recover-pods=%q: want %q or %q", o.RecoverPods, recoverer.RecoverAll, recoverer.RecoverManaged))
	}
	if o.OOMVerdictWait < 0 {
		errs = append(errs, fmt.Errorf("--oom-verdict-wait=%v: must not be negative", o.OOMVerdictWait))
	}
	if _, err := v1alpha1.ParseAvoidance(o.AvoidFailedNodes); err != nil {
		errs = append(errs, fmt.Errorf("--avoid-failed-nodes=%q: want none, preferred or required", o.AvoidFailedNodes))
	}
	if o.DeviceVerdictWait < 0 {
		errs = append(errs, fmt.Errorf("--device-verdict-wait=%v: must not be negative (0 decides at once)", o.DeviceVerdictWait))
	}
	if o.JobRecordMaxPods < 1 || o.JobRecordMaxPods > controller.MaxRecordMaxPods {
		errs = append(errs, fmt.Errorf("--job-record-max-pods=%d: must be between 1 and %d (a JobRecord must stay under etcd's 1.5 MiB)", o.JobRecordMaxPods, controller.MaxRecordMaxPods))
	}
	if o.ZombieThreshold <= 0 {
		errs = append(errs, fmt.Errorf("--zombie-threshold=%v: must be positive", o.ZombieThreshold))
	}
	errs = append(errs, o.validateQuarantine()...)
	return errors.Join(errs...)
}

// validateQuarantine checks the --quarantine-* flags, whether --quarantine is on or not.
func (o *Options) validateQuarantine() []error {
	var errs []error
	if o.QuarantineDeaths < 1 {
		errs = append(errs, fmt.Errorf("--quarantine-deaths=%d: must be at least 1", o.QuarantineDeaths))
	}
	if o.QuarantineWindow <= 0 {
		errs = append(errs, fmt.Errorf("--quarantine-window=%v: must be positive", o.QuarantineWindow))
	}
	if o.QuarantineFor <= 0 {
		errs = append(errs, fmt.Errorf("--quarantine-for=%v: must be positive", o.QuarantineFor))
	}
	if _, err := quarantine.ParseMax(o.QuarantineMax); err != nil {
		errs = append(errs, fmt.Errorf("--quarantine-max=%w", err))
	}
	return errs
}

// QuarantineConfig is the quarantine's configuration from the options (which Validate
// accepted).
func (o *Options) QuarantineConfig() quarantine.Config {
	m, _ := quarantine.ParseMax(o.QuarantineMax)
	return quarantine.Config{
		Enabled: o.Quarantine,
		Options: quarantine.Options{Deaths: o.QuarantineDeaths, Window: o.QuarantineWindow, For: o.QuarantineFor, Max: m},
	}
}

// validateDomainPrefixedPath applies the API server's rule for spec.managedBy: a
// domain-prefixed path ("example.com/name") of at most 63 characters.
func validateDomainPrefixedPath(s string) []string {
	var msgs []string
	if len(s) > 63 {
		msgs = append(msgs, "must be at most 63 characters")
	}
	domain, path, ok := strings.Cut(s, "/")
	if !ok || path == "" {
		return append(msgs, "must be a domain-prefixed path such as coroner.dev/shim")
	}
	msgs = append(msgs, validation.IsDNS1123Subdomain(domain)...)
	for _, r := range path {
		if !isPathRune(r) {
			msgs = append(msgs, fmt.Sprintf("path has the invalid character %q", r))
			break
		}
	}
	return msgs
}

// isPathRune reports whether r may appear in the path of a domain-prefixed path.
func isPathRune(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-._~%!$&'()*+,;=:@/", r)
}

// ValidateAddress checks a host:port listen address; "0" means off.
func ValidateAddress(flag, addr string) error {
	if addr == "0" {
		return nil
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return fmt.Errorf("%s=%q: want host:port (or \"0\" for off): %v", flag, addr, err)
	}
	return nil
}
