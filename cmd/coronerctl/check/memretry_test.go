package check

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/test/wrappers"
)

// TestMemoryRetryAnnotation: coroner.dev/oom-memory-retry is checked: syntax and range,
// max against the template's limits, a Job not handed to coroner, nothing to grow.
func TestMemoryRetryAnnotation(t *testing.T) {
	for _, tc := range []struct {
		name, value, limit string
		managedBy          string
		onFailure          bool
		want               string // substring of the one finding, "" for none
		wantSev            Severity
		wantFail           bool
	}{
		{name: "valid", value: "factor=2,max=128Mi", limit: "24Mi", managedBy: conditions.ManagedBy},
		{name: "bad factor", value: "factor=0.5,max=128Mi", limit: "24Mi", managedBy: conditions.ManagedBy, want: "factor \"0.5\": want a number from 1.1 to 10", wantSev: Error, wantFail: true},
		{name: "max missing", value: "factor=2", limit: "24Mi", managedBy: conditions.ManagedBy, want: "both factor and max are required", wantSev: Error, wantFail: true},
		{name: "max below the template's limit", value: "factor=2,max=16Mi", limit: "24Mi", managedBy: conditions.ManagedBy, want: "max 16Mi is below container main's memory limit of 24Mi", wantSev: Error, wantFail: true},
		{name: "not coroner's", value: "factor=2,max=128Mi", limit: "24Mi", want: "has no effect: only coroner-shim grows memory", wantSev: Warning, wantFail: true},
		{name: "no limit", value: "factor=2,max=128Mi", managedBy: conditions.ManagedBy, want: "there is no limit to grow", wantSev: Warning, wantFail: true},
		{name: "restartPolicy OnFailure", value: "factor=2,max=128Mi", limit: "24Mi", managedBy: conditions.ManagedBy, onFailure: true, want: "has no effect with restartPolicy OnFailure", wantSev: Warning, wantFail: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := wrappers.MakeJob("j", "ns")
			if tc.managedBy != "" {
				w = w.ManagedBy(tc.managedBy)
			}
			job := w.Obj()
			job.Annotations = map[string]string{v1alpha1.AnnotationOOMMemoryRetry: tc.value}
			if tc.onFailure {
				job.Spec.Template.Spec.RestartPolicy = corev1.RestartPolicyOnFailure
			}
			if tc.limit != "" {
				job.Spec.Template.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(tc.limit)}
			}
			var got []Finding
			for _, f := range Job(job, conditions.ManagedBy) {
				if strings.Contains(f.Field, v1alpha1.AnnotationOOMMemoryRetry) {
					got = append(got, f)
				}
			}
			switch {
			case tc.want == "" && len(got) != 0:
				t.Errorf("findings %v, want none", got)
			case tc.want != "" && (len(got) != 1 || !strings.Contains(got[0].Message, tc.want) || got[0].Severity != tc.wantSev):
				t.Errorf("findings %v, want one %v with %q", got, tc.wantSev, tc.want)
			}
			if Fails(got) != tc.wantFail {
				t.Errorf("Fails = %v, want %v", Fails(got), tc.wantFail)
			}
		})
	}
}
