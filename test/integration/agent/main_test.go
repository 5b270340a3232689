// Package agent_test runs the node agent in-process against a real API server
// (test/harness: etcd + kube-apiserver v1.36.3) and a real containerd 1.6 with runc
// (test/containerd), the test playing the kubelet: it creates Pod objects bound to a
// node that has no kubelet, then their sandboxes and containers over CRI with the
// kubelet's labels and the Pod objects' UIDs (test/integration/agent/kubeletsim), and
// writes pod status where a case needs the kubelet's word.
package agent_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/coroner-dev/coroner/test/containerd"
	"github.com/coroner-dev/coroner/test/harness"
)

var (
	apiEnv *harness.Env
	apiErr error
	criEnv *containerd.Env
	criErr error
)

// TestMain starts one API server and one containerd for the package and stops both
// after the tests, whatever happened.
func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	apiEnv, apiErr = harness.Start(harness.Options{})
	if apiEnv != nil {
		defer apiEnv.Stop()
		fmt.Fprintf(os.Stderr, "harness: kube-apiserver %s ready at %s in %v\n",
			apiEnv.ServerVersion, apiEnv.Config.Host, apiEnv.StartupTime.Round(10*time.Millisecond))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	criEnv, criErr = containerd.Start(ctx, containerd.Options{})
	cancel()
	if criEnv != nil {
		defer criEnv.Stop()
		fmt.Fprintf(os.Stderr, "containerd: %s ready at %s in %v\n",
			criEnv.Version, criEnv.Socket, criEnv.StartupTime.Round(time.Millisecond))
	}
	return m.Run()
}

// envs returns the API server and the containerd, skipping the test when either is not
// available, or failing it when CORONER_REQUIRE_HARNESS=1 or CORONER_REQUIRE_CONTAINERD=1
// asks for it (CI must never pass by skipping).
func envs(t *testing.T) (*harness.Env, *containerd.Env) {
	t.Helper()
	api := apiServer(t)
	switch {
	case criEnv != nil:
	case errors.Is(criErr, containerd.ErrNotAvailable) && os.Getenv("CORONER_REQUIRE_CONTAINERD") != "1":
		t.Skipf("no real containerd (set CORONER_REQUIRE_CONTAINERD=1 to fail instead): %v", criErr)
	default:
		t.Fatalf("starting containerd: %v", criErr)
	}
	return api, criEnv
}

// apiServer returns the API server alone, with envs' rules.
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
