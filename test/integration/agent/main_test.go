// Package agent_test runs the node agent in-process against a real API server
// (test/harness: etcd + kube-apiserver v1.36.3) and real containerds, 1.6, 1.7 and 2.x, with
// runc (test/containerd), the test playing the kubelet: it creates Pod objects bound to a
// node that has no kubelet, then their sandboxes and containers over CRI with the
// kubelet's labels and the Pod objects' UIDs (test/integration/agent/kubeletsim), and
// writes pod status where a case needs the kubelet's word.
package agent_test

import (
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/coroner-dev/coroner/test/containerd/containerdtest"
	"github.com/coroner-dev/coroner/test/harness"
)

var (
	apiEnv *harness.Env
	apiErr error
)

// TestMain starts one API server and one containerd per runtime (test/containerd:
// Debian's 1.6, and the 1.7 and 2.x built by test/tools) for the package and stops them
// after the tests, whatever happened; tests that need containerd run once per runtime
// (containerdtest.Each).
func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	apiEnv, apiErr = harness.Start(harness.Options{})
	if apiEnv != nil {
		defer apiEnv.Stop()
		fmt.Fprintf(os.Stderr, "harness: kube-apiserver %s ready at %s in %v\n",
			apiEnv.ServerVersion, apiEnv.Config.Host, apiEnv.StartupTime.Round(10*time.Millisecond))
	}
	return containerdtest.Main(m)
}

// apiServer returns the API server, skipping the test when it is not available, or
// failing it when CORONER_REQUIRE_HARNESS=1 asks for it (CI must never pass by skipping).
func apiServer(t *testing.T) *harness.Env {
	t.Helper()
	switch {
	case apiEnv != nil:
	case errors.Is(apiErr, harness.ErrNoBinaries) && os.Getenv("CORONER_REQUIRE_HARNESS") != "1":
		t.Skipf("no real API server (set CORONER_REQUIRE_HARNESS=1 to fail instead): %v", apiErr)
	default:
		t.Fatalf("starting the API server harness: %v", apiErr)
	}
	return apiEnv
}
