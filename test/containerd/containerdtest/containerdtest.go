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
	shared    *containerd.Env
	sharedErr error
)

// Main starts the package's shared Env, runs the tests and stops the Env; use it as
// `os.Exit(containerdtest.Main(m))` in TestMain.
//
// When containerd, runc or busybox-static is missing (or not root), the tests that call
// Shared are skipped with a message that says what to install, unless
// CORONER_REQUIRE_CONTAINERD=1 (CI), in which case they fail.
func Main(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	shared, sharedErr = containerd.Start(ctx, containerd.Options{})
	cancel()
	if sharedErr == nil {
		fmt.Fprintf(os.Stderr, "containerd: %s ready at %s: started in %v, images imported in %v\n",
			shared.Version, shared.Socket, shared.StartupTime.Round(time.Millisecond), shared.ImportTime.Round(time.Millisecond))
	}
	code := m.Run()
	if shared != nil {
		shared.Stop()
	}
	return code
}

// Shared returns the Env started by Main, skipping or failing the test when there is none.
func Shared(t testing.TB) *containerd.Env {
	t.Helper()
	switch {
	case shared != nil:
		return shared
	case sharedErr == nil:
		t.Fatal("containerdtest.Shared called without containerdtest.Main in TestMain")
	case errors.Is(sharedErr, containerd.ErrNotAvailable) && os.Getenv("CORONER_REQUIRE_CONTAINERD") != "1":
		t.Skipf("no real containerd (set CORONER_REQUIRE_CONTAINERD=1 to fail instead): %v", sharedErr)
	default:
		t.Fatalf("starting containerd: %v", sharedErr)
	}
	return nil
}
