package host

import "testing"

func TestArgsInside(t *testing.T) {
	dirs := []string{"/repo/_output/lab", "/run/coroner-lab"}
	cases := []struct {
		name string
		args []string
		want bool
	}{
		{"flag with value", []string{"kubelet", "--config=/repo/_output/lab/nodes/n/kubelet.yaml"}, true},
		{"separate value", []string{"containerd", "--config", "/repo/_output/lab/nodes/n/containerd.toml"}, true},
		{"unix socket", []string{"shim", "-address", "unix:///run/coroner-lab/n/containerd.sock"}, true},
		{"the directory itself", []string{"x", "/run/coroner-lab"}, true},
		{"a sibling directory", []string{"x", "/run/coroner-lab2/sock"}, false},
		{"only the program path", []string{"/repo/_output/lab/bin"}, false},
		{"elsewhere", []string{"etcd", "--data-dir=/tmp/etcd"}, false},
	}
	for _, tc := range cases {
		var args [][]byte
		for _, a := range tc.args {
			args = append(args, []byte(a))
		}
		if got := argsInside(args, dirs); got != tc.want {
			t.Errorf("%s: argsInside(%q) = %v, want %v", tc.name, tc.args, got, tc.want)
		}
	}
}
