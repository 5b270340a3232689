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

// Runtime is one containerd build with the runc it runs containers with. Three are used:
//   - Debian's containerd 1.6 with runc 1.1 (the packages, on PATH), whose CRI has no
//     GetContainerEvents (the agent relists);
//   - containerd 1.7 built from its Go module by test/tools into _output/bin/containerd17,
//     with Debian's runc 1.1 (the pairing distributions ship), whose CRI serves
//     GetContainerEvents on one channel that every subscriber takes from: the agent never
//     subscribes and relists;
//   - containerd 2.x with runc 1.5 built from their Go modules by test/tools into
//     _output/bin/containerd2 (CRI events for every subscriber: the agent's events mode).
type Runtime struct {
	// Name labels subtests and lab nodes: "containerd-1.6", "containerd-1.7",
	// "containerd-2.4".
	Name string
	// Version is what `containerd --version` says, e.g. "1.6.20~ds1", "1.7.35" or "2.4.2".
	Version string
	// Major is containerd's major version: 1 takes config version 2, 2 takes version 3.
	Major int
	// Minor is containerd's minor version (7 names 1.7's shim by path in its config).
	Minor int
	// Binaries: containerd, ctr, the runc shim and runc.
	Containerd, Ctr, Shim, Runc string
}

// String is the runtime's name and version.
func (r Runtime) String() string { return r.Name + " (" + r.Version + ")" }

// Events reports whether cri.Watcher (the agent) follows the runtime by its CRI
// GetContainerEvents stream: containerd 2.x, whose CRI gives every subscriber every event.
func (r Runtime) Events() bool { return r.Major >= 2 }

// SharedEvents reports whether the runtime's CRI serves GetContainerEvents on one channel
// that every subscriber takes from, so that each event goes to one of them (containerd
// 1.7): served, but never subscribed to by cri.Watcher, which relists instead.
func (r Runtime) SharedEvents() bool { return r.Major == 1 && r.Minor >= 7 }

// LosesExitWhileDown reports whether a container that exits while containerd is down is
// reported after the restart with exit code 255, reason Unknown, instead of its own:
// containerd 1.7 and 2.x (measured: 1.7.35, 2.4.2) take a task shim whose processes are
// all gone for one leaked by a crash during create ("cleaning leaked shim process",
// containerd PR #6866; runtime/v2/shim_load.go in 1.7) and delete it. 1.6 asks the shim,
// which kept the exit status.
func (r Runtime) LosesExitWhileDown() bool { return r.Major >= 2 || r.Minor >= 7 }

// ErrNoBuiltRuntime means test/tools has not built containerd 2.x and runc, or 1.7.
var ErrNoBuiltRuntime = errors.New("containerd not built")

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
	r, err := builtRuntime(binDir, "containerd2", true)
	if err != nil {
		return r, err
	}
	return r.identify()
}

// Built17 is containerd 1.7 as test/tools/build.sh builds it into binDir/containerd17
// (binDir as for Built), with Debian's runc from PATH.
func Built17(binDir string) (Runtime, error) {
	r, err := builtRuntime(binDir, "containerd17", false)
	if err != nil {
		return r, err
	}
	if r.Runc, err = exec.LookPath("runc"); err != nil {
		return r, fmt.Errorf("%w: runc not on PATH for containerd 1.7 (apt-get install runc)", ErrNotAvailable)
	}
	r, err = r.identify()
	if err == nil && (r.Major != 1 || r.Minor != 7) {
		err = fmt.Errorf("%s says it is containerd %s, want 1.7: rebuild with test/tools/build.sh containerd17", r.Containerd, r.Version)
	}
	return r, err
}

// builtRuntime is the binaries test/tools/build.sh put in binDir/name (containerd, ctr,
// the runc shim, and runc when withRunc), each checked to be there.
func builtRuntime(binDir, name string, withRunc bool) (Runtime, error) {
	if os.Geteuid() != 0 {
		return Runtime{}, fmt.Errorf("%w: containerd and runc need root (euid %d)", ErrNotAvailable, os.Geteuid())
	}
	dir, err := builtDir(binDir, name)
	if err != nil {
		return Runtime{}, err
	}
	r := Runtime{
		Containerd: filepath.Join(dir, "containerd"),
		Ctr:        filepath.Join(dir, "ctr"),
		Shim:       filepath.Join(dir, "containerd-shim-runc-v2"),
	}
	files := []string{r.Containerd, r.Ctr, r.Shim}
	targets := name
	if withRunc {
		r.Runc = filepath.Join(dir, "runc")
		files = append(files, r.Runc)
		targets += " runc"
	}
	for _, p := range files {
		if _, err := os.Stat(p); err != nil {
			return r, fmt.Errorf("%w: %s missing: run `make tools` (test/tools/build.sh %s)", ErrNoBuiltRuntime, p, targets)
		}
	}
	return r, nil
}

// builtDir is binDir/name; binDir "" is $CORONER_BIN_DIR, else the repository's
// _output/bin.
func builtDir(binDir, name string) (string, error) {
	if binDir == "" {
		binDir = os.Getenv("CORONER_BIN_DIR")
	}
	if binDir == "" {
		root, err := host.RepoRoot()
		if err != nil {
			return "", err
		}
		binDir = filepath.Join(root, "_output", "bin")
	}
	return filepath.Join(binDir, name), nil
}

// Runtimes returns every runtime available, oldest first: Debian's 1.6, the built 1.7,
// the built 2.x. The error says what is missing; the runtimes found are returned with it.
func Runtimes(binDir string) ([]Runtime, error) {
	var out []Runtime
	var errs []error
	for _, get := range []func() (Runtime, error){Debian, func() (Runtime, error) { return Built17(binDir) }, func() (Runtime, error) { return Built(binDir) }} {
		if r, err := get(); err == nil {
			out = append(out, r)
		} else {
			errs = append(errs, err)
		}
	}
	return out, errors.Join(errs...)
}

// versionRE finds the version in `containerd --version`: "containerd containerd.io
// 1.6.20~ds1 ..." (Debian), "containerd github.com/containerd/containerd 1.7.35 module" or
// "containerd github.com/containerd/containerd/v2 2.4.2 module".
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
	r.Minor, _ = strconv.Atoi(m[3])
	r.Name = "containerd-" + m[2] + "." + m[3]
	return r, nil
}
