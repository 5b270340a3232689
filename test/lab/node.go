package lab

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/coroner-dev/coroner/test/containerd"
	"github.com/coroner-dev/coroner/test/host"
	"github.com/coroner-dev/coroner/test/images"
)

// runtime is the containerd build of the node: Debian's 1.6, or the 2.x or 1.7 test/tools
// built.
func (c Config) runtime(n Node) (containerd.Runtime, error) {
	switch n.Runtime {
	case RuntimeContainerd16:
		return containerd.Debian()
	case RuntimeContainerd17:
		return containerd.Built17(c.BinDir)
	case RuntimeContainerd2, "":
		return containerd.Built(c.BinDir)
	}
	return containerd.Runtime{}, fmt.Errorf("%s: unknown runtime %q (want %s, %s or %s)", n.Name, n.Runtime, RuntimeContainerd2, RuntimeContainerd17, RuntimeContainerd16)
}

// prepareNode makes the node's directories, cgroup and configuration files.
func (c Config) prepareNode(st *State, n Node, p *clusterPKI) error {
	dir, run := c.nodeDir(n), c.nodeRunDir(n)
	for _, d := range []string{dir, filepath.Join(dir, "cni"), filepath.Join(dir, "kubelet"), filepath.Join(dir, "pod-logs"), run, DaemonDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := st.addCgroup(n.Cgroup()); err != nil {
		return err
	}
	if err := host.CreateCgroup(n.Cgroup()); err != nil {
		return fmt.Errorf("cgroup %s: %w", n.Cgroup(), err)
	}
	rt, err := c.runtime(n)
	if err != nil {
		return err
	}
	files := map[string]string{
		filepath.Join(dir, "containerd.toml"):                c.containerdConfig(n, rt),
		filepath.Join(dir, "cni", "10-coroner-lab.conflist"): cniConfig(n, filepath.Join(dir, "ipam")),
		filepath.Join(dir, "kubelet.yaml"):                   c.kubeletConfig(n, p),
	}
	for path, content := range files {
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// containerdConfig is the node's containerd config.toml (test/containerd's, with the
// node's own directories and CNI configuration).
func (c Config) containerdConfig(n Node, rt containerd.Runtime) string {
	dir, run := c.nodeDir(n), c.nodeRunDir(n)
	return containerd.ConfigTOML(containerd.ConfigDirs{
		Runtime:  rt,
		Root:     filepath.Join(dir, "containerd"),
		State:    filepath.Join(run, "state"),
		Socket:   n.Socket(),
		Opt:      filepath.Join(dir, "opt"),
		RuncRoot: filepath.Join(run, "runc"),
		CNIConf:  filepath.Join(dir, "cni"),
	})
}

// cniConfig is the node's CNI network: a bridge cni0 in the node's network namespace with
// the node's pod CIDR from host-local (its data kept in the node's directory). No ipMasq
// (it needs iptables): the host and the other nodes route the pod CIDRs.
func cniConfig(n Node, ipamDir string) string {
	return fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": "coroner-%[1]s",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": %[2]q, "gateway": %[3]q}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": %[4]q
      }
    }
  ]
}
`, n.Name, n.PodCIDR.String(), n.gateway().String(), ipamDir)
}

// kubeletConfig is the node's KubeletConfiguration, with what lab-notes.md found
// necessary: cgroupfs, failCgroupV1 false (1.36 refuses cgroup v1 by default), failSwapOn
// false, a cgroupRoot of its own that exists in every hierarchy, its own directories,
// webhook authentication and authorization with the cluster CA, fast status updates, volume
// usage measured every 5 s (not every minute, so an emptyDir over its sizeLimit is evicted
// within seconds), and no image garbage collection (imported images cannot be pulled again).
func (c Config) kubeletConfig(n Node, p *clusterPKI) string {
	dir := c.nodeDir(n)
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://%[1]s
cgroupDriver: cgroupfs
cgroupRoot: /%[2]s
failCgroupV1: false
failSwapOn: false
address: %[3]s
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: %[4]q
tlsPrivateKeyFile: %[5]q
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: %[6]q
authorization:
  mode: Webhook
podLogsDir: %[7]q
volumePluginDir: %[8]q
`+kubeletCommon, n.Socket(), n.Cgroup(), n.IP, filepath.Join(p.dir, n.Name+"-serving.crt"), filepath.Join(p.dir, n.Name+"-serving.key"),
		p.caFile(), filepath.Join(dir, "pod-logs"), filepath.Join(dir, "volume-plugins"))
}

// kubeletCommon ends every lab kubelet's KubeletConfiguration (process nodes and the VM
// node), a fmt format (%% for %): fast status reports, volume stats for emptyDir
// evictions, images never garbage-collected (no registry to pull them back from), low
// eviction thresholds for a shared disk, certificates from the lab's CA.
const kubeletCommon = `nodeStatusUpdateFrequency: 5s
nodeStatusReportFrequency: 5s
volumeStatsAggPeriod: 5s
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 2%%
  imagefs.available: 2%%
  nodefs.inodesFree: 2%%
resolvConf: /etc/resolv.conf
rotateCertificates: false
serverTLSBootstrap: false
registerNode: true
`

// startContainerd starts the node's containerd in its namespaces (startInNode) and waits
// until its CRI plugin reports the runtime and the network ready.
func (c Config) startContainerd(ctx context.Context, st *State, n Node) error {
	name := "containerd-" + n.Name
	rt, err := c.runtime(n)
	if err != nil {
		return err
	}
	p, err := c.startInNode(st, n, name, rt.Containerd, []string{"--config", filepath.Join(c.nodeDir(n), "containerd.toml")}, c.logPath(name))
	if err != nil {
		return err
	}
	cri, err := dialCRI(n.Socket())
	if err != nil {
		return err
	}
	defer cri.Close()
	deadline := time.Now().Add(60 * time.Second)
	var last error
	for {
		if !p.running() {
			return fmt.Errorf("containerd of %s exited:\n%s", n.Name, logTail(p.Log, 3000))
		}
		if last = cri.ready(ctx); last == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("containerd of %s not ready within 60s: %v\n%s", n.Name, last, logTail(p.Log, 3000))
		}
		if err := Sleep(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
}

// ImportImages loads image tarballs into every process node's containerd (the VM node,
// tainted for the tests that choose it, runs none of the images this is for: the
// platforms' managers).
func (c Config) ImportImages(ctx context.Context, imgs []images.Image) error {
	if _, err := c.upState(); err != nil {
		return err
	}
	for _, n := range c.Nodes {
		if err := c.importImages(ctx, n, imgs); err != nil {
			return fmt.Errorf("%s: %w", n.Name, err)
		}
	}
	return nil
}

// importImages loads the image tarballs into the node's containerd and waits until the
// CRI plugin sees every one (it learns of imports from events; a kubelet asking earlier
// would try to pull).
func (c Config) importImages(ctx context.Context, n Node, imgs []images.Image) error {
	rt, err := c.runtime(n)
	if err != nil {
		return err
	}
	for _, img := range imgs {
		if err := images.Import(ctx, rt.Ctr, n.Socket(), img.Tarball); err != nil {
			return err
		}
	}
	cri, err := dialCRI(n.Socket())
	if err != nil {
		return err
	}
	defer cri.Close()
	for _, img := range imgs {
		err := Poll(ctx, 20*time.Second, "image "+img.Name+" in the CRI plugin of "+n.Name, func() (bool, error) {
			r, err := cri.images.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: img.Name}})
			return err == nil && r.Image != nil, nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// startKubelet starts the node's kubelet in its namespaces (startInNode).
func (c Config) startKubelet(st *State, n Node) error {
	name := "kubelet-" + n.Name
	dir := c.nodeDir(n)
	_, err := c.startInNode(st, n, name, c.bin("kubelet"), []string{
		"--config=" + filepath.Join(dir, "kubelet.yaml"),
		"--kubeconfig=" + filepath.Join(c.pkiDir(), n.Name+".kubeconfig"),
		"--root-dir=" + filepath.Join(dir, "kubelet"),
		"--hostname-override=" + n.Name,
		"--node-ip=" + n.IP.String(),
		"--node-labels=lab.coroner.dev/node=" + n.Name,
		"--v=1",
	}, c.logPath(name))
	return err
}

// devicePluginSocket is the kubelet device manager's socket of the process node n, as
// this machine sees it: the kubelet listens at the fixed path
// /var/lib/kubelet/device-plugins/kubelet.sock (not under --root-dir), which in the
// node's mount namespace is the node's own directory (mountns.go).
func (c Config) devicePluginSocket(n Node) string {
	return filepath.Join(c.nodeDir(n), "device-plugins", "kubelet.sock")
}

// deviceManagerTimeout bounds the wait for a kubelet's device manager: about a second
// after its start here, more on a loaded host.
const deviceManagerTimeout = 2 * time.Minute

// waitDeviceManager waits until the node's kubelet, started at started, listens on its
// devicePluginSocket: a socket made since (its change time; an earlier kubelet's is
// older) that takes a connection. The node's test GPU plugin starts after it.
func (c Config) waitDeviceManager(ctx context.Context, st *State, n Node, started time.Time) error {
	p, ok := st.proc("kubelet-" + n.Name)
	if !ok {
		return fmt.Errorf("no kubelet of %s in the lab's state", n.Name)
	}
	sock := c.devicePluginSocket(n)
	return Poll(ctx, deviceManagerTimeout, p.Name+" listening on "+sock, func() (bool, error) {
		if !p.running() {
			return false, fmt.Errorf("%s exited:\n%s", p.Name, logTail(p.Log, 3000))
		}
		made, ok := socketMade(sock)
		// The file system's clock is coarse (a tick behind the wall clock at most).
		if !ok || made.Before(started.Add(-50*time.Millisecond)) {
			return false, nil
		}
		conn, err := net.DialTimeout("unix", sock, time.Second)
		if err != nil {
			return false, nil
		}
		_ = conn.Close()
		return true, nil
	})
}

// socketMade is the change time of the unix socket at path; false when there is none.
func socketMade(path string) (time.Time, bool) {
	var s syscall.Stat_t
	if err := syscall.Stat(path, &s); err != nil || s.Mode&syscall.S_IFMT != syscall.S_IFSOCK {
		return time.Time{}, false
	}
	return time.Unix(s.Ctim.Sec, s.Ctim.Nsec), true
}

// waitNodesReady waits until every lab node is registered and Ready, and says which are
// not when it gives up.
func (c Config) waitNodesReady(ctx context.Context, st *State, timeout time.Duration) error {
	cs, err := c.Clientset()
	if err != nil {
		return err
	}
	var notReady []string
	err = Poll(ctx, timeout, "nodes Ready", func() (bool, error) {
		for _, p := range st.procs() {
			if strings.HasPrefix(p.Name, "kubelet-") && !p.running() {
				return false, fmt.Errorf("%s exited:\n%s", p.Name, logTail(p.Log, 3000))
			}
		}
		notReady = notReady[:0]
		for _, n := range c.Nodes {
			node, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				notReady = append(notReady, n.Name+" (not registered)")
				continue
			}
			if !nodeReady(node) {
				notReady = append(notReady, n.Name+" ("+readyMessage(node)+")")
			}
		}
		return len(notReady) == 0, nil
	})
	if err != nil && len(notReady) > 0 {
		return fmt.Errorf("%w: %s (logs: %s)", err, strings.Join(notReady, ", "), c.shortPath(c.logDir()))
	}
	return err
}

func nodeReady(n *corev1.Node) bool {
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

func readyMessage(n *corev1.Node) string {
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return fmt.Sprintf("Ready=%s %s", cond.Status, cond.Message)
		}
	}
	return "no Ready condition yet"
}

// criClient is a CRI connection to a node's containerd.
type criClient struct {
	conn    *grpc.ClientConn
	runtime runtimeapi.RuntimeServiceClient
	images  runtimeapi.ImageServiceClient
}

func dialCRI(socket string) (*criClient, error) {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, MaxDelay: time.Second},
			MinConnectTimeout: time.Second,
		}))
	if err != nil {
		return nil, err
	}
	return &criClient{conn: conn, runtime: runtimeapi.NewRuntimeServiceClient(conn), images: runtimeapi.NewImageServiceClient(conn)}, nil
}

func (c *criClient) Close() { c.conn.Close() }

// ready is nil once the runtime and its network are ready.
func (c *criClient) ready(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	st, err := c.runtime.Status(cctx, &runtimeapi.StatusRequest{})
	if err != nil {
		return err
	}
	ok := 0
	for _, cond := range st.GetStatus().GetConditions() {
		if (cond.Type == runtimeapi.RuntimeReady || cond.Type == runtimeapi.NetworkReady) && cond.Status {
			ok++
		}
	}
	if ok < 2 {
		return fmt.Errorf("CRI status: %v", st.GetStatus())
	}
	return nil
}

// kubeletSysctls are the kernel tunables the kubelet sets when it starts (with
// protectKernelDefaults false, the default): pkg/kubelet/cm setupKernelTunables.
var kubeletSysctls = []string{
	"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
}

// readSysctls returns the current values of kubeletSysctls.
func readSysctls() map[string]string {
	m := map[string]string{}
	for _, k := range kubeletSysctls {
		if b, err := os.ReadFile("/proc/sys/" + k); err == nil {
			m[k] = strings.TrimSpace(string(b))
		}
	}
	return m
}

// restoreSysctls writes back values recorded by readSysctls; it returns what it changed.
func restoreSysctls(m map[string]string) ([]string, error) {
	var changed []string
	var errs []string
	for _, k := range kubeletSysctls {
		want, ok := m[k]
		if !ok {
			continue
		}
		b, err := os.ReadFile("/proc/sys/" + k)
		if err != nil || strings.TrimSpace(string(b)) == want {
			continue
		}
		if err := os.WriteFile("/proc/sys/"+k, []byte(want), 0o644); err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", k, err))
			continue
		}
		changed = append(changed, fmt.Sprintf("%s=%s", strings.ReplaceAll(k, "/", "."), want))
	}
	if len(errs) > 0 {
		return changed, fmt.Errorf("restoring sysctls: %s", strings.Join(errs, "; "))
	}
	return changed, nil
}
