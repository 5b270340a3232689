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

// TestKiBField: fields of /proc/PID/status and /proc/meminfo as this machine's kernel
// (6.18) prints them.
func TestKiBField(t *testing.T) {
	status := "Name:\tcat\nVmPeak:\t    5004 kB\nVmRSS:\t    1792 kB\nThreads:\t1\n"
	meminfo := "MemTotal:       24598020 kB\nMemFree:         4303896 kB\nMemAvailable:   23211372 kB\n"
	for _, tc := range []struct {
		content, key string
		want         int64
	}{
		{status, "VmRSS", 1792 * 1024},
		{meminfo, "MemAvailable", 23211372 * 1024},
	} {
		if got, err := KiBField(tc.content, tc.key); err != nil || got != tc.want {
			t.Errorf("%s: %d, %v; want %d", tc.key, got, err, tc.want)
		}
	}
	if _, err := KiBField(status, "VmHWM"); err == nil {
		t.Error("a missing field: no error")
	}
	if _, err := KiBField("VmRSS:\n", "VmRSS"); err == nil {
		t.Error("an empty field: no error")
	}
}
