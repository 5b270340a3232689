package informers

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/backoff"
	"github.com/coroner-dev/coroner/shim/memretry"
	"github.com/coroner-dev/coroner/shim/policy"
	"github.com/coroner-dev/coroner/shim/record"
	"github.com/coroner-dev/coroner/shim/recovery"
)

// batchPod is an Indexed Job's pod as the API server stores it once its main container
// was OOM-killed at its limit and the agent stamped it: the Job's labels and annotations,
// a service account token volume, env, mounts, a sidecar init container, resources, a
// terminated status with the kubelet's fields (images, IDs, IPs, the status's volume mounts
// and resources).
func batchPod(i int) *corev1.Pod {
	now := metav1.NewTime(time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC))
	later := metav1.NewTime(now.Add(90 * time.Second))
	res := corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("256Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")},
	}
	mounts := []corev1.VolumeMount{{Name: "data", MountPath: "/data"}, {Name: "kube-api-access-x7k2p", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true}}
	main := corev1.Container{Name: "main", Image: "registry.example.com/ml/train:2026.11", Command: []string{"python", "-m", "train"},
		Args: []string{"--epochs=10", "--shard=$(JOB_COMPLETION_INDEX)"}, Resources: res, VolumeMounts: mounts,
		Env: []corev1.EnvVar{{Name: "JOB_COMPLETION_INDEX", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}},
			{Name: "DATASET", Value: "s3://bucket/dataset/v7"}, {Name: "WANDB_PROJECT", Value: "train"}},
		TerminationMessagePath: "/dev/termination-log", TerminationMessagePolicy: corev1.TerminationMessageReadFile, ImagePullPolicy: corev1.PullIfNotPresent}
	sidecar := corev1.Container{Name: "log-shipper", Image: "registry.example.com/obs/shipper:v3", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways),
		Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("32Mi")}}, VolumeMounts: mounts}
	terminated := func(name string, code int32, reason string) corev1.ContainerStatus {
		return corev1.ContainerStatus{Name: name, Image: main.Image, ImageID: "registry.example.com/ml/train@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
			ContainerID: "containerd://0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", Started: ptr.To(false), RestartCount: 0,
			State:        corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Reason: reason, StartedAt: now, FinishedAt: later, ContainerID: "containerd://0123"}},
			VolumeMounts: []corev1.VolumeMountStatus{{Name: "data", MountPath: "/data"}, {Name: "kube-api-access-x7k2p", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true}},
			Resources:    &res, AllocatedResources: res.Requests, User: &corev1.ContainerUser{Linux: &corev1.LinuxContainerUser{UID: 1000, GID: 1000}}}
	}
	ix := fmt.Sprint(i)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: fmt.Sprintf("train-%d-x7k2p", i), GenerateName: fmt.Sprintf("train-%d-", i), Namespace: "ml", UID: types.UID(fmt.Sprintf("uid-%08d-0000-0000-0000-000000000000", i)),
			ResourceVersion: fmt.Sprint(200000 + i), CreationTimestamp: now,
			Labels: map[string]string{batchv1.ControllerUidLabel: "job-uid", batchv1.JobNameLabel: "train", "controller-uid": "job-uid", "job-name": "train",
				batchv1.JobCompletionIndexAnnotation: ix, "team": "ml"},
			Annotations: map[string]string{batchv1.JobCompletionIndexAnnotation: ix, batchv1.JobIndexFailureCountAnnotation: "1",
				conditions.AnnotationSafeToForcefullyDelete: "true"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "train", UID: "job-uid", Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}},
			Finalizers:      []string{batchv1.JobTrackingFinalizer},
			ManagedFields: []metav1.ManagedFieldsEntry{
				{Manager: "coroner-shim", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", Time: &now, FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(string(make([]byte, 1800)))},
				{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", Time: &now, FieldsType: "FieldsV1", Subresource: "status", FieldsV1: metav1.NewFieldsV1(string(make([]byte, 1400)))},
			},
		},
		Spec: corev1.PodSpec{
			NodeName: "node-7", RestartPolicy: corev1.RestartPolicyNever, ServiceAccountName: "default", Hostname: "train-" + ix, Subdomain: "train",
			SchedulerName: corev1.DefaultSchedulerName, PriorityClassName: "batch", Priority: ptr.To[int32](1000), TerminationGracePeriodSeconds: ptr.To[int64](30),
			DNSPolicy: corev1.DNSClusterFirst, EnableServiceLinks: ptr.To(true), PreemptionPolicy: ptr.To(corev1.PreemptLowerPriority),
			Containers: []corev1.Container{main}, InitContainers: []corev1.Container{sidecar},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
				{Name: "kube-api-access-x7k2p", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{DefaultMode: ptr.To[int32](420), Sources: []corev1.VolumeProjection{
					{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr.To[int64](3607)}},
					{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"}, Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
					{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{{Path: "namespace", FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"}}}}}}}}}},
			Tolerations: []corev1.Toleration{{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To[int64](300)},
				{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To[int64](300)}},
		},
		Status: corev1.PodStatus{
			Phase: corev1.PodFailed, HostIP: "10.0.0.7", HostIPs: []corev1.HostIP{{IP: "10.0.0.7"}}, PodIP: "10.244.7.31", PodIPs: []corev1.PodIP{{IP: "10.244.7.31"}},
			StartTime: &now, QOSClass: corev1.PodQOSBurstable,
			Conditions: []corev1.PodCondition{
				{Type: conditions.OOMKilled, Status: corev1.ConditionTrue, Reason: "ContainerLimit", Message: "container main was killed at its memory limit of 256Mi", LastTransitionTime: later},
				{Type: corev1.PodReady, Status: corev1.ConditionFalse, Reason: "PodFailed", LastTransitionTime: later},
				{Type: corev1.ContainersReady, Status: corev1.ConditionFalse, Reason: "PodFailed", LastTransitionTime: later},
				{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
				{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now}},
			ContainerStatuses:     []corev1.ContainerStatus{terminated("main", 137, "OOMKilled")},
			InitContainerStatuses: []corev1.ContainerStatus{terminated("log-shipper", 0, "Completed")},
		},
	}
}

// TestStripJobPod: every decision the shim takes from a Job's pod is the same on the
// stripped pod as on the whole one; the fields kept are the ones listed; stripping is
// idempotent.
func TestStripJobPod(t *testing.T) {
	full := batchPod(3)
	out, err := StripJobPod(full.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	p := out.(*corev1.Pod)

	if got, want := conditions.CauseOfDeath(p), conditions.CauseOfDeath(full); !reflect.DeepEqual(got, want) {
		t.Errorf("CauseOfDeath: stripped %+v, whole %+v", got, want)
	}
	if got, want := backoff.FinishTime(p), backoff.FinishTime(full); !got.Equal(want) {
		t.Errorf("FinishTime: stripped %v, whole %v", got, want)
	}
	if got, want := v1alpha1.MemoryOf(p), v1alpha1.MemoryOf(full); !reflect.DeepEqual(got, want) {
		t.Errorf("MemoryOf: stripped %v, whole %v", got, want)
	}
	spec := v1alpha1.MemoryRetry{Factor: 2, Max: resource.MustParse("1Gi")}
	g1, ok1 := memretry.Decide(spec, p)
	g2, ok2 := memretry.Decide(spec, full)
	if !reflect.DeepEqual(g1, g2) || ok1 != ok2 {
		t.Errorf("memretry.Decide: stripped %v %v, whole %v %v", g1, ok1, g2, ok2)
	}
	pfp := &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{
		{Action: batchv1.PodFailurePolicyActionIgnore, OnPodConditions: []batchv1.PodFailurePolicyOnPodConditionsPattern{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue}}},
		{Action: batchv1.PodFailurePolicyActionFailIndex, OnExitCodes: &batchv1.PodFailurePolicyOnExitCodesRequirement{ContainerName: ptr.To("main"), Operator: batchv1.PodFailurePolicyOnExitCodesOpIn, Values: []int32{137}}},
	}}
	if got, want := policy.Match(pfp, p), policy.Match(pfp, full); !reflect.DeepEqual(got, want) {
		t.Errorf("policy.Match: stripped %+v, whole %+v", got, want)
	}
	now := metav1.NewTime(time.Date(2026, 11, 27, 12, 5, 0, 0, time.UTC))
	d := record.Decision{Outcome: v1alpha1.OutcomeFailed, Why: "test"}
	if got, want := record.Of(p, d, now), record.Of(full, d, now); !reflect.DeepEqual(got, want) {
		t.Errorf("record.Of: stripped %+v, whole %+v", got, want)
	}
	deleting := func(q *corev1.Pod) *corev1.Pod {
		q = q.DeepCopy()
		q.Status.Phase = corev1.PodRunning
		q.DeletionTimestamp = &now
		return q
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-7"}, Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoExecute}}}}
	for _, ago := range []int{0, 120} {
		in := recovery.Input{Node: node, Now: now.Add(secs(ago)), OptedInOnly: true, Pod: deleting(full)}
		want := recovery.Config{}.Decide(in)
		in.Pod = deleting(p)
		if got := (recovery.Config{}).Decide(in); !reflect.DeepEqual(got, want) {
			t.Errorf("%ds after the deletion: recovery.Decide on the stripped pod = %+v, on the whole pod %+v", ago, got, want)
		}
	}

	// A pod-level memory limit (spec.resources), the container without one.
	podLevel := full.DeepCopy()
	podLevel.Spec.Containers[0].Resources = corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}}
	podLevel.Spec.Resources = &corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("512Mi"), corev1.ResourceCPU: resource.MustParse("2")}}
	pl, _ := StripJobPod(podLevel.DeepCopy())
	g1, ok1 = memretry.Decide(spec, pl.(*corev1.Pod))
	g2, ok2 = memretry.Decide(spec, podLevel)
	if !reflect.DeepEqual(g1, g2) || ok1 != ok2 || !ok1 {
		t.Errorf("memretry.Decide, pod-level limit: stripped %v %v, whole %v %v", g1, ok1, g2, ok2)
	}
	if got, want := v1alpha1.MemoryOf(pl.(*corev1.Pod)), v1alpha1.MemoryOf(podLevel); !reflect.DeepEqual(got, want) {
		t.Errorf("MemoryOf, pod-level limit: stripped %v, whole %v", got, want)
	}
	// A running pod keeps no resources.
	running := full.DeepCopy()
	running.Status.Phase = corev1.PodRunning
	rp, _ := StripJobPod(running)
	if r := rp.(*corev1.Pod).Spec.Containers[0].Resources; r.Limits != nil || r.Requests != nil {
		t.Errorf("a running pod kept its resources: %v", r)
	}

	// What is kept, and nothing more.
	if !reflect.DeepEqual(p.ObjectMeta, func() metav1.ObjectMeta { m := *full.ObjectMeta.DeepCopy(); m.ManagedFields = nil; return m }()) {
		t.Errorf("metadata: %+v, want the whole metadata but managedFields", p.ObjectMeta)
	}
	wantSpec := corev1.PodSpec{NodeName: "node-7", RestartPolicy: corev1.RestartPolicyNever,
		Containers:     []corev1.Container{{Name: "main", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")}}}},
		InitContainers: []corev1.Container{{Name: "log-shipper", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways)}}}
	if !reflect.DeepEqual(p.Spec, wantSpec) {
		t.Errorf("spec: %+v, want %+v", p.Spec, wantSpec)
	}
	st := full.Status.ContainerStatuses[0]
	wantStatus := corev1.ContainerStatus{Name: "main", State: st.State, Started: st.Started}
	if len(p.Status.ContainerStatuses) != 1 || !reflect.DeepEqual(p.Status.ContainerStatuses[0], wantStatus) ||
		p.Status.PodIP != "" || p.Status.HostIP != "" || p.Status.QOSClass != "" || !reflect.DeepEqual(p.Status.Conditions, full.Status.Conditions) {
		t.Errorf("status: %+v, want phase, reason, message, conditions, start time and slim container statuses", p.Status)
	}
	again, _ := StripJobPod(p.DeepCopy())
	if !reflect.DeepEqual(again, p) {
		t.Errorf("not idempotent: %+v, then %+v", p, again)
	}
	if tomb, _ := StripJobPod("not a pod"); tomb != "not a pod" {
		t.Errorf("a non-pod object was changed: %v", tomb)
	}
}

// TestStripJobPodMemory measures what the informer of the Jobs' pods keeps per pod with
// StripJobPod, against managedFields dropped only (go test -v prints it).
func TestStripJobPodMemory(t *testing.T) {
	measure := func(transform func(any) (any, error)) float64 {
		return heapPerObject(5000, func(i int) any { o, _ := transform(batchPod(i)); return o })
	}
	succeeded := func(transform func(any) (any, error)) func(any) (any, error) {
		return func(o any) (any, error) {
			p := o.(*corev1.Pod)
			p.Status.Phase = corev1.PodSucceeded
			p.Status.Conditions = p.Status.Conditions[1:]
			p.Status.ContainerStatuses[0].State.Terminated.ExitCode = 0
			p.Status.ContainerStatuses[0].State.Terminated.Reason = "Completed"
			return transform(p)
		}
	}
	for _, c := range []struct {
		what string
		max  float64
		wrap func(func(any) (any, error)) func(any) (any, error)
	}{
		{"failed (OOM-killed)", 0.7, func(f func(any) (any, error)) func(any) (any, error) { return f }},
		{"succeeded", 0.6, succeeded},
	} {
		unmanaged := measure(c.wrap(stripManagedFields))
		stripped := measure(c.wrap(StripJobPod))
		t.Logf("bytes per %s Job pod kept: managedFields dropped %.0f, StripJobPod %.0f (%.2fx)", c.what, unmanaged, stripped, stripped/unmanaged)
		if stripped > unmanaged*c.max {
			t.Errorf("a stripped %s Job pod keeps %.0f bytes, over %.1f of the pod without managedFields (%.0f)", c.what, stripped, c.max, unmanaged)
		}
	}
}

// TestStripJobPodKeepsDevices: of a failed pod that held devices, the stripped pod holds
// the same devices and waits for the same device verdict; a running one keeps none.
func TestStripJobPodKeepsDevices(t *testing.T) {
	full := batchPod(1)
	gpu := corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}
	full.Spec.Containers[0].Resources.Limits["nvidia.com/gpu"] = gpu["nvidia.com/gpu"]
	full.Spec.Containers[0].Resources.Requests["nvidia.com/gpu"] = gpu["nvidia.com/gpu"]
	full.Spec.InitContainers[0].Resources.Requests["example.com/fpga"] = resource.MustParse("1")
	full.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "nic", ResourceClaimTemplateName: ptr.To("rdma")}}
	full.Status.Conditions = full.Status.Conditions[1:] // no OOM stamp
	full.Status.ContainerStatuses[0].State.Terminated.ExitCode, full.Status.ContainerStatuses[0].State.Terminated.Reason = 1, "Error"
	full.Status.ContainerStatuses[0].AllocatedResourcesStatus = []corev1.ResourceStatus{{Name: "nvidia.com/gpu",
		Resources: []corev1.ResourceHealth{{ResourceID: "GPU-1", Health: corev1.ResourceHealthStatusUnhealthy}}}}
	out, _ := StripJobPod(full.DeepCopy())
	p := out.(*corev1.Pod)
	if got, want := conditions.DeviceResources(p), conditions.DeviceResources(full); !reflect.DeepEqual(got, want) || len(want) != 3 {
		t.Errorf("DeviceResources: stripped %v, whole %v", got, want)
	}
	pfp := &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{{Action: batchv1.PodFailurePolicyActionIgnore,
		OnPodConditions: []batchv1.PodFailurePolicyOnPodConditionsPattern{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue}}}}}
	d1, ok1 := policy.AwaitsDeviceVerdict(pfp, p)
	d2, ok2 := policy.AwaitsDeviceVerdict(pfp, full)
	if d1 != d2 || ok1 != ok2 || !ok1 {
		t.Errorf("AwaitsDeviceVerdict: stripped %+v %v, whole %+v %v", d1, ok1, d2, ok2)
	}
	v := conditions.DeviceVerdict{Failed: true}
	if got, want := v.FailedResource(p), v.FailedResource(full); got != want || got != "nvidia.com/gpu" {
		t.Errorf("FailedResource: stripped %q, whole %q", got, want)
	}
	if r := p.Spec.Containers[0].Resources; r.Requests.Cpu().Value() != 0 || len(r.Requests) != 1 {
		t.Errorf("kept requests %v, want the GPU alone", r.Requests)
	}
	running := full.DeepCopy()
	running.Status.Phase = corev1.PodRunning
	rp, _ := StripJobPod(running)
	if q := rp.(*corev1.Pod); len(conditions.DeviceResources(q)) != 0 || q.Status.ContainerStatuses[0].AllocatedResourcesStatus != nil {
		t.Errorf("a running pod kept its devices: %v", conditions.DeviceResources(q))
	}
	again, _ := StripJobPod(p.DeepCopy())
	if !reflect.DeepEqual(again, p) {
		t.Errorf("not idempotent: %+v, then %+v", p, again)
	}
}
