// Package containerdtest runs one real containerd (test/containerd) per test package:
//
//	func TestMain(m *testing.M) { os.Exit(containerdtest.Main(m)) }
//
//	func TestSomething(t *testing.T) {
//		env := containerdtest.Shared(t)
//		...
//	}
//
// It is apart from test/containerd so that the lab (and coronerctl, which links the lab's
// node controls) does not link the testing package.
package containerdtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/coroner-dev/coroner/test/containerd"
)

var (
	// envs are the package's containerds, one per runtime, oldest first (Debian's 1.6, 1.7,
	// 2.x); errs say why a runtime could not start or is missing.
	envs []*containerd.Env
	errs []error
	ran  bool
)

// Main starts one containerd per available runtime (Debian's 1.6, and the 1.7 and 2.x
// built by test/tools), runs the tests and stops them; use it as
// `os.Exit(containerdtest.Main(m))` in TestMain.
//
// When a runtime is missing (containerd, runc or busybox-static not installed, 2.x or 1.7
// not built, or not root), the tests that need it are skipped with a message that says
// what to install or build, unless CORONER_REQUIRE_CONTAINERD=1 (CI), in which case they
// fail.
func Main(m *testing.M) int {
	ran = true
	rts, err := containerd.Runtimes("")
	if err != nil {
		errs = append(errs, err)
	}
	for _, rt := range rts {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		env, err := containerd.Start(ctx, containerd.Options{Runtime: &rt})
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", rt.Name, err))
			continue
		}
		fmt.Fprintf(os.Stderr, "containerd: %s (%s) ready at %s: started in %v, images imported in %v\n",
			rt.Name, env.Version, env.Socket, env.StartupTime.Round(time.Millisecond), env.ImportTime.Round(time.Millisecond))
		envs = append(envs, env)
	}
	code := m.Run()
	for _, e := range envs {
		e.Stop()
	}
	return code
}

// missing skips or fails t for the runtimes that could not start: skipped when each is
// only not available and CORONER_REQUIRE_CONTAINERD is not 1, else failed.
func missing(t testing.TB) {
	t.Helper()
	if !ran {
		t.Fatal("containerdtest used without containerdtest.Main in TestMain")
	}
	err := errors.Join(errs...)
	if err == nil {
		return
	}
	soft := true
	for _, e := range errs {
		if !errors.Is(e, containerd.ErrNotAvailable) && !errors.Is(e, containerd.ErrNoBuiltRuntime) {
			soft = false
		}
	}
	if soft && os.Getenv("CORONER_REQUIRE_CONTAINERD") != "1" {
		if len(envs) == 0 {
			t.Skipf("no real containerd (set CORONER_REQUIRE_CONTAINERD=1 to fail instead): %v", err)
		}
		t.Logf("not every runtime is here (set CORONER_REQUIRE_CONTAINERD=1 to fail instead): %v", err)
		return
	}
	t.Fatalf("starting containerd: %v", err)
}

// Shared returns the package's first containerd (Debian's 1.6), skipping or failing the
// test when a runtime is missing. Tests that should hold on every runtime use Each.
func Shared(t testing.TB) *containerd.Env {
	t.Helper()
	missing(t)
	return envs[0]
}

// Each runs f as a subtest per runtime, named after it ("containerd-1.6",
// "containerd-1.7", "containerd-2.4"), skipping or failing as Shared does when a runtime
// is missing.
func Each(t *testing.T, f func(t *testing.T, env *containerd.Env)) {
	t.Helper()
	missing(t)
	for _, env := range envs {
		t.Run(env.Containerd.Name, func(t *testing.T) { f(t, env) })
	}
}

// Envs returns the package's containerds, one per runtime, with Shared's rules.
func Envs(t testing.TB) []*containerd.Env {
	t.Helper()
	missing(t)
	return envs
}
