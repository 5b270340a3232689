package e2eapps

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	"k8s.io/kubernetes/test/e2e/framework"
	"k8s.io/kubernetes/test/e2e/framework/config"

	// The specs: "[sig-apps] ..." (Job, Deployment, StatefulSet, ...); test/upstream selects
	// the Job ones with --ginkgo.focus.
	_ "k8s.io/kubernetes/test/e2e/apps"
)

// TestMain registers the framework's flags (--kubeconfig, --provider, --ginkgo.*, ...) as
// upstream's test/e2e/e2e_test.go does, without its conformance listing and test files.
func TestMain(m *testing.M) {
	config.CopyFlags(config.Flags, flag.CommandLine)
	framework.RegisterCommonFlags(flag.CommandLine)
	framework.RegisterClusterFlags(flag.CommandLine)
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "unknown additional command line arguments: %s\n", flag.Args())
		os.Exit(2)
	}
	framework.AfterReadingAllFlags(&framework.TestContext)
	os.Exit(m.Run())
}

// TestE2E runs the selected specs through Ginkgo, as upstream's RunE2ETests does.
func TestE2E(t *testing.T) {
	gomega.RegisterFailHandler(framework.Fail)
	suiteConfig, reporterConfig := framework.CreateGinkgoConfig()
	ginkgo.RunSpecs(t, "upstream sig-apps e2e (coroner)", suiteConfig, reporterConfig)
}
