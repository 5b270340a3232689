package e2e

import (
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	"sigs.k8s.io/yaml"
)

// TestCronJobTemplate: cronJob's YAML is the CronJob it says (it runs without a cluster).
func TestCronJobTemplate(t *testing.T) {
	var cj batchv1.CronJob
	if err := yaml.UnmarshalStrict([]byte(cronJob("forbid", "ns", batchv1.ForbidConcurrent, 65, "successfulJobsHistoryLimit: 1", "backoffLimit: 0")), &cj); err != nil {
		t.Fatal(err)
	}
	js := cj.Spec.JobTemplate.Spec
	if cj.Name != "forbid" || cj.Spec.ConcurrencyPolicy != batchv1.ForbidConcurrent || *cj.Spec.SuccessfulJobsHistoryLimit != 1 ||
		*js.BackoffLimit != 0 || js.Template.Spec.Containers[0].Command[1] != "65" || js.Template.Spec.NodeSelector[hostnameLabel] != quietNode {
		t.Errorf("cronJob: %+v", cj.Spec)
	}
	cj = batchv1.CronJob{}
	if err := yaml.UnmarshalStrict([]byte(cronJob("replace", "ns", batchv1.ReplaceConcurrent, 600, "", "")), &cj); err != nil {
		t.Fatal(err)
	}
	if cj.Spec.ConcurrencyPolicy != batchv1.ReplaceConcurrent || cj.Spec.SuccessfulJobsHistoryLimit != nil || cj.Spec.JobTemplate.Spec.BackoffLimit != nil {
		t.Errorf("cronJob: %+v", cj.Spec)
	}
}
