package shim

import (
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/coroner-dev/coroner/shim/quarantine"
)

func TestOptionsValidate(t *testing.T) {
	cases := []struct {
		name    string
		args    []string
		wantErr []string // substrings; none means valid
	}{
		{name: "defaults are valid"},
		{name: "another managedBy value", args: []string{"--managed-by=example.com/batch"}},
		{name: "built-in controller name refused", args: []string{"--managed-by=kubernetes.io/job-controller"}, wantErr: []string{"other than the built-in"}},
		{name: "managedBy without a domain", args: []string{"--managed-by=shim"}, wantErr: []string{"domain-prefixed path"}},
		{name: "managedBy with a bad domain", args: []string{"--managed-by=Coroner_Dev/shim"}, wantErr: []string{"--managed-by"}},
		{name: "managedBy too long", args: []string{"--managed-by=coroner.dev/" + strings.Repeat("x", 60)}, wantErr: []string{"at most 63"}},
		{name: "zero qps", args: []string{"--kube-api-qps=0"}, wantErr: []string{"--kube-api-qps=0"}},
		{name: "burst below qps", args: []string{"--kube-api-qps=20", "--kube-api-burst=10"}, wantErr: []string{"--kube-api-burst=10"}},
		{name: "no workers", args: []string{"--workers=0"}, wantErr: []string{"--workers=0"}},
		{name: "lease timings out of order", args: []string{"--leader-elect-renew-deadline=20s"}, wantErr: []string{"renew deadline"}},
		{name: "lease timings ignored without leader election", args: []string{"--leader-elect=false", "--leader-elect-renew-deadline=20s"}},
		{name: "bad metrics address", args: []string{"--metrics-bind-address=8080"}, wantErr: []string{"--metrics-bind-address"}},
		{name: "metrics off", args: []string{"--metrics-bind-address=0", "--health-probe-bind-address=0"}},
		{name: "backoff max below base", args: []string{"--pod-failure-backoff-base=1m", "--pod-failure-backoff-max=30s"}, wantErr: []string{"0 < base <= max"}},
		{name: "negative zombie threshold", args: []string{"--zombie-threshold=-1s"}, wantErr: []string{"--zombie-threshold"}},
		{name: "device verdict wait off", args: []string{"--device-verdict-wait=0"}},
		{name: "negative device verdict wait", args: []string{"--device-verdict-wait=-5s"}, wantErr: []string{"--device-verdict-wait=-5s: must not be negative"}},
		{name: "recover only managed Jobs' pods", args: []string{"--recover-pods=managed"}},
		{name: "recover every opted-in pod", args: []string{"--recover-pods=all"}},
		{name: "unknown recovery scope", args: []string{"--recover-pods=none"}, wantErr: []string{`--recover-pods="none"`, `"all" or "managed"`}},
		{name: "unknown avoidance of failed nodes", args: []string{"--avoid-failed-nodes=always"}, wantErr: []string{`--avoid-failed-nodes="always"`, "want none, preferred or required"}},
		{name: "avoidance of failed nodes", args: []string{"--avoid-failed-nodes=required"}},
		{name: "every error reported at once", args: []string{"--workers=0", "--kube-api-qps=0"}, wantErr: []string{"--workers=0", "--kube-api-qps=0"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseOptions(t, tc.args)
			if len(tc.wantErr) == 0 {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
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

// parseOptions parses args as coroner-shim's flags and validates them.
func parseOptions(t *testing.T, args []string) (*Options, error) {
	t.Helper()
	o := NewOptions()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("parse: %v", err)
	}
	return o, o.Validate()
}

func TestDefaults(t *testing.T) {
	o := NewOptions()
	if o.ManagedBy != "coroner.dev/shim" || o.PodBackoffBase != 10*time.Second || o.PodBackoffMax != 10*time.Minute {
		t.Errorf("defaults = managedBy %q, backoff %v..%v; want coroner.dev/shim, 10s..10m (the built-in controller's)", o.ManagedBy, o.PodBackoffBase, o.PodBackoffMax)
	}
	if o.RecoverPods != "all" {
		t.Errorf("default --recover-pods=%q, want all (every opted-in pod, as Kueue)", o.RecoverPods)
	}
	if o.DeviceVerdictWait != 30*time.Second {
		t.Errorf("default --device-verdict-wait=%v, want 30s (three times the agent's 10 s window, docs/choices.md)", o.DeviceVerdictWait)
	}
}

// TestQuarantineOptions checks the --quarantine-* flags: validated whether --quarantine is
// on or not, and turned into the quarantine's Config.
func TestQuarantineOptions(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		wantErr []string
		want    quarantine.Config
	}{
		{name: "off by default", want: quarantine.Config{Options: quarantine.Options{Deaths: 3, Window: 30 * time.Minute, For: time.Hour, Max: quarantine.Max{N: 10, Percent: true}}}},
		{name: "on, with short durations and an absolute max",
			args: []string{"--quarantine", "--quarantine-deaths=2", "--quarantine-window=1m", "--quarantine-for=30s", "--quarantine-max=2"},
			want: quarantine.Config{Enabled: true, Options: quarantine.Options{Deaths: 2, Window: time.Minute, For: 30 * time.Second, Max: quarantine.Max{N: 2}}}},
		{name: "no deaths", args: []string{"--quarantine-deaths=0"}, wantErr: []string{"--quarantine-deaths=0: must be at least 1"}},
		{name: "zero window", args: []string{"--quarantine-window=0"}, wantErr: []string{"--quarantine-window=0s: must be positive"}},
		{name: "negative for", args: []string{"--quarantine", "--quarantine-for=-1m"}, wantErr: []string{"--quarantine-for=-1m0s: must be positive"}},
		{name: "max zero", args: []string{"--quarantine-max=0"}, wantErr: []string{`--quarantine-max="0": must be at least 1`}},
		{name: "max over 100%", args: []string{"--quarantine-max=150%"}, wantErr: []string{`--quarantine-max="150%": a percentage must be between 1% and 100%`}},
		{name: "max not a number", args: []string{"--quarantine-max=half"}, wantErr: []string{`--quarantine-max="half": want a number of nodes (3) or a percentage of the nodes (10%)`}},
		{name: "every error at once", args: []string{"--quarantine-deaths=-1", "--quarantine-max=x"}, wantErr: []string{"--quarantine-deaths=-1", "--quarantine-max="}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parseOptions(t, tc.args)
			if len(tc.wantErr) == 0 {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				if got := o.QuarantineConfig(); got != tc.want {
					t.Errorf("QuarantineConfig() = %+v, want %+v", got, tc.want)
				}
				return
			}
			for _, want := range tc.wantErr {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("Validate() = %v, want it to mention %q", err, want)
				}
			}
		})
	}
}
