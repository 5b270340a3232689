package kind

import (
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/coroner-dev/coroner/test/host"
	"github.com/coroner-dev/coroner/test/images"
)

// Versions of the node image's contents, as kubeadm v1.36.3 expects them
// (`kubeadm config images list --kubernetes-version v1.36.3`).
const (
	KindVersion   = "v0.32.0"
	EtcdTag       = "3.6.8-0"
	CoreDNSTag    = "v1.14.2"
	PauseTag      = "3.10.2"
	imageRecipe   = "coroner-kind-node/3" // bump when the recipe changes in a way no input shows
	bookwormStamp = "bookworm/1"
)

// debPackages are installed by debootstrap (--variant=minbase) into the node's root file
// system: kind's base image's list (images/base/Dockerfile) less what cannot or need not
// be here (fuse-overlayfs, nfs-common, open-iscsi, curl), plus Debian's CNI plugins
// (bridge, ptp, host-local, loopback, portmap) and socat (kubectl port-forward).
var debPackages = []string{
	"systemd", "systemd-sysv", "dbus", "conntrack", "iptables", "nftables", "iproute2", "ethtool",
	"util-linux", "mount", "kmod", "libseccomp2", "pigz", "bash", "ca-certificates", "procps",
	"socat", "containernetworking-plugins", "e2fsprogs", "jq",
}

// kubeTools are built by test/tools/build.sh for the image.
var kubeTools = []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet",
	"kubectl", "kubeadm", "kube-proxy", "etcd", "containerd2", "runc", "kind", "coredns"}

// BuildTools runs test/tools/build.sh for everything the image and the cluster need (it
// skips what is up to date).
func (c Config) BuildTools(ctx context.Context) error {
	cmd := exec.CommandContext(ctx, filepath.Join(c.Root, "test", "tools", "build.sh"), kubeTools...)
	cmd.Dir = c.Root
	cmd.Env = append(os.Environ(), "CORONER_BIN_DIR="+c.BinDir)
	cmd.Stdout, cmd.Stderr = c.Log, c.Log
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("test/tools/build.sh: %w", err)
	}
	return nil
}

// kindModule returns the directory of the sigs.k8s.io/kind module source (downloaded
// through the module proxy if needed): the node-side files come from there.
func (c Config) kindModule(ctx context.Context) (string, error) {
	return host.ModuleDir(ctx, "sigs.k8s.io/kind@"+KindVersion)
}

// kubeModule returns the directory of k8s.io/kubernetes (pause.c lives there).
func (c Config) kubeModule(ctx context.Context) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "k8s.io/kubernetes")
	cmd.Dir = filepath.Join(c.Root, "test", "tools")
	out, err := cmd.Output()
	if err != nil || strings.TrimSpace(string(out)) == "" {
		return "", fmt.Errorf("go list -m k8s.io/kubernetes (test/tools): %v", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// bookworm returns the cached debootstrap root file system, making it if needed.
func (c Config) bookworm(ctx context.Context) (string, error) {
	dir := filepath.Join(c.Out, "bookworm")
	want := bookwormStamp + " " + c.Mirror + " " + strings.Join(debPackages, ",")
	if got, err := os.ReadFile(dir + ".stamp"); err == nil && string(got) == want {
		if _, err := os.Stat(filepath.Join(dir, "usr/lib/systemd/systemd")); err == nil {
			return dir, nil
		}
	}
	if _, err := exec.LookPath("debootstrap"); err != nil {
		return "", fmt.Errorf("debootstrap missing: apt-get install debootstrap")
	}
	tmp := dir + ".tmp"
	for _, d := range []string{tmp, dir} {
		if err := os.RemoveAll(d); err != nil {
			return "", err
		}
	}
	start := time.Now()
	c.say("debootstrap bookworm from %s (about 80 s)", c.Mirror)
	if err := c.run(ctx, nil, "debootstrap", "--variant=minbase", "--include="+strings.Join(debPackages, ","),
		"bookworm", tmp, c.Mirror); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return "", err
	}
	c.say("debootstrap done in %s", time.Since(start).Round(time.Second))
	return dir, os.WriteFile(dir+".stamp", []byte(want), 0o644)
}

// componentImages builds the images kubeadm v1.36.3 runs, as OCI tarballs in
// _output/kind/images.
func (c Config) componentImages(ctx context.Context, rootfs string) ([]ociImage, error) {
	dir := filepath.Join(c.Out, "images")
	var imgs []ociImage
	add := func(img ociImage, err error) error {
		if err != nil {
			return err
		}
		imgs = append(imgs, img)
		return nil
	}
	for _, n := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
		e := append(baseEntries(), entry{Path: "usr/local/bin/" + n, Src: c.bin(n), Mode: 0o755})
		if err := add(writeOCI(dir, n, "registry.k8s.io/"+n+":"+KubeVersion, e, []string{"/usr/local/bin/" + n}, nil)); err != nil {
			return nil, err
		}
	}
	e := append(baseEntries(), entry{Path: "usr/local/bin/etcd", Src: c.bin("etcd"), Mode: 0o755},
		entry{Path: "var/lib/etcd", Dir: true, Mode: 0o700})
	if err := add(writeOCI(dir, "etcd", "registry.k8s.io/etcd:"+EtcdTag, e, []string{"/usr/local/bin/etcd"}, nil)); err != nil {
		return nil, err
	}
	// CoreDNS's Deployment passes only arguments: the entrypoint is /coredns.
	e = append(baseEntries(), entry{Path: "coredns", Src: filepath.Join(c.BinDir, "coredns", "coredns"), Mode: 0o755})
	if err := add(writeOCI(dir, "coredns", "registry.k8s.io/coredns/coredns:"+CoreDNSTag, e, []string{"/coredns"}, nil)); err != nil {
		return nil, err
	}
	// pause, from the k8s.io/kubernetes module's build/pause/linux/pause.c, static.
	pause, err := c.buildPause(ctx)
	if err != nil {
		return nil, err
	}
	e = []entry{{Path: "pause", Src: pause, Mode: 0o755}}
	if err := add(writeOCI(dir, "pause", "registry.k8s.io/pause:"+PauseTag, e, []string{"/pause"}, nil)); err != nil {
		return nil, err
	}
	// kube-proxy (iptables mode): iptables-nft from the node's Debian root file system, with
	// its xtables extensions and the libraries they load.
	e, err = iptablesEntries(rootfs)
	if err != nil {
		return nil, err
	}
	e = append(append(baseEntries(), e...), entry{Path: "usr/local/bin/kube-proxy", Src: c.bin("kube-proxy"), Mode: 0o755})
	if err := add(writeOCI(dir, "kube-proxy", "registry.k8s.io/kube-proxy:"+KubeVersion, e, []string{"/usr/local/bin/kube-proxy"}, nil)); err != nil {
		return nil, err
	}
	return imgs, nil
}

// CNIImage is the image of test/kind/cni (coroner-kind-cni), pre-imported into the node.
const CNIImage = "coroner.dev/kind-cni:dev"

// cniImage builds coroner-kind-cni (static) and its image with test/images.FromBinary.
func (c Config) cniImage(ctx context.Context) (ociImage, error) {
	bin := filepath.Join(c.Out, "bin", "coroner-kind-cni")
	if err := c.goBuild(ctx, bin, "./test/kind/cni"); err != nil {
		return ociImage{}, err
	}
	img, err := images.FromBinary(filepath.Join(c.Out, "images"), CNIImage, bin)
	if err != nil {
		return ociImage{}, err
	}
	return ociImage{Name: img.Name, Tarball: img.Tarball, Digest: img.Digest}, nil
}

func (c Config) buildPause(ctx context.Context) (string, error) {
	km, err := c.kubeModule(ctx)
	if err != nil {
		return "", err
	}
	src := filepath.Join(km, "build", "pause", "linux", "pause.c")
	out := filepath.Join(c.Out, "pause")
	if st, err := os.Stat(out); err == nil && st.Size() > 0 {
		return out, nil
	}
	if err := c.run(ctx, nil, "gcc", "-Os", "-Wall", "-static", "-DVERSION=v"+PauseTag, "-o", out, src); err != nil {
		return "", fmt.Errorf("pause: %w (needs gcc and libc6-dev)", err)
	}
	return out, nil
}

// iptablesEntries returns xtables-nft-multi, its iptables/ip6tables names, the xtables
// extensions and every shared library they need (DT_NEEDED, transitively), from rootfs.
func iptablesEntries(rootfs string) ([]entry, error) {
	libdir := "usr/lib/x86_64-linux-gnu"
	var es []entry
	seen := map[string]bool{}
	var need func(rel string) error
	need = func(rel string) error {
		if seen[rel] {
			return nil
		}
		seen[rel] = true
		full := filepath.Join(rootfs, rel)
		real, err := filepath.EvalSymlinks(full)
		if err != nil {
			return err
		}
		es = append(es, entry{Path: rel, Src: real, Mode: 0o755})
		f, err := elf.Open(real)
		if err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		libs, _ := f.ImportedLibraries()
		_ = f.Close() // read only
		for _, l := range libs {
			if err := need(filepath.Join(libdir, l)); err != nil {
				return err
			}
		}
		return nil
	}
	if err := need("usr/sbin/xtables-nft-multi"); err != nil {
		return nil, err
	}
	exts, _ := filepath.Glob(filepath.Join(rootfs, libdir, "xtables", "*.so"))
	for _, x := range exts {
		rel, _ := filepath.Rel(rootfs, x)
		if err := need(rel); err != nil {
			return nil, err
		}
	}
	// The dynamic loader, where the binaries' PT_INTERP says.
	if err := need(filepath.Join(libdir, "ld-linux-x86-64.so.2")); err != nil {
		return nil, err
	}
	es = append(es,
		entry{Path: "lib", Link: "usr/lib"}, entry{Path: "lib64", Link: "usr/lib64"}, entry{Path: "sbin", Link: "usr/sbin"},
		entry{Path: "usr/lib64/ld-linux-x86-64.so.2", Link: "../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"})
	for _, n := range []string{"iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore",
		"iptables-nft", "iptables-nft-save", "iptables-nft-restore", "ip6tables-nft", "ip6tables-nft-save", "ip6tables-nft-restore"} {
		es = append(es, entry{Path: "usr/sbin/" + n, Link: "xtables-nft-multi"})
	}
	if p, err := os.ReadFile(filepath.Join(rootfs, "etc/protocols")); err == nil {
		es = append(es, entry{Path: "etc/protocols", Data: p, Mode: 0o644})
	}
	return es, nil
}

// BuildImage builds the node image into our dockerd (started if needed) unless the image
// there was built from the same inputs (a label records their checksum).
func (c Config) BuildImage(ctx context.Context) error {
	start := time.Now()
	if err := c.BuildTools(ctx); err != nil {
		return err
	}
	rootfs, err := c.bookworm(ctx)
	if err != nil {
		return err
	}
	kindDir, err := c.kindModule(ctx)
	if err != nil {
		return err
	}
	comps, err := c.componentImages(ctx, rootfs)
	if err != nil {
		return err
	}
	if c.CNI != "static" {
		cni, err := c.cniImage(ctx)
		if err != nil {
			return err
		}
		comps = append(comps, cni)
	}
	for _, i := range comps {
		c.say("image %s", i)
	}
	if err := c.StartDocker(ctx); err != nil {
		return err
	}
	stamp, err := c.imageStamp(rootfs, kindDir, comps)
	if err != nil {
		return err
	}
	if got, err := c.docker(ctx, "image", "inspect", "--format", `{{index .Config.Labels "dev.coroner.kind.stamp"}}`, c.NodeImage); err == nil && strings.TrimSpace(got) == stamp {
		c.say("node image %s up to date (%s)", c.NodeImage, time.Since(start).Round(time.Second))
		return nil
	}

	stage := filepath.Join(c.Out, "stage")
	if err := c.removeStage(stage); err != nil {
		return err
	}
	t := time.Now()
	if err := c.run(ctx, nil, "cp", "-a", rootfs, stage); err != nil {
		return err
	}
	defer func() {
		// The next build removes it first: say so, but the image is made all the same.
		if err := c.removeStage(stage); err != nil {
			c.say("removing %s: %v", stage, err)
		}
	}()
	if err := c.installNodeFiles(ctx, stage, kindDir); err != nil {
		return err
	}
	c.say("node root file system assembled in %s", time.Since(t).Round(time.Second))
	t = time.Now()
	if err := c.preload(ctx, stage, comps); err != nil {
		return err
	}
	c.say("images pre-imported into the node's containerd in %s", time.Since(t).Round(time.Second))
	t = time.Now()
	if err := c.dockerImport(ctx, stage, stamp); err != nil {
		return err
	}
	c.say("docker import %s in %s", c.NodeImage, time.Since(t).Round(time.Second))
	c.say("node image %s built in %s", c.NodeImage, time.Since(start).Round(time.Second))
	return nil
}

func (c Config) removeStage(stage string) error {
	if err := c.unmountUnder(stage); err != nil {
		return err
	}
	return os.RemoveAll(stage)
}

// imageStamp is the checksum of the image's inputs: the recipe, the root file system's
// stamp, every binary (size and modification time) and component image (digest), kind's
// node-side files.
func (c Config) imageStamp(rootfs, kindDir string, comps []ociImage) (string, error) {
	h := sha256.New()
	// A hash's Write never returns an error, so neither do these Fprintln.
	_, _ = fmt.Fprintln(h, imageRecipe, KubeVersion, KindVersion)
	if b, err := os.ReadFile(rootfs + ".stamp"); err == nil {
		h.Write(b)
	}
	var files []string
	for _, n := range []string{"kubelet", "kubeadm", "kubectl"} {
		files = append(files, c.bin(n))
	}
	for _, n := range []string{"containerd", "containerd-shim-runc-v2", "ctr", "runc"} {
		files = append(files, filepath.Join(c.BinDir, "containerd2", n))
	}
	// What cannot be read is left out of the stamp: the walk itself never fails.
	if err := filepath.Walk(filepath.Join(kindDir, "images", "base", "files"), func(p string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() {
			files = append(files, p)
		}
		return nil
	}); err != nil {
		return "", err
	}
	sort.Strings(files)
	for _, f := range files {
		st, err := os.Stat(f)
		if err != nil {
			return "", err
		}
		_, _ = fmt.Fprintln(h, f, st.Size(), st.ModTime().UnixNano())
	}
	for _, i := range comps {
		_, _ = fmt.Fprintln(h, i.Name, i.Digest)
	}
	_, _ = fmt.Fprintln(h, nodeFilesVersion, c.CNI)
	h.Write(cniManifest)
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// copyFile copies src to dst (parents created) with mode.
func copyFile(src, dst string, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer func() { _ = in.Close() }() // read only
	if err := removeOld(dst); err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		return errors.Join(err, out.Close())
	}
	return out.Close()
}

// removeOld removes dst, if there, so that it is made anew with the mode asked.
func removeOld(dst string) error {
	if err := os.Remove(dst); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

func writeFile(dst string, data []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	if err := removeOld(dst); err != nil {
		return err
	}
	return os.WriteFile(dst, data, mode)
}

// preload imports the component images into the node's containerd store
// (stage/var/lib/containerd) with a private containerd 2.x on the host: its own socket
// and state directory, no CRI plugin, stopped afterwards.
func (c Config) preload(ctx context.Context, stage string, comps []ociImage) (err error) {
	work, err := os.MkdirTemp("", "coroner-kind-ctrd-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(work) }() // a temporary directory: a leftover is harmless
	sock := filepath.Join(work, "containerd.sock")
	cfg := fmt.Sprintf(`version = 3
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.images", "io.containerd.cri.v1.runtime", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.blockfile", "io.containerd.snapshotter.v1.erofs", "io.containerd.internal.v1.opt", "io.containerd.nri.v1.nri"]
[grpc]
  address = %q
[ttrpc]
  address = %q
`, filepath.Join(stage, "var/lib/containerd"), filepath.Join(work, "state"), sock, sock+".ttrpc")
	if err := os.WriteFile(filepath.Join(work, "config.toml"), []byte(cfg), 0o644); err != nil {
		return err
	}
	logf, err := os.Create(filepath.Join(c.Out, "preload-containerd.log"))
	if err != nil {
		return err
	}
	// containerd writes the log through a descriptor of its own; this one is not written.
	defer func() { _ = logf.Close() }()
	ctrd := exec.Command(filepath.Join(c.BinDir, "containerd2", "containerd"), "--config", filepath.Join(work, "config.toml"))
	ctrd.Stdout, ctrd.Stderr = logf, logf
	ctrd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := ctrd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() {
		_ = ctrd.Wait() // stopped on purpose below; how it ended is in its log
		close(done)
	}()
	defer func() {
		// Errors only when it has exited already, which is what is wanted.
		_ = ctrd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = ctrd.Process.Kill()
			<-done
		}
		// A mount left in the stage would go into the node image: the build fails.
		if uerr := c.unmountUnder(stage); uerr != nil {
			err = errors.Join(err, uerr)
		}
	}()
	ctr := filepath.Join(c.BinDir, "containerd2", "ctr")
	if err := waitFor(ctx, 30*time.Second, 200*time.Millisecond, "preload containerd", func() (bool, error) {
		select {
		case <-done:
			return false, fmt.Errorf("containerd exited, see %s", logf.Name())
		default:
		}
		return c.run(ctx, nil, ctr, "-a", sock, "version") == nil, nil
	}); err != nil {
		return err
	}
	for _, img := range comps {
		f, err := os.Open(img.Tarball)
		if err != nil {
			return err
		}
		// The labels are those kind's own node image build sets: CRI-managed, and pinned so
		// that the kubelet's image GC never removes them.
		err = c.run(ctx, f, ctr, "-a", sock, "-n", "k8s.io", "images", "import", "--local", "--discard-unpacked-layers",
			"--snapshotter", "overlayfs", "--label", "io.cri-containerd.image=managed",
			"--label", "io.cri-containerd.pinned=pinned", "-")
		_ = f.Close() // read only
		if err != nil {
			return fmt.Errorf("import %s: %w", img.Name, err)
		}
	}
	out, err := c.output(ctx, nil, ctr, "-a", sock, "-n", "k8s.io", "images", "ls", "-q")
	if err != nil {
		return err
	}
	c.say("node containerd holds: %s", strings.Join(strings.Fields(out), " "))
	return nil
}

// dockerImport tars stage and imports it as the node image, with kind's node image's
// entrypoint and environment. (Not its STOPSIGNAL SIGRTMIN+3: Debian's docker 20.10 does not
// take it as an import change; kind removes nodes with docker rm -f anyway.)
func (c Config) dockerImport(ctx context.Context, stage, stamp string) error {
	tarCmd := exec.CommandContext(ctx, "tar", "--numeric-owner", "--xattrs", "--xattrs-include=*", "-C", stage, "-cf", "-", ".")
	pipe, err := tarCmd.StdoutPipe()
	if err != nil {
		return err
	}
	var tarErr bytes.Buffer
	tarCmd.Stderr = &tarErr
	if err := tarCmd.Start(); err != nil {
		return err
	}
	err = c.run(ctx, pipe, "docker", "import",
		"--change", `ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]`,
		"--change", "ENV container=docker",
		"--change", "LABEL dev.coroner.kind.stamp="+stamp,
		"-", c.NodeImage)
	_ = pipe.Close() // tar stops if docker stopped reading; Wait below tells how tar ended
	if werr := tarCmd.Wait(); werr != nil && err == nil {
		err = fmt.Errorf("tar: %w: %s", werr, tarErr.String())
	}
	return err
}
