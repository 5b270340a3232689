package containerd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/coroner-dev/coroner/test/host"
)

// Runtime is one containerd build with the runc it runs containers with. Two are used:
// Debian's containerd 1.6 with runc 1.1 (the packages, on PATH), whose CRI has no
// GetContainerEvents (the agent relists), and containerd 2.x with runc 1.5 built from
// their Go modules by test/tools into _output/bin/containerd2 (CRI events: the agent's
// events mode).
type Runtime struct {
	// Name labels subtests and lab nodes: "containerd-1.6", "containerd-2.4".
	Name string
	// Version is what `containerd --version` says, e.g. "1.6.20~ds1" or "2.4.2".
	Version string
	// Major is containerd's major version: 1 takes config version 2, 2 takes version 3.
	Major int
	// Binaries: containerd, ctr, the runc shim and runc.
	Containerd, Ctr, Shim, Runc string
}

// String is the runtime's name and version.
func (r Runtime) String() string { return r.Name + " (" + r.Version + ")" }

// Events reports whether the runtime's CRI serves GetContainerEvents.
func (r Runtime) Events() bool { return r.Major >= 2 }

// ErrNoBuiltRuntime means test/tools has not built containerd 2.x and runc.
var ErrNoBuiltRuntime = errors.New("containerd 2.x not built")

// Debian is the containerd 1.6 and runc of Debian's packages, from PATH.
func Debian() (Runtime, error) {
	if os.Geteuid() != 0 {
		return Runtime{}, fmt.Errorf("%w: containerd and runc need root (euid %d)", ErrNotAvailable, os.Geteuid())
	}
	r := Runtime{}
	var missing []string
	for _, x := range []struct {
		name string
		dst  *string
	}{{"containerd", &r.Containerd}, {"ctr", &r.Ctr}, {"runc", &r.Runc}, {"containerd-shim-runc-v2", &r.Shim}} {
		p, err := exec.LookPath(x.name)
		if err != nil {
			missing = append(missing, x.name)
			continue
		}
		*x.dst = p
	}
	if len(missing) > 0 {
		return r, fmt.Errorf("%w: %s not on PATH (apt-get install containerd runc busybox-static)", ErrNotAvailable, strings.Join(missing, ", "))
	}
	return r.identify()
}

// Built is containerd 2.x and runc as test/tools/build.sh builds them into
// binDir/containerd2; binDir "" is $CORONER_BIN_DIR, else the repository's _output/bin.
func Built(binDir string) (Runtime, error) {
	if os.Geteuid() != 0 {
		return Runtime{}, fmt.Errorf("%w: containerd and runc need root (euid %d)", ErrNotAvailable, os.Geteuid())
	}
	if binDir == "" {
		binDir = os.Getenv("CORONER_BIN_DIR")
	}
	if binDir == "" {
		root, err := host.RepoRoot()
		if err != nil {
			return Runtime{}, err
		}
		binDir = filepath.Join(root, "_output", "bin")
	}
	dir := filepath.Join(binDir, "containerd2")
	r := Runtime{
		Containerd: filepath.Join(dir, "containerd"),
		Ctr:        filepath.Join(dir, "ctr"),
		Shim:       filepath.Join(dir, "containerd-shim-runc-v2"),
		Runc:       filepath.Join(dir, "runc"),
	}
	for _, p := range []string{r.Containerd, r.Ctr, r.Shim, r.Runc} {
		if _, err := os.Stat(p); err != nil {
			return r, fmt.Errorf("%w: %s missing: run `make tools` (test/tools/build.sh containerd2 runc)", ErrNoBuiltRuntime, p)
		}
	}
	return r.identify()
}

// Runtimes returns every runtime available: Debian's, then the built one. The error
// says what is missing; the runtimes found are returned with it.
func Runtimes(binDir string) ([]Runtime, error) {
	var out []Runtime
	var errs []error
	if r, err := Debian(); err == nil {
		out = append(out, r)
	} else {
		errs = append(errs, err)
	}
	if r, err := Built(binDir); err == nil {
		out = append(out, r)
	} else {
		errs = append(errs, err)
	}
	return out, errors.Join(errs...)
}

// versionRE finds the version in `containerd --version`: "containerd containerd.io
// 1.6.20~ds1 ..." (Debian) or "containerd github.com/containerd/containerd/v2 2.4.2 module".
var versionRE = regexp.MustCompile(`\s(v?(\d+)\.(\d+)\.\d+\S*)`)

func (r Runtime) identify() (Runtime, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, r.Containerd, "--version").Output()
	if err != nil {
		return r, fmt.Errorf("%s --version: %w", r.Containerd, err)
	}
	m := versionRE.FindStringSubmatch(string(out))
	if m == nil {
		return r, fmt.Errorf("%s --version: no version in %q", r.Containerd, strings.TrimSpace(string(out)))
	}
	r.Version = strings.TrimPrefix(m[1], "v")
	r.Major, _ = strconv.Atoi(m[2])
	r.Name = "containerd-" + m[2] + "." + m[3]
	return r, nil
}
