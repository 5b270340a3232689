package kind

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/coroner-dev/coroner/test/images"
)

// Network is the docker network the kind nodes join (KIND_EXPERIMENTAL_DOCKER_NETWORK),
// made by us with a fixed subnet and bridge name so that Down can check it is gone.
const (
	Network       = "coroner-kind"
	NetworkSubnet = "10.88.0.0/24"
	NetworkBridge = "coroner-kind0"
	PodSubnet     = "10.244.0.0/16"
)

// clusterConfig is kind's cluster configuration: 1 control plane + Workers workers, the
// node image's default CNI (test/kind/cni) unless CNI is static (then Up routes), the kubelet allowed on cgroup v1
// (failCgroupV1: false; 1.36 refuses v1 otherwise, and this host is v1), images never
// garbage-collected (they cannot be pulled again).
func (c Config) clusterConfig() string {
	var b strings.Builder
	fmt.Fprintf(&b, `kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
name: %s
networking:
  disableDefaultCNI: %t
  podSubnet: %s
kubeadmConfigPatches:
- |
  kind: KubeletConfiguration
  failCgroupV1: false
  imageGCHighThresholdPercent: 100
  imageGCLowThresholdPercent: 99
  nodeStatusUpdateFrequency: 5s
nodes:
- role: control-plane
`, c.Cluster, c.CNI == "static", PodSubnet)
	for i := 0; i < c.Workers; i++ {
		b.WriteString("- role: worker\n")
	}
	return b.String()
}

// coronerImages builds coroner-agent and coroner-shim (static) and their images with
// test/images.FromBinary, plus test/images' busybox:local (with memhog) for test pods.
func (c Config) coronerImages(ctx context.Context) ([]images.Image, error) {
	binDir := filepath.Join(c.Out, "bin")
	imgDir := filepath.Join(c.Out, "images")
	for _, n := range []string{"coroner-agent", "coroner-shim"} {
		if err := c.goBuild(ctx, filepath.Join(binDir, n), "./cmd/"+n); err != nil {
			return nil, err
		}
	}
	agent, err := images.FromBinary(imgDir, images.AgentName, filepath.Join(binDir, "coroner-agent"))
	if err != nil {
		return nil, err
	}
	shim, err := images.FromBinary(imgDir, images.ShimName, filepath.Join(binDir, "coroner-shim"))
	if err != nil {
		return nil, err
	}
	bb, err := images.BuildBusybox(ctx, imgDir)
	if err != nil {
		return nil, err
	}
	return []images.Image{agent, shim, bb}, nil
}

func (c Config) clusterExists(ctx context.Context) bool {
	out, err := c.output(ctx, nil, c.bin("kind"), "get", "clusters")
	if err != nil {
		return false
	}
	for _, l := range strings.Fields(out) {
		if l == c.Cluster {
			return true
		}
	}
	return false
}

// Up makes the node image (cached), starts our dockerd, creates the cluster unless it
// exists, routes the pod networks, loads coroner's images, applies deploy/overlays/kind and
// waits for the agent on every node and the shim's leader.
func (c Config) Up(ctx context.Context) error {
	start := time.Now()
	if err := c.BuildImage(ctx); err != nil {
		return err
	}
	t := time.Now()
	imgs, err := c.coronerImages(ctx)
	if err != nil {
		return err
	}
	c.say("coroner images built in %s", time.Since(t).Round(time.Second))

	if _, err := c.docker(ctx, "network", "inspect", Network); err != nil {
		if _, err := c.docker(ctx, "network", "create", "--driver", "bridge", "--subnet", NetworkSubnet,
			"-o", "com.docker.network.bridge.name="+NetworkBridge,
			"-o", "com.docker.network.bridge.enable_ip_masquerade=false",
			"--label", "dev.coroner.kind=1", Network); err != nil {
			return err
		}
	}
	if c.clusterExists(ctx) && !c.nodesRunning(ctx) {
		// Left from before a dockerd restart (kind's nodes do not survive one here): remake.
		c.say("cluster %s exists but not all its nodes run: deleting it", c.Cluster)
		if err := c.stream(ctx, c.bin("kind"), "delete", "cluster", "--name", c.Cluster, "--kubeconfig", c.Kubeconfig()); err != nil {
			return err
		}
	}
	if !c.clusterExists(ctx) {
		t = time.Now()
		cfg := filepath.Join(c.Out, "cluster.yaml")
		if err := os.WriteFile(cfg, []byte(c.clusterConfig()), 0o644); err != nil {
			return err
		}
		c.say("kind create cluster %s (image %s)", c.Cluster, c.NodeImage)
		if err := c.stream(ctx, c.bin("kind"), "create", "cluster", "--name", c.Cluster, "--image", c.NodeImage,
			"--config", cfg, "--kubeconfig", c.Kubeconfig(), "--retain"); err != nil {
			return err
		}
		c.say("kind create cluster in %s", time.Since(t).Round(time.Second))
	} else {
		c.say("cluster %s exists", c.Cluster)
		if err := c.run(ctx, nil, c.bin("kind"), "export", "kubeconfig", "--name", c.Cluster, "--kubeconfig", c.Kubeconfig()); err != nil {
			return err
		}
	}
	t = time.Now()
	if c.CNI == "static" {
		if err := c.routePods(ctx); err != nil {
			return err
		}
	}
	if err := c.waitNodesReady(ctx); err != nil {
		return err
	}
	c.say("pod network (%s) up, nodes Ready in %s", c.CNI, time.Since(t).Round(time.Second))
	t = time.Now()
	if err := c.startTestGPUs(ctx); err != nil {
		return err
	}
	c.say("test GPU plugins on the workers in %s", time.Since(t).Round(time.Second))

	t = time.Now()
	if err := c.ImportImages(ctx, imgs); err != nil {
		return err
	}
	c.say("images loaded in %s", time.Since(t).Round(time.Second))
	t = time.Now()
	if err := c.stream(ctx, c.bin("kubectl"), "--kubeconfig", c.Kubeconfig(), "apply", "--server-side", "-k", filepath.Join(c.Root, "deploy/overlays/kind")); err != nil {
		return err
	}
	if err := c.waitCoroner(ctx); err != nil {
		return err
	}
	c.say("coroner running in %s", time.Since(t).Round(time.Second))
	out, _ := c.kubectl(ctx, "get", "nodes", "-o", "wide")
	_, _ = fmt.Fprint(c.Log, out) // the progress log, best-effort as say
	c.say("up in %s; export KUBECONFIG=%s", time.Since(start).Round(time.Second), c.Kubeconfig())
	return nil
}

// nodesRunning says whether every node container of the cluster runs.
func (c Config) nodesRunning(ctx context.Context) bool {
	out, err := c.docker(ctx, "ps", "-q", "--filter", "label=io.x-k8s.kind.cluster="+c.Cluster, "--filter", "status=running")
	return err == nil && len(strings.Fields(out)) == 1+c.Workers
}

type nodeInfo struct {
	Name, IP, PodCIDR string
}

func (c Config) nodes(ctx context.Context) ([]nodeInfo, error) {
	out, err := c.kubectl(ctx, "get", "nodes", "-o", "json")
	if err != nil {
		return nil, err
	}
	var list struct {
		Items []struct {
			Metadata struct{ Name string }
			Spec     struct{ PodCIDR string }
			Status   struct {
				Addresses []struct{ Type, Address string }
			}
		}
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		return nil, err
	}
	var ns []nodeInfo
	for _, it := range list.Items {
		n := nodeInfo{Name: it.Metadata.Name, PodCIDR: it.Spec.PodCIDR}
		for _, a := range it.Status.Addresses {
			if a.Type == "InternalIP" && !strings.Contains(a.Address, ":") {
				n.IP = a.Address
			}
		}
		ns = append(ns, n)
	}
	return ns, nil
}

// cniConfig is each node's CNI configuration: kindnetd's (ptp + host-local over the node's
// pod CIDR, portmap), written statically; Debian's plugins 1.1.1.
func cniConfig(podCIDR string) string {
	return fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": "coroner-kind",
  "plugins": [
    {"type": "ptp", "ipMasq": false, "mtu": 1500,
     "ipam": {"type": "host-local", "dataDir": "/run/cni-ipam-state", "routes": [{"dst": "0.0.0.0/0"}],
              "ranges": [[{"subnet": %q}]]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, podCIDR)
}

// routePods is our CNI: once every node has its pod CIDR, each node gets the ptp config
// for its own CIDR and a route to every other node's CIDR via that node's address (all on
// one docker bridge). Static: a node added later needs Up again.
func (c Config) routePods(ctx context.Context) error {
	var ns []nodeInfo
	want := 1 + c.Workers
	if err := waitFor(ctx, 3*time.Minute, 2*time.Second, "every node with a pod CIDR", func() (bool, error) {
		var err error
		if ns, err = c.nodes(ctx); err != nil {
			return false, err
		}
		if len(ns) < want {
			return false, fmt.Errorf("%d of %d nodes registered", len(ns), want)
		}
		for _, n := range ns {
			if n.PodCIDR == "" || n.IP == "" {
				return false, fmt.Errorf("node %s: podCIDR %q, IP %q", n.Name, n.PodCIDR, n.IP)
			}
		}
		return true, nil
	}); err != nil {
		return err
	}
	for _, n := range ns {
		if err := c.run(ctx, strings.NewReader(cniConfig(n.PodCIDR)), "docker", "exec", "-i", n.Name,
			"sh", "-c", "cat > /etc/cni/net.d/10-coroner.conflist.tmp && mv /etc/cni/net.d/10-coroner.conflist.tmp /etc/cni/net.d/10-coroner.conflist"); err != nil {
			return err
		}
		for _, o := range ns {
			if o.Name == n.Name {
				continue
			}
			if err := c.run(ctx, nil, "docker", "exec", n.Name, "ip", "route", "replace", o.PodCIDR, "via", o.IP); err != nil {
				return err
			}
		}
		c.say("node %s: pod CIDR %s on %s", n.Name, n.PodCIDR, n.IP)
	}
	return nil
}

func (c Config) waitNodesReady(ctx context.Context) error {
	return waitFor(ctx, 3*time.Minute, 2*time.Second, "nodes Ready", func() (bool, error) {
		out, err := c.kubectl(ctx, "get", "nodes", "-o", `jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}`)
		if err != nil {
			return false, err
		}
		lines := strings.Fields(out)
		if len(lines) < 1+c.Workers {
			return false, fmt.Errorf("%d nodes", len(lines))
		}
		for _, l := range lines {
			if !strings.HasSuffix(l, "=True") {
				return false, fmt.Errorf("not Ready: %s", l)
			}
		}
		return true, nil
	})
}

// waitCoroner waits for a Ready agent on every node and a shim holding the Lease.
func (c Config) waitCoroner(ctx context.Context) error {
	if err := waitFor(ctx, 4*time.Minute, 3*time.Second, "coroner-agent Ready on every node", func() (bool, error) {
		out, err := c.kubectl(ctx, "-n", "coroner-system", "get", "daemonset", "coroner-agent", "-o",
			"jsonpath={.status.desiredNumberScheduled} {.status.numberReady} {.status.updatedNumberScheduled}")
		if err != nil {
			return false, err
		}
		f := strings.Fields(out)
		if len(f) == 3 && f[0] == fmt.Sprint(1+c.Workers) && f[1] == f[0] && f[2] == f[0] {
			return true, nil
		}
		pods, _ := c.kubectl(ctx, "-n", "coroner-system", "get", "pods", "-o", "wide")
		return false, fmt.Errorf("desired/ready/updated %q\n%s", out, pods)
	}); err != nil {
		return err
	}
	return waitFor(ctx, 3*time.Minute, 3*time.Second, "coroner-shim leader", func() (bool, error) {
		out, err := c.kubectl(ctx, "-n", "coroner-system", "get", "lease", "coroner-shim", "-o", "jsonpath={.spec.holderIdentity}")
		if err != nil {
			return false, err
		}
		if h := strings.TrimSpace(out); h != "" {
			c.say("coroner-shim leader: %s", h)
			return true, nil
		}
		return false, fmt.Errorf("no holder")
	})
}

// Down deletes the cluster and our network, stops our dockerd and checks that no node
// container, network bridge, mount or process of ours is left. The node image stays in
// dockerd's data root (the cache of the next Up).
func (c Config) Down(ctx context.Context) error {
	var errs []string
	if c.dockerPID() != 0 {
		if c.clusterExists(ctx) {
			if err := c.stream(ctx, c.bin("kind"), "delete", "cluster", "--name", c.Cluster, "--kubeconfig", c.Kubeconfig()); err != nil {
				errs = append(errs, err.Error())
			}
		}
		if out, err := c.docker(ctx, "ps", "-aq", "--filter", "label=io.x-k8s.kind.cluster="+c.Cluster); err == nil {
			for _, id := range strings.Fields(out) {
				if _, err := c.docker(ctx, "rm", "-f", "-v", id); err != nil {
					errs = append(errs, err.Error())
				}
			}
		}
		if _, err := c.docker(ctx, "network", "inspect", Network); err == nil {
			if _, err := c.docker(ctx, "network", "rm", Network); err != nil {
				errs = append(errs, err.Error())
			}
		}
		if err := c.StopDocker(ctx); err != nil {
			errs = append(errs, err.Error())
		}
		removeDockerCgroups()
	} else if err := c.unmountUnder(c.dockerDir()); err != nil {
		errs = append(errs, err.Error())
	}
	if err := os.Remove(c.Kubeconfig()); err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, err.Error())
	}
	// Checks.
	if m := mountsUnder(c.Out); len(m) > 0 {
		errs = append(errs, "mounts left: "+strings.Join(m, " "))
	}
	if _, err := os.Stat("/sys/class/net/" + NetworkBridge); err == nil {
		errs = append(errs, "bridge "+NetworkBridge+" left")
	}
	if pids := processesUnder(c.Out); len(pids) > 0 {
		errs = append(errs, fmt.Sprintf("processes left: %v", pids))
	}
	if len(errs) > 0 {
		return fmt.Errorf("kind down: %s", strings.Join(errs, "; "))
	}
	c.say("down: no container, network, mount or process left")
	return nil
}

// processesUnder returns PIDs whose command line names dir (our dockerd, its containerd,
// shims).
func processesUnder(dir string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && strings.Contains(string(b), dir+"/") {
			pids = append(pids, pid)
		}
	}
	return pids
}

// removeDockerCgroups removes the empty /docker cgroup our dockerd (cgroupfs driver) made in
// every hierarchy; a non-empty one (another dockerd's containers) is left alone (rmdir fails).
// Only directories are removed: the host's cgroup mounts are never touched.
func removeDockerCgroups() {
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*/docker")
	// rmdir fails on a cgroup that is not empty, which is then left alone on purpose.
	for _, d := range dirs {
		_ = os.Remove(d)
	}
	_ = os.Remove("/sys/fs/cgroup/docker") // a pure cgroup v2 host
}

// ImportImages loads image tarballs into every node of the cluster (kind load
// image-archive): nothing is ever pulled.
func (c Config) ImportImages(ctx context.Context, imgs []images.Image) error {
	for _, img := range imgs {
		if err := c.run(ctx, nil, c.bin("kind"), "load", "image-archive", "--name", c.Cluster, img.Tarball); err != nil {
			return fmt.Errorf("load %s: %w", img.Name, err)
		}
	}
	return nil
}

// Kubectl runs our kubectl against the kind cluster, stdin from in; it returns stdout,
// and stderr in the error.
func (c Config) Kubectl(ctx context.Context, in []byte, args ...string) ([]byte, error) {
	var stdin io.Reader
	if in != nil {
		stdin = bytes.NewReader(in)
	}
	out, err := c.output(ctx, stdin, c.bin("kubectl"), append([]string{"--kubeconfig", c.Kubeconfig()}, args...)...)
	return []byte(out), err
}
