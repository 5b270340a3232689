// Package containerd starts a real containerd with its CRI plugin for tests (Debian's 1.6
// with runc 1.1, 1.7 built from its module with Debian's runc, or 2.x with runc 1.5 built
// from their modules: see Runtime), and plays the kubelet over CRI: pod sandboxes and
// containers with the kubelet's labels, a cgroup parent, a command and a memory limit.
//
// One containerd is shared by the tests of a package:
//
//	func TestMain(m *testing.M) { os.Exit(containerdtest.Main(m)) }
//
//	func TestSomething(t *testing.T) {
//		env := containerdtest.Shared(t)
//		pod, err := env.RunPod(ctx, "ns", "name")
//		id, err := pod.StartContainer(ctx, containerd.Container{Name: "main", Command: []string{"sh", "-c", "exit 3"}})
//		...
//	}
//
// The containerd is configured as lab-notes.md says works on these machines:
// restrict_oom_score_adj (no CAP_SYS_RESOURCE), runc v2 with cgroupfs (SystemdCgroup
// false), the overlayfs snapshotter, sandbox_image registry.k8s.io/pause:coroner built by
// test/images and imported with ctr, and an empty CNI config directory: sandboxes use the
// node's network namespace (NamespaceMode NODE), so no CNI plugin is ever called. Its
// socket, root and state live in /tmp/coroner-containerd/<pid>-<n> (or under
// $CORONER_CONTAINERD_DIR), and pods get cgroup parents under /coroner-containerd-<pid>-<n>,
// created in every cgroup v1 hierarchy (and the hybrid host's cgroup2 one, where runc
// also makes the containers' cgroups).
//
// Nothing is left behind: containerd runs with a parent-death signal and in its own process
// group; Stop removes every pod over CRI, then kills containerd, every process in the test
// cgroups and every shim of this containerd, unmounts what is mounted under its directory,
// removes the cgroups, the shims' sockets in /run/containerd/s and the directory. Shims
// outlive a test binary that dies (they are daemons), so Start first sweeps what earlier
// test processes that are gone left behind, the same way.
package containerd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/coroner-dev/coroner/test/host"
	"github.com/coroner-dev/coroner/test/images"
)

// Options tune Start. The zero value is what tests want.
type Options struct {
	// BaseDir holds one directory per containerd; default $CORONER_CONTAINERD_DIR, else
	// /tmp/coroner-containerd. Unix socket paths are limited to 107 bytes, so keep it short.
	BaseDir string
	// Keep leaves the directory (logs, config) after Stop; also set by
	// CORONER_CONTAINERD_KEEP=1. Processes, mounts and cgroups are removed regardless.
	Keep bool
	// Images are imported after start; default images.BuildAll.
	Images []images.Image
	// Runtime is the containerd build to run; default Debian's.
	Runtime *Runtime
}

// Env is a running containerd with the CRI plugin.
type Env struct {
	// Socket is containerd's gRPC socket, serving both CRI and containerd's own API.
	Socket string
	// Endpoint is Socket as a CRI endpoint, unix://...
	Endpoint string
	// Dir holds config.toml, containerd.log, root/, state/, pod logs.
	Dir string
	// CgroupName is the test cgroup, a direct child of the root of every hierarchy;
	// pods get cgroup parents below it.
	CgroupName string
	// Runtime and Images are CRI clients on Socket.
	Runtime runtimeapi.RuntimeServiceClient
	Images  runtimeapi.ImageServiceClient
	// Version is what containerd's CRI Version call reports, e.g. "containerd 1.6.20~ds1".
	Version string
	// Containerd is the build that runs.
	Containerd Runtime
	// StartupTime is how long the first start took until CRI reported RuntimeReady;
	// ImportTime how long importing the images took (build not included).
	StartupTime, ImportTime time.Duration

	conn    *grpc.ClientConn
	keep    bool
	mu      sync.Mutex
	proc    *host.Process
	stopped bool
}

// ErrNotAvailable means containerd, runc or busybox-static is not installed, or the test
// does not run as root.
var ErrNotAvailable = errors.New("containerd not available")

const defaultBaseDir = "/tmp/coroner-containerd"

var envCounter atomic.Int32

// Start builds and imports the test images when opts.Images is empty, starts containerd and
// waits until its CRI plugin is ready.
func Start(ctx context.Context, opts Options) (_ *Env, err error) {
	var rt Runtime
	if opts.Runtime != nil {
		rt = *opts.Runtime
	} else if rt, err = Debian(); err != nil {
		return nil, err
	}
	base := opts.BaseDir
	if base == "" {
		base = os.Getenv("CORONER_CONTAINERD_DIR")
	}
	if base == "" {
		base = defaultBaseDir
	}
	if err := os.MkdirAll(base, 0o755); err != nil {
		return nil, err
	}
	sweep(base)

	imgs := opts.Images
	if len(imgs) == 0 {
		if imgs, err = images.BuildAll(ctx, ""); err != nil {
			if errors.Is(err, images.ErrNoBusybox) {
				return nil, fmt.Errorf("%w: %v", ErrNotAvailable, err)
			}
			return nil, fmt.Errorf("building the test images: %w", err)
		}
	}

	n := envCounter.Add(1)
	name := fmt.Sprintf("%d-%d", os.Getpid(), n)
	dir := filepath.Join(base, name)
	e := &Env{
		Dir:        dir,
		Socket:     filepath.Join(dir, "containerd.sock"),
		CgroupName: "coroner-containerd-" + name,
		keep:       opts.Keep || os.Getenv("CORONER_CONTAINERD_KEEP") == "1",
		Containerd: rt,
	}
	e.Endpoint = "unix://" + e.Socket
	if len(e.Socket) > 100 {
		return nil, fmt.Errorf("socket path %s is too long for a unix socket; use a shorter base dir", e.Socket)
	}
	if err := os.MkdirAll(filepath.Join(dir, "cni"), 0o755); err != nil {
		return nil, err
	}
	if err := writeOwner(dir, e.CgroupName); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			e.Stop()
		}
	}()
	if err := host.CreateCgroup(e.CgroupName); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(e.config()), 0o644); err != nil {
		return nil, err
	}
	start := time.Now()
	if err := e.start(ctx); err != nil {
		return nil, err
	}
	e.StartupTime = time.Since(start)

	start = time.Now()
	for _, img := range imgs {
		if err := images.Import(ctx, rt.Ctr, e.Socket, img.Tarball); err != nil {
			return nil, err
		}
	}
	e.ImportTime = time.Since(start)
	// The CRI plugin learns about imported images from containerd's events; wait until it
	// knows every one, or the first sandbox would try to pull the pause image.
	for _, img := range imgs {
		if err := e.waitImage(ctx, img.Name, 10*time.Second); err != nil {
			return nil, err
		}
	}
	return e, nil
}

// config is containerd's config.toml for this Env.
func (e *Env) config() string {
	return ConfigTOML(ConfigDirs{
		Root:     filepath.Join(e.Dir, "root"),
		State:    filepath.Join(e.Dir, "state"),
		Socket:   e.Socket,
		Opt:      filepath.Join(e.Dir, "opt"),
		RuncRoot: filepath.Join(e.Dir, "runc"),
		CNIConf:  filepath.Join(e.Dir, "cni"),
		Runtime:  e.Containerd,
	})
}

// ConfigDirs are the paths of one containerd instance.
type ConfigDirs struct {
	Root, State, Socket, Opt string
	// RuncRoot is runc's state directory; without it runc uses /run/containerd/runc/k8s.io
	// whatever State says, and two containerds would share it.
	RuncRoot string
	// CNIConf is the CNI configuration directory (plugins from /usr/lib/cni).
	CNIConf string
	// Runtime says which containerd reads the config (version 2 for 1.x, 3 for 2.x) and
	// which shim and runc it runs.
	Runtime Runtime
}

// ConfigTOML is a containerd config.toml that works on these machines (lab-notes.md):
// restrict_oom_score_adj (no CAP_SYS_RESOURCE), overlayfs, runc v2 with cgroupfs, the
// local pause image, and the snapshotters this host cannot run disabled; version 2 for
// containerd 1.x, version 3 for 2.x (d.Runtime.Major). test/containerd and the lab's nodes
// use it.
//
// containerd 1.7 reads the same version 2 as 1.6, with two additions: its runc shim is
// named by path (runtime_path, which 1.7 honours: Debian's 1.6 shim on PATH would
// otherwise be found first), and its blockfile snapshotter, new in 1.7 and unusable
// without a scratch file, is disabled with the others. NRI, also new in 1.7, is off by
// default there.
func ConfigTOML(d ConfigDirs) string {
	if d.Runtime.Major >= 2 {
		return configV3(d)
	}
	runc, disabled := "", ""
	if d.Runtime.Minor >= 7 {
		runc = fmt.Sprintf("\n      runtime_path = %q", d.Runtime.Shim)
		disabled = `, "io.containerd.snapshotter.v1.blockfile"`
	}
	runc += "\n      [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\n        SystemdCgroup = false"
	runc += fmt.Sprintf("\n        Root = %q", d.RuncRoot)
	if d.Runtime.Runc != "" {
		runc += fmt.Sprintf("\n        BinaryName = %q", d.Runtime.Runc)
	}
	return fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
oom_score = 0
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"%[6]s]

[grpc]
  address = %[3]q

[debug]
  level = "info"

[plugins."io.containerd.internal.v1.opt"]
  path = %[4]q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[5]q
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"%[8]s
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %[7]q
    max_conf_num = 1
`, d.Root, d.State, d.Socket, d.Opt, images.PauseName, disabled, d.CNIConf, runc)
}

// configV3 is the config of containerd 2.x: the CRI plugin is split into images, runtime
// and the gRPC service; the runc shim is named by path (Debian's 1.6 shim on PATH would
// otherwise be found first), NRI is off (its socket, /var/run/nri/nri.sock, is one per
// machine and the lab runs several containerds).
func configV3(d ConfigDirs) string {
	return fmt.Sprintf(`version = 3
root = %[1]q
state = %[2]q
oom_score = 0
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.erofs", "io.containerd.nri.v1.nri"]

[grpc]
  address = %[3]q

[ttrpc]
  address = "%[3]s.ttrpc"

[debug]
  level = "info"

[plugins."io.containerd.internal.v1.opt"]
  path = %[4]q

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = %[5]q

[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  enable_selinux = false
  disable_apparmor = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      runtime_path = %[8]q
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = %[6]q
        BinaryName = %[9]q
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = %[7]q
    max_conf_num = 1

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
`, d.Root, d.State, d.Socket, d.Opt, images.PauseName, d.RuncRoot, d.CNIConf, d.Runtime.Shim, d.Runtime.Runc)
}

// start runs containerd and waits until CRI says the runtime is ready. Every start gets a
// new gRPC connection with a short reconnect backoff: with gRPC's default one (1 s) a
// connection that dialled before containerd listened, or saw it die, waits a second.
func (e *Env) start(ctx context.Context) error {
	p, err := host.StartProcess(e.Dir, "containerd", e.Containerd.Containerd, "--config", filepath.Join(e.Dir, "config.toml"))
	if err != nil {
		return err
	}
	// Short reconnect backoff: the first dials happen before containerd listens.
	conn, err := grpc.NewClient("unix://"+e.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, MaxDelay: time.Second},
			MinConnectTimeout: time.Second,
		}))
	if err != nil {
		return err
	}
	e.mu.Lock()
	e.proc = p
	if e.conn != nil {
		e.conn.Close()
	}
	e.conn = conn
	e.Runtime = runtimeapi.NewRuntimeServiceClient(conn)
	e.Images = runtimeapi.NewImageServiceClient(conn)
	e.mu.Unlock()
	deadline := time.Now().Add(30 * time.Second)
	var last error
	for {
		if done, werr := p.Exited(); done {
			return fmt.Errorf("containerd exited: %v\n%s", werr, p.LogTail(4000))
		}
		last = e.ready(ctx)
		if last == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("containerd not ready within 30s: %v\n%s", last, p.LogTail(4000))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (e *Env) ready(ctx context.Context) error {
	if _, err := os.Stat(e.Socket); err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	v, err := e.Runtime.Version(cctx, &runtimeapi.VersionRequest{})
	if err != nil {
		return err
	}
	e.Version = v.RuntimeName + " " + v.RuntimeVersion
	st, err := e.Runtime.Status(cctx, &runtimeapi.StatusRequest{})
	if err != nil {
		return err
	}
	for _, c := range st.GetStatus().GetConditions() {
		if c.Type == runtimeapi.RuntimeReady && c.Status {
			return nil
		}
	}
	return fmt.Errorf("CRI status: %v", st.GetStatus())
}

func (e *Env) waitImage(ctx context.Context, name string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		r, err := e.Images.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: name}})
		if err == nil && r.Image != nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("CRI does not see image %s after import (err %v)", name, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Kill stops containerd with SIGKILL, as a crash would; its shims and containers keep
// running. Start it again with Start.
func (e *Env) Kill() {
	e.mu.Lock()
	p := e.proc
	e.mu.Unlock()
	if p != nil {
		p.Kill()
	}
}

// StartAgain starts containerd after Kill, with the same directories; it recovers the
// containers its shims kept running and the exits they recorded meanwhile. Runtime and
// Images are replaced by clients on a new connection.
func (e *Env) StartAgain(ctx context.Context) error {
	e.mu.Lock()
	if e.stopped {
		e.mu.Unlock()
		return errors.New("containerd env already stopped")
	}
	e.mu.Unlock()
	return e.start(ctx)
}

// Restart kills containerd (SIGKILL, as a crash) and starts it again with the same
// directories: containers keep running under their shims meanwhile.
func (e *Env) Restart(ctx context.Context) error {
	e.Kill()
	return e.StartAgain(ctx)
}

// PID is containerd's process id (0 when not running).
func (e *Env) PID() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.proc == nil {
		return 0
	}
	if done, _ := e.proc.Exited(); done {
		return 0
	}
	return e.proc.PID()
}

// Stop removes every pod over CRI, stops containerd and removes everything it left: shims,
// container processes, mounts, cgroups, sockets and (unless Keep) the directory. It is
// safe to call twice.
func (e *Env) Stop() {
	e.mu.Lock()
	if e.stopped {
		e.mu.Unlock()
		return
	}
	e.stopped = true
	p := e.proc
	e.mu.Unlock()

	if p != nil && e.Runtime != nil {
		if done, _ := p.Exited(); !done {
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			e.removeAllPods(ctx)
			cancel()
		}
	}
	if p != nil {
		p.Stop(5 * time.Second)
	}
	if e.conn != nil {
		e.conn.Close()
	}
	cleanup(e.Dir, e.CgroupName, e.keep)
}

func (e *Env) removeAllPods(ctx context.Context) {
	r, err := e.Runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return
	}
	for _, s := range r.Items {
		_, _ = e.Runtime.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: s.Id})
		_, _ = e.Runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: s.Id})
	}
}

// LogTail returns the end of containerd's log, for failure messages.
func (e *Env) LogTail(n int) string {
	e.mu.Lock()
	p := e.proc
	e.mu.Unlock()
	if p == nil {
		return ""
	}
	return p.LogTail(n)
}

// writeOwner records which process owns dir, so a later sweep can tell whether it is
// still in use.
func writeOwner(dir, cgroupName string) error {
	st, err := procStartTime(os.Getpid())
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "owner"), []byte(fmt.Sprintf("%d %s %s\n", os.Getpid(), st, cgroupName)), 0o644)
}

// procStartTime is field 22 of /proc/PID/stat, the start time in clock ticks since boot,
// which tells a process from a later one with the same pid.
func procStartTime(pid int) (string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return "", fmt.Errorf("odd /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return "", fmt.Errorf("odd /proc/%d/stat", pid)
	}
	return f[19], nil // fields after ")" start at field 3
}

// sweep cleans the directories under base whose owner process is gone.
func sweep(base string) {
	entries, err := os.ReadDir(base)
	if err != nil {
		return
	}
	for _, ent := range entries {
		dir := filepath.Join(base, ent.Name())
		b, err := os.ReadFile(filepath.Join(dir, "owner"))
		if err != nil {
			continue
		}
		var pid int
		var start, cg string
		if _, err := fmt.Sscan(string(b), &pid, &start, &cg); err != nil {
			continue
		}
		if st, err := procStartTime(pid); err == nil && st == start {
			continue // still running
		}
		cleanup(dir, cg, false)
	}
}
