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

func TestClusterConfig(t *testing.T) {
	c := Config{Cluster: "coroner", Workers: 2, CNI: "static"}
	got := c.clusterConfig()
	for _, want := range []string{"name: coroner", "disableDefaultCNI: true", "failCgroupV1: false", "- role: control-plane\n- role: worker\n- role: worker\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("cluster config lacks %q:\n%s", want, got)
		}
	}
}
