package kind

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestCNIConfig(t *testing.T) {
	var conf struct {
		Name    string
		Plugins []struct {
			Type string
			IPAM struct {
				Ranges [][]struct{ Subnet string }
			}
		}
	}
	if err := json.Unmarshal([]byte(cniConfig("10.244.1.0/24")), &conf); err != nil {
		t.Fatal(err)
	}
	if len(conf.Plugins) != 2 || conf.Plugins[0].Type != "ptp" || conf.Plugins[0].IPAM.Ranges[0][0].Subnet != "10.244.1.0/24" {
		t.Errorf("conflist: %+v", conf)
	}
}

// A config shaped like kind v0.32.0's (images/base/files/etc/containerd/config.toml):
// version 2, a proxy plugin, the runc runtime and a second one, each with SystemdCgroup.
const kindContainerdConfig = `version = 2

[proxy_plugins]
[proxy_plugins."fuse-overlayfs"]
  type = "snapshot"

[plugins."io.containerd.grpc.v1.cri".containerd]
  discard_unpacked_layers = true
  default_runtime_name = "runc"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
    SystemdCgroup = true

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.test-handler]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.test-handler.options]
    SystemdCgroup = true

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.10"
  restrict_oom_score_adj = false
`

func TestContainerdConfig(t *testing.T) {
	got, err := containerdConfig(kindContainerdConfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"runtimes.runc.options]\n    SystemdCgroup = true\n    BinaryName = \"/usr/local/sbin/runc-no-v1-freezer\"\n",
		"runtimes.test-handler.options]\n    SystemdCgroup = true\n    BinaryName = \"/usr/local/sbin/runc-no-v1-freezer\"\n",
		"restrict_oom_score_adj = true", "discard_unpacked_layers = false", "sandbox_image = \"registry.k8s.io/pause:" + PauseTag + "\"",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("config lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "proxy_plugins") || strings.Contains(got, "fuse-overlayfs") {
		t.Errorf("config keeps the fuse-overlayfs proxy plugin:\n%s", got)
	}
	// kind's file without the option: the node would run runc with the v1 freezer.
	if _, err := containerdConfig(strings.ReplaceAll(kindContainerdConfig, "SystemdCgroup = true", "")); err == nil {
		t.Error("a config without SystemdCgroup: no error, want one (runc would run with the freezer)")
	}
}

func TestClusterConfig(t *testing.T) {
	c := Config{Cluster: "coroner", Workers: 2, CNI: "static"}
	got := c.clusterConfig()
	for _, want := range []string{"name: coroner", "disableDefaultCNI: true", "failCgroupV1: false", "- role: control-plane\n- role: worker\n- role: worker\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("cluster config lacks %q:\n%s", want, got)
		}
	}
}
