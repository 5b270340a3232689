// Package platforms installs the batch platforms coroner runs inside (issue 20) into a
// cluster of ours, the lab or kind, the way their users install them: Kueue and JobSet
// from their own Go modules, as published (test/tools/build.sh kueue jobset builds their
// managers with the dependency versions their go.mod files name), their own manifests
// (each module's config/default, copied from the module cache) with the overlay beside
// this file (the locally built image; Kueue's configuration), applied server-side.
// CronJob needs nothing: it is kube-controller-manager's.
package platforms

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/coroner-dev/coroner/test/host"
	"github.com/coroner-dev/coroner/test/images"
)

// Platform is one batch platform and how it is installed.
type Platform struct {
	// Name is the tool's name in test/tools/build.sh and the overlay's folder here.
	Name string
	// Module and Version: the Go module whose manager is built and whose config/ is applied.
	Module, Version string
	// Image is the name the overlay gives the manager's image.
	Image string
	// Namespace and Deployment: where the manager runs.
	Namespace, Deployment string
	// Probe is an object the platform's webhooks admit (created with a server-side dry
	// run): the install is done when the API server reaches the webhooks.
	Probe string
}

// Kueue and JobSet at the versions issue 20 measured.
var (
	Kueue = Platform{
		Name: "kueue", Module: "sigs.k8s.io/kueue", Version: "v0.17.0",
		Image: "coroner.dev/kueue:v0.17.0", Namespace: "kueue-system", Deployment: "kueue-controller-manager",
		Probe: `{"apiVersion":"kueue.x-k8s.io/v1beta2","kind":"ResourceFlavor","metadata":{"name":"coroner-install-probe"}}`,
	}
	JobSet = Platform{
		Name: "jobset", Module: "sigs.k8s.io/jobset", Version: "v0.11.1",
		Image: "coroner.dev/jobset:v0.11.1", Namespace: "jobset-system", Deployment: "jobset-controller-manager",
		Probe: `{"apiVersion":"jobset.x-k8s.io/v1alpha2","kind":"JobSet","metadata":{"name":"coroner-install-probe","namespace":"default"},` +
			`"spec":{"replicatedJobs":[{"name":"w","replicas":1,"template":{"spec":{"template":{"spec":{"restartPolicy":"Never",` +
			`"containers":[{"name":"c","image":"busybox:local","command":["true"]}]}}}}}]}}`,
	}
	All = []Platform{Kueue, JobSet}
)

// Named returns the platforms of a comma-separated list ("all": every one).
func Named(list string) ([]Platform, error) {
	if list == "all" || list == "" {
		return All, nil
	}
	var ps []Platform
	for name := range strings.SplitSeq(list, ",") {
		found := false
		for _, p := range All {
			if p.Name == strings.TrimSpace(name) {
				ps, found = append(ps, p), true
			}
		}
		if !found {
			return nil, fmt.Errorf("unknown platform %q (known: kueue, jobset, all)", name)
		}
	}
	return ps, nil
}

// Cluster is a cluster of ours the platforms install into: the lab or kind.
type Cluster interface {
	// Kubectl runs kubectl against the cluster, stdin from in; stdout, and stderr in the
	// error.
	Kubectl(ctx context.Context, in []byte, args ...string) ([]byte, error)
	// ImportImages puts image tarballs into the runtime of every node that may run them.
	ImportImages(ctx context.Context, imgs []images.Image) error
}

// Config says where things are.
type Config struct {
	// Root is the repository; BinDir its _output/bin, where build.sh puts the managers
	// (under platforms/).
	Root, BinDir string
	// Out is _output/platforms: the images and the rendered manifests.
	Out string
	// ManagerNode, when set, is the node the managers run on (a nodeSelector on
	// kubernetes.io/hostname): one the suites never cut off or squeeze, since every Job,
	// Deployment and pod creation in the cluster goes through Kueue's webhooks.
	ManagerNode string
	// Log receives progress lines.
	Log io.Writer
}

// New returns the configuration for the repository around the working directory.
func New() (Config, error) {
	root, err := host.RepoRoot()
	if err != nil {
		return Config{}, err
	}
	return Config{Root: root, BinDir: filepath.Join(root, "_output", "bin"), Out: filepath.Join(root, "_output", "platforms"), Log: os.Stderr}, nil
}

func (c Config) say(format string, args ...any) {
	fmt.Fprintf(c.Log, "platforms: "+format+"\n", args...)
}

// Install installs ps into cl and waits until each manager is available and its
// webhooks admit objects. The managers must be built (test/tools/build.sh NAME...).
// Installing again applies the same objects again: it changes nothing that is right.
func (c Config) Install(ctx context.Context, cl Cluster, ps []Platform) error {
	start := time.Now()
	var imgs []images.Image
	for _, p := range ps {
		bin := filepath.Join(c.BinDir, "platforms", p.Name)
		if _, err := os.Stat(bin); err != nil {
			return fmt.Errorf("%s: no manager at %s (test/tools/build.sh %s): %w", p.Name, bin, p.Name, err)
		}
		// build.sh stamps the version it built: the manifests must be of the same one.
		if b, err := os.ReadFile(filepath.Join(c.BinDir, "platforms", "."+p.Name+".stamp")); err != nil || strings.TrimSpace(string(b)) != p.Version {
			return fmt.Errorf("%s: the manager in %s was not built from %s (stamp %q): test/tools/build.sh and test/platforms name different versions", p.Name, bin, p.Version, strings.TrimSpace(string(b)))
		}
		// Their manifests run /manager as a user that is not root (runAsNonRoot).
		img, err := images.FromBinaryAs(filepath.Join(c.Out, "images"), p.Image, bin, "manager", "65532:65532")
		if err != nil {
			return fmt.Errorf("%s: image: %w", p.Name, err)
		}
		imgs = append(imgs, img)
	}
	if err := cl.ImportImages(ctx, imgs); err != nil {
		return fmt.Errorf("import the platforms' images: %w", err)
	}
	c.say("images imported: %s", imageNames(imgs))
	// One after the other, each ready before the next: Kueue's webhooks intercept every
	// Deployment and Job (failurePolicy Fail), so JobSet's Deployment cannot be created
	// until Kueue answers (seen on kind: "failed calling webhook mdeployment.kb.io").
	for _, p := range ps {
		manifests, err := c.Render(ctx, p)
		if err != nil {
			return err
		}
		out, err := cl.Kubectl(ctx, manifests, "apply", "--server-side", "--force-conflicts", "--field-manager=coroner-platforms", "-f", "-")
		if err != nil {
			return fmt.Errorf("%s: kubectl apply: %w", p.Name, err)
		}
		c.say("%s %s: %d objects applied", p.Name, p.Version, strings.Count(strings.TrimSpace(string(out)), "\n")+1)
		if err := c.waitReady(ctx, cl, p); err != nil {
			return err
		}
	}
	c.say("installed %s in %s", names(ps), time.Since(start).Round(time.Second))
	return nil
}

// Render returns the platform's manifests: its module's config/ copied beside this
// package's overlay for it, built with kubectl's kustomize.
func (c Config) Render(ctx context.Context, p Platform) ([]byte, error) {
	mod, err := host.ModuleDir(ctx, p.Module+"@"+p.Version)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p.Name, err)
	}
	dir := filepath.Join(c.Out, p.Name+"-"+p.Version)
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	if err := copyTree(filepath.Join(mod, "config"), filepath.Join(dir, "config")); err != nil {
		return nil, fmt.Errorf("%s: copy the module's config: %w", p.Name, err)
	}
	if err := copyTree(filepath.Join(c.Root, "test", "platforms", p.Name), filepath.Join(dir, "overlay")); err != nil {
		return nil, fmt.Errorf("%s: copy the overlay: %w", p.Name, err)
	}
	top := filepath.Join(dir, "overlay")
	if c.ManagerNode != "" {
		// A layer of ours above the overlay: the placement is the cluster's, not the
		// platform's.
		top = filepath.Join(dir, "placed")
		k := fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- ../overlay
patches:
- target:
    kind: Deployment
    name: %s
  patch: |-
    - op: add
      path: /spec/template/spec/nodeSelector
      value:
        kubernetes.io/hostname: %s
`, p.Deployment, c.ManagerNode)
		if err := os.MkdirAll(top, 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(top, "kustomization.yaml"), []byte(k), 0o644); err != nil {
			return nil, err
		}
	}
	// kubectl's kustomize: no cluster needed, any kubectl of ours will do.
	out, err := exec.CommandContext(ctx, filepath.Join(c.BinDir, "kubectl"), "kustomize", top).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return nil, fmt.Errorf("%s: kubectl kustomize: %w: %s", p.Name, err, ee.Stderr)
		}
		return nil, fmt.Errorf("%s: kubectl kustomize: %w", p.Name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "manifests.yaml"), out, 0o644); err != nil {
		return nil, err
	}
	return out, nil
}

// waitReady waits for the manager's rollout, then for its webhooks to admit the probe.
func (c Config) waitReady(ctx context.Context, cl Cluster, p Platform) error {
	start := time.Now()
	if out, err := cl.Kubectl(ctx, nil, "-n", p.Namespace, "rollout", "status", "deployment/"+p.Deployment, "--timeout=4m"); err != nil {
		logs, _ := cl.Kubectl(ctx, nil, "-n", p.Namespace, "logs", "deployment/"+p.Deployment, "--tail=20")
		pods, _ := cl.Kubectl(ctx, nil, "-n", p.Namespace, "get", "pods", "-o", "wide")
		return fmt.Errorf("%s: %s not available: %w\n%s\n%s\n%s", p.Name, p.Deployment, err, out, pods, logs)
	}
	// The webhooks answer once the manager has its certificates and the API server has
	// their CA: a dry run that goes through them is the test.
	if err := retryUntil(ctx, start, "its webhooks do not admit objects", func() error {
		_, err := cl.Kubectl(ctx, []byte(p.Probe), "create", "--dry-run=server", "-f", "-")
		return err
	}); err != nil {
		return fmt.Errorf("%s: %w", p.Name, err)
	}
	// Its aggregated APIs (Kueue's visibility API) must be Available too: while one is
	// not, the namespace controller's discovery fails and no namespace finishes deleting.
	if err := retryUntil(ctx, start, "its aggregated APIs are not available", func() error {
		out, err := cl.Kubectl(ctx, nil, "get", "apiservices", "-o", "json")
		if err != nil {
			return err
		}
		down, err := unavailableAPIServices(out, p.Namespace)
		if err == nil && len(down) > 0 {
			err = errors.New(strings.Join(down, "; "))
		}
		return err
	}); err != nil {
		return fmt.Errorf("%s: %w", p.Name, err)
	}
	c.say("%s: manager available, webhooks answering, aggregated APIs available, in %s", p.Name, time.Since(start).Round(time.Second))
	return nil
}

// retryUntil calls try every 2 s until it returns nil, ctx ends, or 4 minutes have passed
// since start; then the error says what (what) and try's last error.
func retryUntil(ctx context.Context, start time.Time, what string, try func() error) error {
	for {
		err := try()
		if err == nil {
			return nil
		}
		if time.Since(start) > 4*time.Minute {
			return fmt.Errorf("%s after %s: %w", what, time.Since(start).Round(time.Second), err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}

// unavailableAPIServices reads `kubectl get apiservices -o json` and returns, for each
// APIService served from namespace ns that is not Available, its name and why.
func unavailableAPIServices(list []byte, ns string) ([]string, error) {
	var l struct {
		Items []struct {
			Metadata struct{ Name string } `json:"metadata"`
			Spec     struct {
				Service *struct{ Namespace string } `json:"service"`
			} `json:"spec"`
			Status struct {
				Conditions []struct{ Type, Status, Reason, Message string } `json:"conditions"`
			} `json:"status"`
		} `json:"items"`
	}
	if err := json.Unmarshal(list, &l); err != nil {
		return nil, fmt.Errorf("APIService list: %w", err)
	}
	var down []string
	for _, a := range l.Items {
		if a.Spec.Service == nil || a.Spec.Service.Namespace != ns {
			continue
		}
		why := "no Available condition yet"
		for _, c := range a.Status.Conditions {
			if c.Type == "Available" {
				if c.Status == "True" {
					why = ""
				} else {
					why = c.Reason + ": " + c.Message
				}
			}
		}
		if why != "" {
			down = append(down, a.Metadata.Name+" ("+why+")")
		}
	}
	return down, nil
}

// copyTree copies the regular files and folders under src to dst, writable (the module
// cache's are read-only).
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, 0o644)
	})
}

func names(ps []Platform) string {
	var s []string
	for _, p := range ps {
		s = append(s, p.Name+" "+p.Version)
	}
	return strings.Join(s, ", ")
}

func imageNames(imgs []images.Image) string {
	var s []string
	for _, i := range imgs {
		s = append(s, i.Name)
	}
	return strings.Join(s, ", ")
}
