package lab

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/coroner-dev/coroner/test/images"
	"github.com/coroner-dev/coroner/test/vm"
)

// Redeploy puts the coroner of the working tree into a lab that is up, for a developer
// who changed the agent or the shim: it rebuilds coroner-agent, coroner-shim and their
// images, imports them into every node's containerd (the VM node's over ssh, from its
// share of _output/images), applies the overlay again and restarts coroner's DaemonSet
// and Deployment (the image names do not change, so a restart is what takes the new
// ones), then waits for their rollouts.
func Redeploy(ctx context.Context, c Config) error {
	st, err := c.upState()
	if err != nil {
		return err
	}
	start := time.Now()
	w := c.out()
	say := func(format string, args ...any) { fmt.Fprintf(w, "    "+format+"\n", args...) }
	fmt.Fprintln(w, "==> build: coroner-agent, coroner-shim and their images")
	imgs, err := c.build(ctx, say)
	if err != nil {
		return err
	}
	var coroner []images.Image
	for _, img := range imgs {
		if img.Name == images.AgentName || img.Name == images.ShimName {
			coroner = append(coroner, img)
		}
	}
	fmt.Fprintln(w, "==> import: the new images into every node's containerd")
	for _, n := range c.Nodes {
		if err := c.importImages(ctx, n, coroner); err != nil {
			return fmt.Errorf("%s: %w", n.Name, err)
		}
		say("%s: imported", n.Name)
	}
	if _, ok := vmRunning(st); ok {
		// Over ssh's stdin, not from the share: the guest's 9p mount can keep the old size of
		// a tarball rewritten in place ("short read").
		n := VMNode()
		for _, img := range coroner {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
			out, err := vm.SSHRetry(cctx, func() ([]byte, error) {
				f, err := os.Open(img.Tarball)
				if err != nil {
					return nil, err
				}
				defer f.Close()
				cmd := exec.CommandContext(cctx, "ssh", append(vm.SSHOptions(filepath.Join(c.nodeDir(n), "ssh-key")), "root@"+n.IP.String(),
					vmCtr("images import -"))...)
				cmd.Stdin = f
				return cmd.CombinedOutput()
			})
			cancel()
			if err != nil {
				return fmt.Errorf("%s: import %s: %w\n%s", n.Name, img.Name, err, out)
			}
		}
		say("%s: imported", n.Name)
	}
	fmt.Fprintln(w, "==> deploy: apply the overlay, restart coroner's workloads")
	wls, err := c.deploy(ctx, say)
	if err != nil {
		return err
	}
	for _, wl := range wls {
		ref := strings.ToLower(wl.Kind) + "/" + wl.Name
		if out, err := c.Kubectl(ctx, nil, "-n", wl.Namespace, "rollout", "restart", ref); err != nil {
			return fmt.Errorf("rollout restart %s: %w", ref, err)
		} else {
			say("%s", strings.TrimSpace(string(out)))
		}
	}
	for _, wl := range wls {
		ref := strings.ToLower(wl.Kind) + "/" + wl.Name
		if out, err := c.Kubectl(ctx, nil, "-n", wl.Namespace, "rollout", "status", ref, "--timeout=5m"); err != nil {
			return fmt.Errorf("rollout status %s: %w\n%s", ref, err, out)
		}
		say("%s rolled out", ref)
	}
	fmt.Fprintf(w, "coroner lab: coroner redeployed in %.1fs\n", time.Since(start).Seconds())
	return nil
}
