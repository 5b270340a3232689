// Package images builds the OCI image tarballs that tests and the lab run in containerd,
// without Docker and without a registry, and imports them with ctr.
//
// Two images, each a single uncompressed layer holding Debian busybox-static's
// /bin/busybox with a symlink for every applet (what `busybox --install -s` makes), /tmp,
// and a minimal /etc/passwd and /etc/group:
//
//   - Busybox, named docker.io/library/busybox:local (what a pod's `image: busybox:local`
//     resolves to in containerd's CRI plugin), also holds /bin/memhog (test/images/memhog,
//     built with CGO_ENABLED=0), which allocates memory until the OOM killer stops it,
//     optionally in a child process so that PID 1 survives. Its command is `sh`.
//   - Pause, named registry.k8s.io/pause:coroner, for containerd's CRI `sandbox_image`:
//     its entrypoint is a shell that waits and exits 0 on SIGTERM or SIGINT.
//
// The tarballs are OCI image layouts (oci-layout, index.json with the
// io.containerd.image.name annotation, blobs/sha256/...) written with archive/tar and
// sha256 into <repository>/_output/images (or $CORONER_IMAGES_DIR). Every timestamp and
// owner is fixed, so the same inputs give the same digests; a tarball whose digest matches
// is not written again. Pods must use imagePullPolicy Never (or CRI without a pull): there
// is nothing to pull from.
package images

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/coroner-dev/coroner/test/host"
)

// Image names, as containerd's CRI plugin sees them (fully qualified).
const (
	BusyboxName = "docker.io/library/busybox:local"
	PauseName   = "registry.k8s.io/pause:coroner"
)

// BusyboxPath is where busybox-static installs the binary the images are made of.
const BusyboxPath = "/bin/busybox"

// pauseScript is the pause image's entrypoint: wait forever, exit 0 on TERM or INT. The
// sleep runs in the background so that `wait` returns as soon as a signal arrives.
const pauseScript = `trap 'kill $! 2>/dev/null; exit 0' TERM INT; while :; do sleep 3600 & wait $!; done`

// Image is a built image tarball.
type Image struct {
	// Name is the reference the tarball's index.json gives the image.
	Name string
	// Tarball is the path of the OCI layout tarball.
	Tarball string
	// Digest is the manifest digest, sha256:...
	Digest string
}

// epoch is every file's modification time and the images' creation time.
var epoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// Dir returns where images are written: $CORONER_IMAGES_DIR, else
// <repository>/_output/images.
func Dir() (string, error) {
	if d := os.Getenv("CORONER_IMAGES_DIR"); d != "" {
		return d, nil
	}
	root, err := host.RepoRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "_output", "images"), nil
}

// ErrNoBusybox means busybox-static is not installed.
var ErrNoBusybox = errors.New("busybox-static missing")

// BuildAll builds the busybox and pause images into dir (Dir() when empty).
func BuildAll(ctx context.Context, dir string) ([]Image, error) {
	b, err := BuildBusybox(ctx, dir)
	if err != nil {
		return nil, err
	}
	p, err := BuildPause(dir)
	if err != nil {
		return nil, err
	}
	return []Image{b, p}, nil
}

// BuildBusybox builds docker.io/library/busybox:local with /bin/memhog. It compiles
// memhog with the go command on PATH (or in $GOROOT/bin).
func BuildBusybox(ctx context.Context, dir string) (Image, error) {
	dir, err := resolveDir(dir)
	if err != nil {
		return Image{}, err
	}
	memhog, err := buildMemhog(ctx, dir)
	if err != nil {
		return Image{}, err
	}
	layer, err := rootfsLayer(map[string]string{"bin/memhog": memhog})
	if err != nil {
		return Image{}, err
	}
	cfg := imageConfig{Cmd: []string{"sh"}}
	return writeImage(dir, "busybox", BusyboxName, layer, cfg)
}

// BuildPause builds registry.k8s.io/pause:coroner.
func BuildPause(dir string) (Image, error) {
	dir, err := resolveDir(dir)
	if err != nil {
		return Image{}, err
	}
	layer, err := rootfsLayer(nil)
	if err != nil {
		return Image{}, err
	}
	cfg := imageConfig{Entrypoint: []string{"/bin/sh", "-c", pauseScript}}
	return writeImage(dir, "pause", PauseName, layer, cfg)
}

// Import loads a tarball into containerd's k8s.io namespace (where the CRI plugin looks)
// with `ctr -a socket -n k8s.io images import`, which also unpacks it into the default
// snapshotter.
func Import(ctx context.Context, ctrPath, socket, tarball string) error {
	if ctrPath == "" {
		ctrPath = "ctr"
	}
	cmd := exec.CommandContext(ctx, ctrPath, "-a", socket, "-n", "k8s.io", "images", "import", tarball)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("ctr images import %s: %w\n%s", tarball, err, out)
	}
	return nil
}

func resolveDir(dir string) (string, error) {
	if dir == "" {
		var err error
		if dir, err = Dir(); err != nil {
			return "", err
		}
	}
	return dir, os.MkdirAll(dir, 0o755)
}

// buildMemhog compiles test/images/memhog statically into dir/memhog and returns its path.
// The go command's build cache makes this quick after the first time.
func buildMemhog(ctx context.Context, dir string) (string, error) {
	root, err := host.RepoRoot()
	if err != nil {
		return "", err
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		// Not on PATH: the one under $GOROOT, where runtime.GOROOT (deprecated) looked
		// first; the build's own root is not recorded under -trimpath anyway.
		goBin = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	tmp, err := os.CreateTemp(dir, ".memhog-*")
	if err != nil {
		return "", err
	}
	if err := tmp.Close(); err != nil {
		_ = os.Remove(tmp.Name())
		return "", err
	}
	// Gone after the rename (the error is then ENOENT); left only by a failed build.
	defer func() { _ = os.Remove(tmp.Name()) }()
	cmd := exec.CommandContext(ctx, goBin, "build", "-trimpath", "-ldflags=-s -w -buildid=", "-o", tmp.Name(), "./test/images/memhog")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build memhog: %w\n%s", err, out)
	}
	out := filepath.Join(dir, "memhog")
	return out, os.Rename(tmp.Name(), out)
}

// rootfsLayer returns an uncompressed tar of the busybox root file system, plus extra files
// (path in the image -> path on this machine, installed with mode 0755).
func rootfsLayer(extra map[string]string) ([]byte, error) {
	if _, err := os.Stat(BusyboxPath); err != nil {
		return nil, fmt.Errorf("%w: %s: %v (apt-get install busybox-static)", ErrNoBusybox, BusyboxPath, err)
	}
	list, err := exec.Command(BusyboxPath, "--list-full").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list-full: %w", BusyboxPath, err)
	}
	dirs := map[string]os.FileMode{
		"bin": 0o755, "sbin": 0o755, "usr": 0o755, "usr/bin": 0o755, "usr/sbin": 0o755,
		"etc": 0o755, "tmp": 0o1777, "root": 0o700, "home": 0o755, "proc": 0o555, "sys": 0o555,
		"dev": 0o755, "var": 0o755, "run": 0o755,
	}
	links := map[string]bool{}
	for _, p := range strings.Fields(string(list)) {
		p = strings.Trim(p, "/")
		if p == "" || p == "bin/busybox" || p == "linuxrc" {
			continue
		}
		links[p] = true
		for d := filepath.Dir(p); d != "."; d = filepath.Dir(d) {
			if _, ok := dirs[d]; !ok {
				dirs[d] = 0o755
			}
		}
	}
	for p := range extra {
		delete(links, p)
	}

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	hdr := func(h *tar.Header) error {
		h.ModTime, h.Uname, h.Gname, h.Format = epoch, "root", "root", tar.FormatPAX
		return tw.WriteHeader(h)
	}
	file := func(name string, mode int64, data []byte) error {
		if err := hdr(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data))}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	for _, d := range sortedKeys(dirs) {
		if err := hdr(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: int64(dirs[d])}); err != nil {
			return nil, err
		}
	}
	bb, err := os.ReadFile(BusyboxPath)
	if err != nil {
		return nil, err
	}
	if err := file("bin/busybox", 0o755, bb); err != nil {
		return nil, err
	}
	for _, p := range sortedKeys(extra) {
		data, err := os.ReadFile(extra[p])
		if err != nil {
			return nil, err
		}
		if err := file(p, 0o755, data); err != nil {
			return nil, err
		}
	}
	for _, l := range sortedKeys(links) {
		if err := hdr(&tar.Header{Typeflag: tar.TypeSymlink, Name: l, Linkname: "/bin/busybox", Mode: 0o777}); err != nil {
			return nil, err
		}
	}
	if err := file("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/home:/bin/false\n")); err != nil {
		return nil, err
	}
	if err := file("etc/group", 0o644, []byte("root:x:0:\nnobody:x:65534:\n")); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// imageConfig is the part of the OCI image config that differs between our images.
type imageConfig struct {
	Entrypoint []string `json:"Entrypoint,omitempty"`
	Cmd        []string `json:"Cmd,omitempty"`
	User       string   `json:"User,omitempty"`
}

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    *platform         `json:"platform,omitempty"`
}

type platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

const (
	mediaTypeIndex    = "application/vnd.oci.image.index.v1+json"
	mediaTypeManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaTypeConfig   = "application/vnd.oci.image.config.v1+json"
	mediaTypeLayer    = "application/vnd.oci.image.layer.v1.tar"
)

// writeImage writes dir/<file>.tar unless a tarball with the same manifest digest is
// there already (recorded in dir/<file>.tar.digest).
func writeImage(dir, file, name string, layer []byte, cfg imageConfig) (Image, error) {
	layerDigest := digest(layer)
	run := map[string]any{
		"Env":        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		"Entrypoint": cfg.Entrypoint,
		"Cmd":        cfg.Cmd,
		"WorkingDir": "/",
	}
	if cfg.User != "" { // none: root (and the digests of the images without one unchanged)
		run["User"] = cfg.User
	}
	config, err := json.Marshal(map[string]any{
		"created":      epoch.Format(time.RFC3339),
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"config":       run,
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{layerDigest}},
		"history":      []map[string]any{{"created": epoch.Format(time.RFC3339), "created_by": "coroner test/images"}},
	})
	if err != nil {
		return Image{}, err
	}
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     mediaTypeManifest,
		"config":        descriptor{MediaType: mediaTypeConfig, Digest: digest(config), Size: int64(len(config))},
		"layers":        []descriptor{{MediaType: mediaTypeLayer, Digest: layerDigest, Size: int64(len(layer))}},
	})
	if err != nil {
		return Image{}, err
	}
	img := Image{Name: name, Tarball: filepath.Join(dir, file+".tar"), Digest: digest(manifest)}
	tag := name[strings.LastIndex(name, ":")+1:]
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     mediaTypeIndex,
		"manifests": []descriptor{{
			MediaType: mediaTypeManifest, Digest: img.Digest, Size: int64(len(manifest)),
			Annotations: map[string]string{
				"io.containerd.image.name":          name,
				"org.opencontainers.image.ref.name": tag,
			},
			Platform: &platform{Architecture: runtime.GOARCH, OS: "linux"},
		}},
	})
	if err != nil {
		return Image{}, err
	}

	stamp := img.Tarball + ".digest"
	if old, err := os.ReadFile(stamp); err == nil && string(old) == img.Digest+"\n" {
		if _, err := os.Stat(img.Tarball); err == nil {
			return img, nil
		}
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	entries := []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", index},
		{blobPath(layerDigest), layer},
		{blobPath(digest(config)), config},
		{blobPath(img.Digest), manifest},
	}
	for _, d := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: epoch}); err != nil {
			return Image{}, err
		}
	}
	for _, e := range entries {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: e.name, Mode: 0o644, Size: int64(len(e.data)), ModTime: epoch}); err != nil {
			return Image{}, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return Image{}, err
		}
	}
	if err := tw.Close(); err != nil {
		return Image{}, err
	}
	// Write and rename, so that test packages building at the same time never see half a
	// tarball.
	if err := writeAtomic(img.Tarball, buf.Bytes()); err != nil {
		return Image{}, err
	}
	return img, writeAtomic(stamp, []byte(img.Digest+"\n"))
}

func writeAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+"-*")
	if err != nil {
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		return errors.Join(err, tmp.Close(), os.Remove(tmp.Name()))
	}
	if err := tmp.Close(); err != nil {
		return errors.Join(err, os.Remove(tmp.Name()))
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return errors.Join(err, os.Remove(tmp.Name()))
	}
	return os.Rename(tmp.Name(), path)
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func blobPath(d string) string { return "blobs/sha256/" + strings.TrimPrefix(d, "sha256:") }

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
