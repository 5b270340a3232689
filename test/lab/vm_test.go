package lab

import (
	"os"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/coroner-dev/coroner/test/containerd"
	"github.com/coroner-dev/coroner/test/vm"
)

func TestVMNode(t *testing.T) {
	n := VMNode()
	got := []string{n.Name, n.HostVeth, n.IP.String(), n.PodCIDR.String(), n.gateway().String(), n.Socket(), n.Runtime}
	want := []string{"lab-node-4", "crlab-4", "10.77.0.14", "10.77.4.0/24", "10.77.4.1", "/run/coroner-lab/lab-node-4/containerd.sock", RuntimeContainerd2}
	if !slices.Equal(got, want) {
		t.Errorf("VMNode() = %v, want %v", got, want)
	}
	for _, o := range Nodes(3) {
		if o.Name == n.Name || o.IP.Equal(n.IP) || o.PodCIDR.String() == n.PodCIDR.String() || o.HostVeth == n.HostVeth {
			t.Errorf("the VM node collides with %s", o.Name)
		}
	}
}

func TestVMKubeletConfig(t *testing.T) {
	var k map[string]any
	if err := yaml.Unmarshal([]byte(vmKubeletConfig(VMNode())), &k); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]any{
		"kind":                     "KubeletConfiguration",
		"cgroupDriver":             "systemd",
		"containerRuntimeEndpoint": "unix:///run/coroner-lab/lab-node-4/containerd.sock",
		"address":                  "10.77.0.14",
		"tlsCertFile":              "/opt/coroner/node/pki/serving.crt",
	} {
		if k[key] != want {
			t.Errorf("%s = %v, want %v", key, k[key], want)
		}
	}
	// A production node's defaults: no cgroupRoot of the lab's, failCgroupV1 and
	// failSwapOn left to the kubelet (true).
	for _, key := range []string{"cgroupRoot", "failCgroupV1", "failSwapOn"} {
		if _, ok := k[key]; ok {
			t.Errorf("%s set; the VM node keeps the default", key)
		}
	}
}

func TestVMContainerdConfig(t *testing.T) {
	c := ConfigFor("/repo")
	rt := c.guestRuntime(containerd.Runtime{Major: 2, Version: "2.4.2",
		Containerd: "/repo/_output/bin/containerd2/containerd", Shim: "/repo/_output/bin/containerd2/containerd-shim-runc-v2",
		Runc: "/repo/_output/bin/containerd2/runc", Ctr: "/repo/_output/bin/containerd2/ctr"})
	toml, err := vmContainerdConfig(VMNode(), rt)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"version = 3", "SystemdCgroup = true", "restrict_oom_score_adj = false",
		`BinaryName = "/opt/coroner/bin/containerd2/runc"`, `runtime_path = "/opt/coroner/bin/containerd2/containerd-shim-runc-v2"`,
		`address = "/run/coroner-lab/lab-node-4/containerd.sock"`, `conf_dir = "/etc/cni/net.d"`} {
		if !strings.Contains(toml, want) {
			t.Errorf("containerd config lacks %q:\n%s", want, toml)
		}
	}
	if _, err := vmContainerdConfig(VMNode(), containerd.Runtime{Major: 1, Version: "1.6.20"}); err == nil {
		t.Error("containerd 1.6 accepted for the VM node")
	}
}

func TestVMMachine(t *testing.T) {
	c := ConfigFor("/repo")
	m := c.vmMachine()
	m.Accel = "tcg"
	args := strings.Join(m.Args(), " ")
	for _, want := range []string{
		"-accel tcg,thread=multi", "systemd.unified_cgroup_hierarchy=1", "root=/dev/vda",
		"file=/repo/_output/lab/nodes/lab-node-4/disk.qcow2,if=virtio,format=qcow2",
		"-serial file:/repo/_output/lab/logs/console-lab-node-4.log",
		"tap,id=net0,ifname=crlab-4,script=no,downscript=no", "mac=52:54:00:4d:00:0e",
		"path=/repo/_output/bin,mount_tag=corbin,security_model=none,readonly=on",
		"path=/repo/_output/lab/nodes/lab-node-4,mount_tag=cornode,security_model=none",
	} {
		if !strings.Contains(args, want) {
			t.Errorf("QEMU args lack %q: %s", want, args)
		}
	}
	// Every share QEMU exports is one the guest mounts: the image's boot script
	// (build-image.sh) mounts corbin, corimg and cornode, guest.sh corlog.
	boot, err := os.ReadFile("../vm/build-image.sh")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range m.Shares {
		if !strings.Contains(string(boot)+vm.GuestScript, " "+s.Tag+" /opt/coroner/") {
			t.Errorf("the guest does not mount the share %s", s.Tag)
		}
	}
	m.Accel = "kvm"
	if args := strings.Join(m.Args(), " "); !strings.Contains(args, "-accel kvm -cpu host") {
		t.Errorf("kvm: %s", args)
	}
}
