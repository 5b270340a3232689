package harness

import (
	"errors"
	"fmt"
	"os"
	"testing"
)

var (
	shared    *Env
	sharedErr error
)

// Main starts the package's shared Env, runs the tests and stops the Env; use it as
// `os.Exit(harness.Main(m))` in TestMain.
//
// When the binaries have not been built, the tests that call Shared are skipped with a
// message that says how to build them, unless CORONER_REQUIRE_HARNESS=1 (set by `make test`
// and CI), in which case they fail: CI must never pass by skipping the real API server.
func Main(m *testing.M) int {
	shared, sharedErr = Start(Options{})
	if sharedErr == nil {
		fmt.Fprintf(os.Stderr, "harness: kube-apiserver %s ready at %s in %v (logs in %s)\n",
			shared.ServerVersion, shared.Config.Host, shared.StartupTime.Round(10e6), shared.Dir)
	}
	code := m.Run()
	if shared != nil {
		shared.Stop()
	}
	return code
}

// Shared returns the Env started by Main, skipping or failing the test when there is none.
func Shared(t testing.TB) *Env {
	t.Helper()
	switch {
	case shared != nil:
		return shared
	case sharedErr == nil:
		t.Fatal("harness.Shared called without harness.Main in TestMain")
	case errors.Is(sharedErr, ErrNoBinaries) && os.Getenv("CORONER_REQUIRE_HARNESS") != "1":
		t.Skipf("no real API server: %v", sharedErr)
	default:
		t.Fatalf("starting the API server harness: %v", sharedErr)
	}
	return nil
}
