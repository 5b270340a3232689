package informers

import (
	"fmt"
	"reflect"
	"runtime"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/recovery"
)

var intstrPort = intstr.FromInt32(8080)

// typicalPod is a Deployment's pod as the API server stores it: labels, annotations,
// managedFields, two containers with env, probes and mounts, volumes, a full status.
func typicalPod(i int, annotations map[string]string) *corev1.Pod {
	now := metav1.Now()
	c := corev1.Container{
		Name: "app", Image: "registry.example.com/team/app:v1.2.3",
		Args: []string{"--port=8080", "--log-level=info", "--config=/etc/app/config.yaml"},
		Env: []corev1.EnvVar{{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
			{Name: "MODE", Value: "production"}, {Name: "REGION", Value: "eu-west-1"}},
		Ports:          []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}},
		Resources:      corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")}},
		VolumeMounts:   []corev1.VolumeMount{{Name: "config", MountPath: "/etc/app"}, {Name: "kube-api-access", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true}},
		ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/readyz", Port: intstrPort}}, PeriodSeconds: 10},
		LivenessProbe:  &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstrPort}}, PeriodSeconds: 10},
	}
	sidecar := c
	sidecar.Name, sidecar.Image = "proxy", "registry.example.com/mesh/proxy:v9"
	cs := func(name string) corev1.ContainerStatus {
		return corev1.ContainerStatus{Name: name, Ready: true, Image: c.Image, ImageID: "registry.example.com/team/app@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
			ContainerID: "containerd://0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", Started: ptr.To(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: fmt.Sprintf("app-7d9c8b6f5d-%05d", i), Namespace: "team", UID: types.UID(fmt.Sprintf("uid-%08d-0000-0000-0000-000000000000", i)),
			ResourceVersion: fmt.Sprint(100000 + i), GenerateName: "app-7d9c8b6f5d-", CreationTimestamp: now,
			Labels:      map[string]string{"app": "app", "pod-template-hash": "7d9c8b6f5d", "team": "platform", "version": "v1.2.3"},
			Annotations: annotations,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "app-7d9c8b6f5d",
				UID: "uid-rs", Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}},
			ManagedFields: []metav1.ManagedFieldsEntry{
				{Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", Time: &now, FieldsType: "FieldsV1",
					FieldsV1: metav1.NewFieldsV1(string(make([]byte, 1500)))},
				{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", Time: &now, FieldsType: "FieldsV1", Subresource: "status",
					FieldsV1: metav1.NewFieldsV1(string(make([]byte, 1200)))},
			},
		},
		Spec: corev1.PodSpec{
			NodeName: "node-1", ServiceAccountName: "app", Containers: []corev1.Container{c, sidecar},
			Volumes: []corev1.Volume{{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "app-config"}}}},
				{Name: "kube-api-access", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
					{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr.To[int64](3607)}},
					{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"}, Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}}}}}}},
			Tolerations: []corev1.Toleration{{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To[int64](300)},
				{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To[int64](300)}},
		},
		Status: corev1.PodStatus{
			Phase: corev1.PodRunning, HostIP: "10.0.0.1", PodIP: "10.244.1.17", StartTime: &now, QOSClass: corev1.PodQOSBurstable,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
				{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
				{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
				{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now}},
			ContainerStatuses: []corev1.ContainerStatus{cs("app"), cs("proxy")},
		},
	}
}

// TestStripForRecovery: an opted-in pod keeps what recovery reads, and Decide and Relevant
// answer the same for it; any other pod keeps its identity only; stripping is idempotent.
func TestStripForRecovery(t *testing.T) {
	full := typicalPod(1, map[string]string{conditions.AnnotationKueueSafeToForcefullyTerminate: "true", "other": "x"})
	full.DeletionTimestamp = ptr.To(metav1.Now())
	full.DeletionGracePeriodSeconds = ptr.To[int64](30)
	got, _ := StripForRecovery(full.DeepCopy())
	p := got.(*corev1.Pod)
	if p.Name != full.Name || p.Namespace != full.Namespace || p.UID != full.UID || p.ResourceVersion != full.ResourceVersion ||
		p.Spec.NodeName != full.Spec.NodeName || p.Status.Phase != full.Status.Phase || !reflect.DeepEqual(p.Status.Conditions, full.Status.Conditions) ||
		p.DeletionTimestamp != full.DeletionTimestamp && !p.DeletionTimestamp.Equal(full.DeletionTimestamp) || *p.DeletionGracePeriodSeconds != 30 ||
		!reflect.DeepEqual(p.Annotations, map[string]string{conditions.AnnotationKueueSafeToForcefullyTerminate: "true"}) {
		t.Errorf("stripped opted-in pod lost what recovery reads: %+v", p)
	}
	if len(p.Spec.Containers) != 0 || len(p.ManagedFields) != 0 || len(p.Labels) != 0 || len(p.Status.ContainerStatuses) != 0 {
		t.Errorf("stripped opted-in pod kept more than recovery reads: %+v", p)
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}, Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoExecute}}}}
	for _, ago := range []int{0, 120} {
		in := recovery.Input{Node: node, Now: full.DeletionTimestamp.Add(secs(ago)), OptedInOnly: true}
		in.Pod = full
		want := recovery.Config{}.Decide(in)
		in.Pod = p
		if d := (recovery.Config{}).Decide(in); !reflect.DeepEqual(d, want) {
			t.Errorf("%ds after the deletion: Decide on the stripped pod = %+v, on the whole pod %+v", ago, d, want)
		}
	}
	if recovery.Relevant(p, true) != recovery.Relevant(full, true) {
		t.Error("Relevant differs on the stripped pod")
	}
	again, _ := StripForRecovery(p.DeepCopy())
	if !reflect.DeepEqual(again, p) {
		t.Errorf("not idempotent: %+v, then %+v", p, again)
	}

	other, _ := StripForRecovery(typicalPod(2, map[string]string{conditions.AnnotationSafeToForcefullyDelete: "false"}))
	want := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "app-7d9c8b6f5d-00002", Namespace: "team", UID: "uid-00000002-0000-0000-0000-000000000000", ResourceVersion: "100002"}}
	if !reflect.DeepEqual(other, want) {
		t.Errorf("pod not opted in stripped to %+v, want its identity only", other)
	}
	if tomb, _ := StripForRecovery("not a pod"); tomb != "not a pod" {
		t.Errorf("a non-pod object was changed: %v", tomb)
	}
}

// TestStripForRecoveryMemory measures what the informer of the pods that are not Jobs' pods
// keeps per pod, against the whole pods a plain informer would keep (go test -v prints it).
func TestStripForRecoveryMemory(t *testing.T) {
	measure := func(transform func(*corev1.Pod) any) float64 {
		return heapPerObject(5000, func(i int) any {
			return transform(typicalPod(i, map[string]string{"kubectl.kubernetes.io/restartedAt": "2026-11-01T00:00:00Z"}))
		})
	}
	whole := measure(func(p *corev1.Pod) any { return p })
	stripped := measure(func(p *corev1.Pod) any { s, _ := StripForRecovery(p); return s })
	optedIn := measure(func(p *corev1.Pod) any {
		p.Annotations[conditions.AnnotationSafeToForcefullyDelete] = "true"
		s, _ := StripForRecovery(p)
		return s
	})
	t.Logf("bytes per pod kept: whole %.0f, stripped (not opted in) %.0f, stripped (opted in) %.0f", whole, stripped, optedIn)
	if stripped > whole/5 {
		t.Errorf("a stripped pod keeps %.0f bytes, over a fifth of a whole one (%.0f)", stripped, whole)
	}
}

func secs(n int) time.Duration { return time.Duration(n) * time.Second }

// heapPerObject is the heap, in bytes, that each of n objects made by build keeps alive.
func heapPerObject(n int, build func(i int) any) float64 {
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	keep := make([]any, n)
	before := heap()
	for i := range keep {
		keep[i] = build(i)
	}
	after := heap()
	runtime.KeepAlive(keep)
	return float64(after-before) / float64(n)
}
