package agent

// Tests of the agent's flags.

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func TestOptionsCompleteAndValidate(t *testing.T) {
	cases := []struct {
		name         string
		args         []string
		env          string // NODE_NAME
		podNS        string // POD_NAMESPACE
		podName      string // POD_NAME
		wantNodeName string
		wantLeaseNS  string  // when set
		wantEndpoint *string // when set
		wantErr      []string
	}{
		{name: "flag wins over env", args: []string{"--node-name=node-a"}, env: "node-b", wantNodeName: "node-a"},
		{name: "env when no flag", env: "node-b", wantNodeName: "node-b"},
		{name: "invalid node name", args: []string{"--node-name=Node_A"}, wantErr: []string{`node name "Node_A"`}},
		{name: "endpoint without unix scheme", args: []string{"--node-name=n", "--runtime-endpoint=/run/containerd/containerd.sock"}, wantErr: []string{"--runtime-endpoint"}},
		{name: "tcp endpoint refused", args: []string{"--node-name=n", "--runtime-endpoint=tcp://127.0.0.1:1234"}, wantErr: []string{"unix:///"}},
		{name: "relist too fast", args: []string{"--node-name=n", "--relist-period=10ms"}, wantErr: []string{"--relist-period"}},
		{name: "device window too short", args: []string{"--node-name=n", "--device-window=500ms"}, wantErr: []string{"--device-window=500ms: must be between 1s and 2m"}},
		{name: "device window too long", args: []string{"--node-name=n", "--device-window=5m"}, wantErr: []string{"--device-window=5m0s"}},
		{name: "relative GPU list and socket", args: []string{"--node-name=n", "--nvidia-gpus-dir=proc/gpus", "--pod-resources-socket=kubelet.sock"},
			wantErr: []string{`--nvidia-gpus-dir="proc/gpus": want an absolute path`, `--pod-resources-socket="kubelet.sock": want an absolute path`}},
		{name: "GPU list and socket off", args: []string{"--node-name=n", "--nvidia-gpus-dir=", "--pod-resources-socket=", "--device-window=30s"}, wantNodeName: "n"},
		{name: "fencing with a tiny deadline", args: []string{"--node-name=n", "--fencing", "--fence-after=1s"}, wantErr: []string{"--fence-after"}},
		{name: "tiny deadline fine when fencing is off", args: []string{"--node-name=n", "--fence-after=1s"}, wantNodeName: "n"},
		{name: "fencing with its defaults", args: []string{"--node-name=n", "--fencing"}, podName: "coroner-agent-x7k2p", wantNodeName: "n", wantLeaseNS: "coroner-system"},
		{name: "lease namespace from POD_NAMESPACE", args: []string{"--node-name=n", "--fencing", "--fence-after=10s"}, podNS: "coroner", podName: "coroner-agent-x7k2p", wantNodeName: "n", wantLeaseNS: "coroner"},
		{name: "lease namespace flag wins", args: []string{"--node-name=n", "--fencing", "--lease-namespace=ops"}, podNS: "coroner", podName: "coroner-agent-x7k2p", wantNodeName: "n", wantLeaseNS: "ops"},
		{name: "fencing on the node Lease without the agent's pod", args: []string{"--node-name=n", "--fencing"}, wantErr: []string{"--fence-signal=node-lease needs the agent's pod", "$POD_NAME", "--pod-name"}},
		{name: "pod name from the flag", args: []string{"--node-name=n", "--fencing", "--pod-name=agent-1"}, wantNodeName: "n"},
		{name: "invalid pod name", args: []string{"--node-name=n", "--fencing", "--pod-name=Agent_1"}, wantErr: []string{"--pod-name=\"Agent_1\""}},
		{name: "agent-lease needs no pod", args: []string{"--node-name=n", "--fencing", "--fence-signal=agent-lease"}, wantNodeName: "n"},
		{name: "unknown fence signal", args: []string{"--node-name=n", "--fencing", "--fence-signal=ping", "--pod-name=a"}, wantErr: []string{`--fence-signal="ping": want node-lease or agent-lease`}},
		{name: "fence signal unchecked when fencing is off", args: []string{"--node-name=n", "--fence-signal=ping"}, wantNodeName: "n"},
		{name: "invalid lease namespace", args: []string{"--node-name=n", "--fencing", "--lease-namespace=Ops_NS"}, wantErr: []string{"--lease-namespace"}},
		{name: "history size out of range", args: []string{"--node-name=n", "--exit-history-size=0"}, wantErr: []string{"--exit-history-size"}},
		{name: "relative cgroup root", args: []string{"--node-name=n", "--cgroup-root=sys/fs/cgroup"}, wantErr: []string{"--cgroup-root"}},
		{name: "cgroup reading and kernel log off", args: []string{"--node-name=n", "--cgroup-root=", "--kmsg-path="}, wantNodeName: "n"},
		{name: "relative kmsg path", args: []string{"--node-name=n", "--kmsg-path=kmsg"}, wantErr: []string{"--kmsg-path"}},
		{name: "batch period too short", args: []string{"--node-name=n", "--stamp-batch-period=1ms"}, wantErr: []string{"--stamp-batch-period"}},
		{name: "negative shutdown grace", args: []string{"--node-name=n", "--shutdown-grace-period=-1s"}, wantErr: []string{"--shutdown-grace-period"}},
		{name: "no shutdown grace", args: []string{"--node-name=n", "--shutdown-grace-period=0"}, wantNodeName: "n"},
		{name: "runtime discovery by default", args: []string{"--node-name=n"}, wantNodeName: "n", wantEndpoint: ptr("auto")},
		{name: "runtime discovery when empty", args: []string{"--node-name=n", "--runtime-endpoint="}, wantNodeName: "n", wantEndpoint: ptr("")},
		{name: "runtime discovery under a host prefix", args: []string{"--node-name=n", "--runtime-endpoint=auto", "--runtime-host-prefix=/host"}, wantNodeName: "n", wantEndpoint: ptr("auto")},
		{name: "explicit runtime endpoint", args: []string{"--node-name=n", "--runtime-endpoint=unix:///run/crio/crio.sock"}, wantNodeName: "n", wantEndpoint: ptr("unix:///run/crio/crio.sock")},
		{name: "relative host prefix", args: []string{"--node-name=n", "--runtime-host-prefix=host"}, wantErr: []string{"--runtime-host-prefix"}},
		{name: "OOM score out of range", args: []string{"--node-name=n", "--oom-score-adj=-1001"}, wantErr: []string{"--oom-score-adj"}},
		{name: "OOM score not a number", args: []string{"--node-name=n", "--oom-score-adj=low"}, wantErr: []string{"--oom-score-adj=\"low\""}},
		{name: "OOM score kept", args: []string{"--node-name=n", "--oom-score-adj="}, wantNodeName: "n"},
		{name: "host prefix with an explicit endpoint", args: []string{"--node-name=n", "--runtime-endpoint=unix:///run/x.sock", "--runtime-host-prefix=/host"}, wantErr: []string{"--runtime-host-prefix", "auto only"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("NODE_NAME", tc.env)
			t.Setenv("POD_NAMESPACE", tc.podNS)
			t.Setenv("POD_NAME", tc.podName)
			o := NewOptions()
			fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
			o.AddFlags(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatalf("parse: %v", err)
			}
			if err := o.Complete(); err != nil {
				t.Fatalf("Complete: %v", err)
			}
			err := o.Validate()
			if len(tc.wantErr) == 0 {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				if o.NodeName != tc.wantNodeName {
					t.Errorf("node name = %q, want %q", o.NodeName, tc.wantNodeName)
				}
				if tc.wantEndpoint != nil && o.RuntimeEndpoint != *tc.wantEndpoint {
					t.Errorf("runtime endpoint = %q, want %q", o.RuntimeEndpoint, *tc.wantEndpoint)
				}
				if tc.wantLeaseNS != "" && o.LeaseNamespace != tc.wantLeaseNS {
					t.Errorf("lease namespace = %q, want %q", o.LeaseNamespace, tc.wantLeaseNS)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate() = nil, want an error mentioning %q", tc.wantErr)
			}
			for _, want := range tc.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("Validate() = %q, want it to mention %q", err, want)
				}
			}
		})
	}
}
