package kind

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// nodeFilesVersion changes whenever installNodeFiles changes what it writes.
const nodeFilesVersion = "nodefiles/5"

// cniManifest is coroner-kind-cni's DaemonSet, the node image's
// /kind/manifests/default-cni.yaml (kind applies it after kubeadm init).
//
//go:embed cni.yaml
var cniManifest []byte

// installNodeFiles turns the Debian root file system in stage into a kind node, as kind's
// images/base/Dockerfile does, with kind's node-side files from the module source
// (entrypoint, systemd units, kubelet drop-ins, containerd config, /kind/bin scripts) and
// our builds (containerd 2.x, runc, kubelet, kubeadm, kubectl). Differences from kind's
// image, each for this machine:
//   - containerd.service has no OOMScoreAdjust=-999 (a negative score needs
//     CAP_SYS_RESOURCE, which this sandbox does not have: containerd would not start);
//   - containerd's CRI restrict_oom_score_adj = true (same reason: every sandbox fails
//     otherwise), sandbox image pause:3.10.2 (kubeadm v1.36.3's), no fuse-overlayfs proxy
//     plugin, unpacked layers kept (the images are pre-imported, not pulled);
//   - CNI plugins are Debian's (/usr/lib/cni, linked from /opt/cni/bin);
//   - containerd runs runc through runcNoV1Freezer (BinaryName; see there why).
func (c Config) installNodeFiles(ctx context.Context, stage, kindDir string) error {
	files := filepath.Join(kindDir, "images", "base", "files")
	type cp struct {
		src, dst string
		mode     os.FileMode
	}
	var cps []cp
	glob := func(pattern, dstDir string, mode os.FileMode) {
		ms, _ := filepath.Glob(filepath.Join(files, pattern))
		for _, m := range ms {
			if st, err := os.Stat(m); err == nil && !st.IsDir() {
				cps = append(cps, cp{m, filepath.Join(stage, dstDir, filepath.Base(m)), mode})
			}
		}
	}
	glob("usr/local/bin/*", "usr/local/bin", 0o755)
	glob("kind/*", "kind", 0o644)
	glob("kind/bin/*", "kind/bin", 0o755)
	glob("etc/*", "etc", 0o644)
	glob("etc/default/*", "etc/default", 0o644)
	glob("etc/sysctl.d/*", "etc/sysctl.d", 0o644)
	glob("etc/systemd/system/*", "etc/systemd/system", 0o644)
	glob("etc/systemd/system/kubelet.service.d/*", "etc/systemd/system/kubelet.service.d", 0o644)
	for _, n := range []string{"containerd", "containerd-shim-runc-v2", "ctr"} {
		cps = append(cps, cp{filepath.Join(c.BinDir, "containerd2", n), filepath.Join(stage, "usr/local/bin", n), 0o755})
	}
	cps = append(cps, cp{filepath.Join(c.BinDir, "containerd2", "runc"), filepath.Join(stage, "usr/local/sbin/runc"), 0o755})
	for _, n := range []string{"kubelet", "kubeadm", "kubectl"} {
		cps = append(cps, cp{c.bin(n), filepath.Join(stage, "usr/bin", n), 0o755})
	}
	for _, f := range cps {
		if err := copyFile(f.src, f.dst, f.mode); err != nil {
			return err
		}
	}

	// containerd's config and unit, adapted (see above).
	cfg, err := os.ReadFile(filepath.Join(files, "etc/containerd/config.toml"))
	if err != nil {
		return err
	}
	ours, err := containerdConfig(string(cfg))
	if err != nil {
		return err
	}
	if err := writeFile(filepath.Join(stage, "etc/containerd/config.toml"), []byte(ours), 0o644); err != nil {
		return err
	}
	unit, err := os.ReadFile(filepath.Join(files, "etc/systemd/system/containerd.service"))
	if err != nil {
		return err
	}
	var ul []string
	for _, l := range strings.Split(string(unit), "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "OOMScoreAdjust") {
			l = "# OOMScoreAdjust=-999 removed by coroner test/kind: needs CAP_SYS_RESOURCE"
		}
		ul = append(ul, l)
	}
	if err := writeFile(filepath.Join(stage, "etc/systemd/system/containerd.service"), []byte(strings.Join(ul, "\n")), 0o644); err != nil {
		return err
	}

	if err := writeFile(filepath.Join(stage, runcNoV1FreezerPath), []byte(runcNoV1Freezer), 0o755); err != nil {
		return err
	}

	// /etc/containerd/cri-base.json: `ctr oci spec` plus kind's createContainer hook,
	// without rlimits (kind's Dockerfile does this with jq).
	spec, err := c.output(ctx, nil, filepath.Join(c.BinDir, "containerd2", "ctr"), "oci", "spec")
	if err != nil {
		return err
	}
	var doc map[string]any
	if err := json.Unmarshal([]byte(spec), &doc); err != nil {
		return fmt.Errorf("ctr oci spec: %w", err)
	}
	hooks, _ := doc["hooks"].(map[string]any)
	if hooks == nil {
		hooks = map[string]any{}
	}
	cc, _ := hooks["createContainer"].([]any)
	hooks["createContainer"] = append(cc, map[string]any{"path": "/kind/bin/mount-product-files.sh"})
	doc["hooks"] = hooks
	if p, ok := doc["process"].(map[string]any); ok {
		delete(p, "rlimits")
	}
	b, _ := json.MarshalIndent(doc, "", "  ")
	if err := writeFile(filepath.Join(stage, "etc/containerd/cri-base.json"), b, 0o644); err != nil {
		return err
	}

	// What kind's Dockerfile removes, so that systemd starts only what a node needs.
	rm := func(pattern string) {
		ms, _ := filepath.Glob(filepath.Join(stage, pattern))
		for _, m := range ms {
			os.Remove(m)
		}
	}
	rm("lib/systemd/system/sysinit.target.wants/systemd-tmpfiles-setup.service")
	rm("lib/systemd/system/multi-user.target.wants/*")
	rm("etc/systemd/system/*.wants/*")
	rm("lib/systemd/system/local-fs.target.wants/*")
	rm("lib/systemd/system/sockets.target.wants/*udev*")
	rm("lib/systemd/system/sockets.target.wants/*initctl*")
	rm("lib/systemd/system/basic.target.wants/*")
	jc := filepath.Join(stage, "etc/systemd/journald.conf")
	if j, err := os.ReadFile(jc); err == nil && !strings.Contains(string(j), "\nReadKMsg=no") {
		if err := writeFile(jc, append(j, []byte("\nReadKMsg=no\n")...), 0o644); err != nil {
			return err
		}
	}
	// systemctl enable kubelet containerd undo-mount-hacks; mask systemd-binfmt.
	wants := filepath.Join(stage, "etc/systemd/system/multi-user.target.wants")
	if err := os.MkdirAll(wants, 0o755); err != nil {
		return err
	}
	for _, u := range []string{"kubelet.service", "containerd.service", "undo-mount-hacks.service"} {
		os.Remove(filepath.Join(wants, u))
		if err := os.Symlink("/etc/systemd/system/"+u, filepath.Join(wants, u)); err != nil {
			return err
		}
	}
	mask := filepath.Join(stage, "etc/systemd/system/systemd-binfmt.service")
	os.Remove(mask)
	if err := os.Symlink("/dev/null", mask); err != nil {
		return err
	}
	init := filepath.Join(stage, "sbin/init")
	if _, err := os.Lstat(init); err != nil {
		if err := os.Symlink("/usr/lib/systemd/systemd", init); err != nil {
			return err
		}
	}

	for _, d := range []string{"etc/kubernetes/manifests", "opt/cni", "etc/cni/net.d", "kind/manifests"} {
		if err := os.MkdirAll(filepath.Join(stage, d), 0o755); err != nil {
			return err
		}
	}
	cniBin := filepath.Join(stage, "opt/cni/bin")
	os.RemoveAll(cniBin)
	if err := os.Symlink("/usr/lib/cni", cniBin); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(stage, "kind/version"), []byte(KubeVersion), 0o644); err != nil {
		return err
	}
	// kindnetd cannot be built from the module proxy: kind's default CNI is ours.
	if c.CNI != "static" {
		if err := writeFile(filepath.Join(stage, "kind/manifests/default-cni.yaml"), cniManifest, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// containerdConfig is kind's containerd config (kindCfg) as the node runs it: without the
// fuse-overlayfs proxy plugin, restrict_oom_score_adj on, our sandbox image, unpacked
// layers kept, and every runc runtime (each has SystemdCgroup) run through
// runcNoV1Freezer. A config with no SystemdCgroup option is an error: kind changed its
// file, and the node would run runc with the freezer again.
func containerdConfig(kindCfg string) (string, error) {
	var lines []string
	skip := false
	wrapped := 0
	for _, l := range strings.Split(kindCfg, "\n") {
		t := strings.TrimSpace(l)
		if strings.HasPrefix(t, "[") {
			skip = strings.HasPrefix(t, "[proxy_plugins")
		}
		if skip {
			continue
		}
		switch {
		case strings.HasPrefix(t, "restrict_oom_score_adj"):
			l = "  restrict_oom_score_adj = true"
		case strings.HasPrefix(t, "sandbox_image"):
			l = fmt.Sprintf("  sandbox_image = %q", "registry.k8s.io/pause:"+PauseTag)
		case strings.HasPrefix(t, "discard_unpacked_layers"):
			l = "  discard_unpacked_layers = false"
		case strings.HasPrefix(t, "SystemdCgroup"):
			l += fmt.Sprintf("\n    BinaryName = %q", runcNoV1FreezerPath)
			wrapped++
		}
		lines = append(lines, l)
	}
	if wrapped == 0 {
		return "", fmt.Errorf("kind's containerd config has no runc runtime with SystemdCgroup: cannot set BinaryName = %q", runcNoV1FreezerPath)
	}
	return strings.Join(lines, "\n"), nil
}

// runcNoV1Freezer runs runc in a mount namespace of its own without the cgroup v1 freezer
// hierarchy; containerd calls it instead of runc (the runc runtimes' BinaryName).
//
// Why: on a cgroup v1 host, runc's systemd driver freezes every new container's cgroup
// while systemd applies the container's device rules, and gives up after about 200 ms of
// FREEZING ("error setting cgroup config for procHooks process: unable to freeze",
// kubernetes/kubernetes#131087, also a flake of upstream's kind CI). On this 2-core
// machine 16 of 90 pods started 30 at a time on a worker failed so (6, 3 and 7 per
// burst): the kubelet reports StartError, exit 128, and the Job counts a failure, which
// failed CI's e2e suite once. runc skips the freeze by design when it finds no freezer
// mounted, as on cgroup v2, where users' kind nodes run; then 0 of 180 failed. Only runc
// must not see it: containerd's shim loads each container's cgroups from
// /proc/PID/cgroup and needs every listed hierarchy mounted (without the freezer in the
// node it logs "cannot find cgroup mount destination" and sends no TaskOOM event).
//
// The new namespace keeps the propagation of the node's mounts (unshare --propagation
// unchanged: containers cloned from it see later mounts as before; not exercised by a
// test here); its cgroup mounts are made private first, so that the unmount stays in it.
// runc then puts no container in a freezer cgroup of its own (it stays in the shim's);
// nothing in the node pauses containers (the kubelet does not, coroner's agent stops them
// through CRI). Cost: 20 ms per runc call against 5 ms (10 calls of --version in a node).
const runcNoV1Freezer = `#!/bin/sh
# coroner test/kind: runc without the cgroup v1 freezer (test/kind/nodefiles.go says why).
if mountpoint -q /sys/fs/cgroup/freezer; then
	exec unshare --mount --propagation unchanged /bin/sh -c \
		'mount --make-rprivate /sys/fs/cgroup && umount --recursive /sys/fs/cgroup/freezer && exec /usr/local/sbin/runc "$@"' runc "$@"
fi
exec /usr/local/sbin/runc "$@"
`

const runcNoV1FreezerPath = "/usr/local/sbin/runc-no-v1-freezer"
