// Package kind runs coroner on a kind cluster on a machine without a registry: it builds a
// kind-compatible node image offline (a Debian bookworm root file system with systemd,
// containerd 2.x, runc, the CNI plugins and Kubernetes v1.36.3 built from Go modules, kind's
// node-side files from the sigs.k8s.io/kind module, and every image kubeadm needs, each
// built locally as an OCI tarball and pre-imported into the image's containerd), runs its
// own dockerd (its data root, exec root, socket and pidfile under _output/kind/docker,
// --iptables=false, a runtime that drops the capabilities missing from the bounding set),
// creates a kind cluster from that image (1 control plane, 2 workers), routes the pod
// networks itself (kindnetd cannot be built offline), loads coroner's images and applies
// deploy/overlays/kind.
//
// make kind-image, kind-lab, e2e-kind and kind-down drive it, in CI too. Command-line
// front end: go run ./test/kind/cmd {image|up|down|status}.
package kind

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/coroner-dev/coroner/test/host"
)

// KubeVersion is the Kubernetes version of the node image.
const KubeVersion = "v1.36.3"

// Config says where things are. Zero values mean the defaults of New.
type Config struct {
	// Root is the repository.
	Root string
	// Out is _output/kind: the root file system cache, the image tarballs, dockerd's
	// directories, the kubeconfig.
	Out string
	// BinDir is _output/bin (test/tools/build.sh's binaries, kind, the runtime wrapper).
	BinDir string
	// Cluster is the kind cluster's name.
	Cluster string
	// NodeImage is the docker image name of the node image.
	NodeImage string
	// Mirror is the Debian mirror debootstrap uses (from /etc/apt/sources.list*).
	Mirror string
	// Workers is the number of worker nodes.
	Workers int
	// CNI is the pod network: "daemonset" (test/kind/cni, kind's default CNI in the node
	// image) or "static" (no default CNI; Up writes each node's CNI configuration and routes
	// with docker exec). $CORONER_KIND_CNI; default daemonset.
	CNI string
	// Log receives progress lines.
	Log io.Writer
}

// New returns the default configuration for the repository around the working directory.
func New() (Config, error) {
	root, err := host.RepoRoot()
	if err != nil {
		return Config{}, err
	}
	return NewFor(root)
}

// NewFor returns the default configuration for the repository at root.
func NewFor(root string) (Config, error) {
	c := Config{
		Root:      root,
		Out:       filepath.Join(root, "_output", "kind"),
		BinDir:    filepath.Join(root, "_output", "bin"),
		Cluster:   "coroner",
		NodeImage: "coroner.dev/kind-node:" + KubeVersion,
		Workers:   2,
		CNI:       "daemonset",
		Log:       os.Stderr,
	}
	if v := os.Getenv("CORONER_KIND_CNI"); v != "" {
		if v != "daemonset" && v != "static" {
			return Config{}, fmt.Errorf("CORONER_KIND_CNI=%q: want daemonset or static", v)
		}
		c.CNI = v
		c.NodeImage += "-static-cni"
	}
	if m := os.Getenv("CORONER_KIND_MIRROR"); m != "" {
		c.Mirror = m
	} else {
		c.Mirror = aptMirror()
	}
	return c, nil
}

func (c Config) say(format string, args ...any) {
	fmt.Fprintf(c.Log, "kind: "+format+"\n", args...)
}

// dockerDir holds our dockerd's data root, exec root, socket, pidfile and log.
func (c Config) dockerDir() string { return filepath.Join(c.Out, "docker") }

// DockerHost is the DOCKER_HOST of our dockerd.
func (c Config) DockerHost() string {
	return "unix://" + filepath.Join(c.dockerDir(), "docker.sock")
}

// Kubeconfig is the kind cluster's kubeconfig.
func (c Config) Kubeconfig() string { return filepath.Join(c.Out, "kubeconfig") }

func (c Config) bin(name string) string { return filepath.Join(c.BinDir, name) }

// env is the environment of docker, kind and kubectl: our dockerd, our kubeconfig, our
// binaries first on PATH.
func (c Config) env() []string {
	var env []string
	for _, e := range os.Environ() {
		if strings.HasPrefix(e, "DOCKER_HOST=") || strings.HasPrefix(e, "KUBECONFIG=") || strings.HasPrefix(e, "PATH=") ||
			strings.HasPrefix(e, "KIND_EXPERIMENTAL_DOCKER_NETWORK=") {
			continue
		}
		env = append(env, e)
	}
	return append(env, "DOCKER_HOST="+c.DockerHost(), "KUBECONFIG="+c.Kubeconfig(),
		"PATH="+c.BinDir+":"+os.Getenv("PATH"), "KIND_EXPERIMENTAL_DOCKER_NETWORK="+Network)
}

// run runs a command with c.env(), its output going to the log; the error carries the
// output's tail.
func (c Config) run(ctx context.Context, stdin io.Reader, name string, args ...string) error {
	_, err := c.output(ctx, stdin, name, args...)
	return err
}

// output runs a command and returns its standard output.
func (c Config) output(ctx context.Context, stdin io.Reader, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = c.env()
	cmd.Dir = c.Root
	cmd.Stdin = stdin
	var out, errb bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &errb
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("%s %s: %w\n%s%s", name, strings.Join(args, " "), err, tail(out.String(), 2000), tail(errb.String(), 4000))
	}
	return out.String(), nil
}

// stream runs a command whose output goes to the log as it comes.
func (c Config) stream(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = c.env()
	cmd.Dir = c.Root
	cmd.Stdout, cmd.Stderr = c.Log, c.Log
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	return nil
}

func (c Config) docker(ctx context.Context, args ...string) (string, error) {
	return c.output(ctx, nil, "docker", args...)
}

func (c Config) kubectl(ctx context.Context, args ...string) (string, error) {
	return c.output(ctx, nil, c.bin("kubectl"), append([]string{"--kubeconfig", c.Kubeconfig()}, args...)...)
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// aptMirror returns the first Debian URI of /etc/apt/sources.list{,.d/*} (deb822 or
// one-line format), else deb.debian.org.
func aptMirror() string {
	files, _ := filepath.Glob("/etc/apt/sources.list.d/*.sources")
	more, _ := filepath.Glob("/etc/apt/sources.list.d/*.list")
	files = append(append([]string{"/etc/apt/sources.list"}, files...), more...)
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
			line = strings.TrimSpace(line)
			var uri string
			if v, ok := strings.CutPrefix(line, "URIs:"); ok {
				uri = strings.Fields(v + " ")[0]
			} else if strings.HasPrefix(line, "deb ") {
				for _, f := range strings.Fields(line)[1:] {
					if strings.Contains(f, "://") {
						uri = f
						break
					}
				}
			}
			if uri != "" && strings.Contains(uri, "debian") && !strings.Contains(uri, "security") {
				return uri
			}
		}
	}
	return "http://deb.debian.org/debian"
}

// waitFor polls check every interval until it returns true or an error, or timeout.
func waitFor(ctx context.Context, timeout, interval time.Duration, what string, check func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		ok, err := check()
		if ok {
			return nil
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			if last != nil {
				return fmt.Errorf("%s: not within %s: %w", what, timeout, last)
			}
			return fmt.Errorf("%s: not within %s", what, timeout)
		case <-time.After(interval):
		}
	}
}
