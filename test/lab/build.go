package lab

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"

	"github.com/coroner-dev/coroner/test/host"
	"github.com/coroner-dev/coroner/test/images"
)

// kubeTools are the binaries test/tools/build.sh builds that the lab runs.
var kubeTools = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl"}

// runtimeTools are the container runtime builds of test/tools: containerd 2.x and runc,
// into BinDir/containerd2, and containerd 1.7 into BinDir/containerd17.
var runtimeTools = []string{"containerd2", "runc", "containerd17"}

// build builds what is missing: the Kubernetes binaries (test/tools/build.sh skips what is
// up to date), coroner-agent and coroner-shim as static binaries, and the images.
func (c Config) build(ctx context.Context, say func(string, ...any)) ([]images.Image, error) {
	if !c.SkipBuild {
		lw := &lineWriter{say: say}
		cmd := exec.CommandContext(ctx, filepath.Join(c.Root, "test", "tools", "build.sh"), append(kubeTools, runtimeTools...)...)
		cmd.Dir = c.Root
		cmd.Env = append(os.Environ(), "CORONER_BIN_DIR="+c.BinDir)
		cmd.Stdout, cmd.Stderr = lw, lw
		err := cmd.Run()
		lw.flush()
		if err != nil {
			return nil, fmt.Errorf("test/tools/build.sh: %w", err)
		}

		goBin, err := goCommand()
		if err != nil {
			return nil, err
		}
		// Static: the images have no C library.
		args := append(append([]string{"build"}, host.ProductBuildFlags...), "-o", c.BinDir+"/", "./cmd/coroner-agent", "./cmd/coroner-shim", "./test/deviceplugin/cmd/coroner-test-gpu")
		cmd = exec.CommandContext(ctx, goBin, args...)
		cmd.Dir = c.Root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("go build coroner-agent coroner-shim coroner-test-gpu: %w\n%s", err, out)
		}
		say("coroner-agent, coroner-shim, coroner-test-gpu (every node's test GPU plugin): built (CGO_ENABLED=0)")
	}
	for _, t := range append(slices.Clone(kubeTools), testGPUBinary) {
		if _, err := os.Stat(c.bin(t)); err != nil {
			return nil, fmt.Errorf("%s missing in %s: run `make tools`", t, c.shortPath(c.BinDir))
		}
	}

	for _, n := range c.Nodes {
		if _, err := c.runtime(n); err != nil {
			return nil, err
		}
	}

	imgDir := filepath.Join(c.Root, "_output", "images")
	base, err := images.BuildAll(ctx, imgDir)
	if err != nil {
		return nil, err
	}
	agent, err := images.FromBinary(imgDir, images.AgentName, c.bin("coroner-agent"))
	if err != nil {
		return nil, err
	}
	shim, err := images.FromBinary(imgDir, images.ShimName, c.bin("coroner-shim"))
	if err != nil {
		return nil, err
	}
	imgs := append(base, agent, shim)
	for _, img := range imgs {
		say("image %s (%s)", img.Name, img.Digest[:19])
	}
	return imgs, nil
}

// goCommand finds the go command: PATH, then $GOROOT/bin.
func goCommand() (string, error) {
	if p, err := exec.LookPath("go"); err == nil {
		return p, nil
	}
	// Then the one under $GOROOT, where runtime.GOROOT (deprecated) looked first; the
	// root this binary was built with is not recorded under -trimpath anyway.
	p := filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("the go command is not on PATH (Go 1.26 builds the lab's binaries)")
}
