package main

import (
	"context"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/yaml"

	"github.com/coroner-dev/coroner/conditions"
)

// TestOutageJobs checks each group's Jobs: who manages them, how they replace pods, and
// how their pods opt in to recovery.
func TestOutageJobs(t *testing.T) {
	tests := []struct {
		name        string
		group       string
		pods        int
		toleration  time.Duration
		wantJobs    int
		wantManaged bool
		wantPolicy  batchv1.PodReplacementPolicy
		wantAnno    string
		wantTolSecs int64 // 0: no toleration of our own
	}{
		{name: "coroner's: managed by the shim, opted in", group: groupCoroner, pods: 150, wantJobs: 2, wantManaged: true,
			wantAnno: conditions.AnnotationSafeToForcefullyDelete},
		{name: "built-in: replaced when terminating", group: groupBuiltin, pods: 100, wantJobs: 1, wantPolicy: batchv1.TerminatingOrFailed},
		{name: "kueue: replaced when failed, opted in to Kueue's recovery", group: groupKueue, pods: 200, wantJobs: 2,
			wantPolicy: batchv1.Failed, wantAnno: kueueSafeToDelete},
		{name: "kueue with a short toleration", group: groupKueue, pods: 10, toleration: 10 * time.Second, wantJobs: 1,
			wantPolicy: batchv1.Failed, wantAnno: kueueSafeToDelete, wantTolSecs: 10},
		{name: "the toleration is the kueue group's only", group: groupBuiltin, pods: 10, toleration: 10 * time.Second, wantJobs: 1,
			wantPolicy: batchv1.TerminatingOrFailed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cs := fake.NewClientset()
			if err := createOutageJobs(context.Background(), cs, tc.group, tc.pods, tc.toleration); err != nil {
				t.Fatal(err)
			}
			jobs, err := cs.BatchV1().Jobs(groupNamespaces[tc.group]).List(context.Background(), metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(jobs.Items) != tc.wantJobs {
				t.Fatalf("%d Jobs, want %d", len(jobs.Items), tc.wantJobs)
			}
			total := int32(0)
			for _, j := range jobs.Items {
				total += *j.Spec.Completions
				if got := j.Spec.ManagedBy != nil; got != tc.wantManaged {
					t.Errorf("%s: managedBy %v, want set %v", j.Name, j.Spec.ManagedBy, tc.wantManaged)
				}
				if tc.wantPolicy != "" && (j.Spec.PodReplacementPolicy == nil || *j.Spec.PodReplacementPolicy != tc.wantPolicy) {
					t.Errorf("%s: podReplacementPolicy %v, want %s", j.Name, j.Spec.PodReplacementPolicy, tc.wantPolicy)
				}
				if tc.wantAnno != "" && j.Spec.Template.Annotations[tc.wantAnno] != "true" {
					t.Errorf("%s: pod annotations %v, want %s=true", j.Name, j.Spec.Template.Annotations, tc.wantAnno)
				}
				if tc.group != groupKueue && j.Spec.Template.Annotations[kueueSafeToDelete] != "" {
					t.Errorf("%s: a %s pod opted in to Kueue's recovery", j.Name, tc.group)
				}
				var tol int64
				for _, tl := range j.Spec.Template.Spec.Tolerations {
					if tl.Key == corev1.TaintNodeUnreachable && tl.Effect == corev1.TaintEffectNoExecute && tl.TolerationSeconds != nil {
						tol = *tl.TolerationSeconds
					}
				}
				if tol != tc.wantTolSecs {
					t.Errorf("%s: tolerates the NoExecute unreachable taint for %d s, want %d", j.Name, tol, tc.wantTolSecs)
				}
			}
			if int(total) != tc.pods {
				t.Errorf("%d completions in all, want %d", total, tc.pods)
			}
		})
	}
	if err := createOutageJobs(context.Background(), fake.NewClientset(), "other", 1, 0); err == nil {
		t.Errorf("an unknown group: no error")
	}
}

// TestKueueConfig checks that the manager's configuration parses and turns on what the
// scenario needs, and off what a host process cannot have.
func TestKueueConfig(t *testing.T) {
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(kueueConfig(9443, "/tmp/certs", "127.0.0.1:8081")), &cfg); err != nil {
		t.Fatal(err)
	}
	get := func(path ...string) any {
		var v any = cfg
		for _, p := range path {
			m, _ := v.(map[string]any)
			v = m[p]
		}
		return v
	}
	for _, tc := range []struct {
		path []string
		want any
	}{
		{[]string{"kind"}, "Configuration"},
		{[]string{"featureGates", "FailureRecoveryPolicy"}, true},
		{[]string{"featureGates", "VisibilityOnDemand"}, false},
		{[]string{"internalCertManagement", "enable"}, false},
		{[]string{"leaderElection", "leaderElect"}, false},
		{[]string{"metrics", "bindAddress"}, "0"},
		{[]string{"webhook", "host"}, "127.0.0.1"},
		{[]string{"webhook", "port"}, float64(9443)},
		{[]string{"webhook", "certDir"}, "/tmp/certs"},
		{[]string{"health", "healthProbeBindAddress"}, "127.0.0.1:8081"},
		{[]string{"controller", "groupKindConcurrency", "Pod"}, float64(5)},
	} {
		if got := get(tc.path...); got != tc.want {
			t.Errorf("%s = %v, want %v", strings.Join(tc.path, "."), got, tc.want)
		}
	}
}

func TestRecoveryStarted(t *testing.T) {
	log := strings.Join([]string{
		`{"level":"info","msg":"Starting workers","controller":"workload_controller","worker count":5}`,
		`{"level":"info","msg":"Starting EventSource","controller":"pod_termination_controller"}`,
	}, "\n")
	if recoveryStarted(log) {
		t.Errorf("started before its workers")
	}
	if !recoveryStarted(log + "\n" + `{"level":"info","logger":"failure-recovery-pod-termination-controller","msg":"Starting workers","replica-role":"standalone","worker count":5}`) {
		t.Errorf("not started after its workers")
	}
}
