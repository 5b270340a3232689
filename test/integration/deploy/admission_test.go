package deploy_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/test/harness"
	"github.com/coroner-dev/coroner/test/wrappers"
)

// nodeNameKey is the user extra the API server derives from the node claim of a
// service account token bound to a pod (ServiceAccountTokenPodNodeInfo, GA in 1.32).
const nodeNameKey = "authentication.kubernetes.io/node-name"

// TestAdmissionPolicyKeepsTheAgentToItsNode uses real service account tokens: the agent's
// token bound to its pod on node-a, as the kubelet projects it into a DaemonSet pod, and
// checks what the policy lets it write.
func TestAdmissionPolicyKeepsTheAgentToItsNode(t *testing.T) {
	env := deployed(t)
	ctx := context.Background()
	admin := kubernetes.NewForConfigOrDie(env.Config)
	ns := env.Namespace(t)

	for _, n := range []string{"node-a", "node-b"} {
		if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	// The agent's pod on node-a, as its DaemonSet would make it.
	agentPod := createPod(t, admin, namespace, "coroner-agent-node-a", "node-a", "coroner-agent")
	token := tokenFor(t, admin, "coroner-agent", agentPod)
	unbound := tokenFor(t, admin, "coroner-agent", nil)

	// Finding: the claim is there in v1.36.3, and the API server turns it into the user
	// extra the policy reads.
	claims := jwtClaims(t, token)
	if claims.Kubernetes.Node == nil || claims.Kubernetes.Node.Name != "node-a" || claims.Kubernetes.Node.UID == "" {
		t.Fatalf("the pod-bound token has no node claim: %+v", claims.Kubernetes)
	}
	agent := kubernetes.NewForConfigOrDie(tokenConfig(env, token))
	review, err := agent.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ui := review.Status.UserInfo
	if ui.Username != "system:serviceaccount:coroner-system:coroner-agent" || len(ui.Extra[nodeNameKey]) != 1 || ui.Extra[nodeNameKey][0] != "node-a" {
		t.Fatalf("the agent is %q with extra %v; want coroner-system's coroner-agent with %s=[node-a]", ui.Username, ui.Extra, nodeNameKey)
	}
	t.Logf("agent token: node claim %+v, user extra %v", *claims.Kubernetes.Node, ui.Extra)

	workA := createPod(t, admin, ns, "work-a", "node-a", "")
	workB := createPod(t, admin, ns, "work-b", "node-b", "")
	unscheduled := createPod(t, admin, ns, "work-none", "", "")

	pods := agent.CoreV1().Pods(ns)
	stamp := []byte(`{"status":{"conditions":[{"type":"coroner.dev/OOMKilled","status":"True","reason":"MemoryLimitExceeded"}]}}`)
	ownNode := fmt.Sprintf("ValidatingAdmissionPolicy '%s'", policyName)

	// The policy is enforced once the API server's admission plugin has seen it.
	err = eventually(30*time.Second, func() error {
		_, err := pods.Patch(ctx, workB.Name, types.StrategicMergePatchType, stamp, metav1.PatchOptions{}, "status")
		if isForbiddenBy(err, ownNode) {
			return nil
		}
		return fmt.Errorf("patching a pod on node-b as node-a's agent: %v", err)
	})
	if err != nil {
		t.Fatalf("the policy is not enforced: %v", err)
	}

	exitHistory := func(v string) []byte {
		return []byte(fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, conditions.AnnotationExitHistory, v))
	}

	t.Run("status of a pod on its own node", func(t *testing.T) {
		p, err := pods.Patch(ctx, workA.Name, types.StrategicMergePatchType, stamp, metav1.PatchOptions{}, "status")
		wantAllowed(t, err)
		if err == nil && !conditions.IsTrue(&p.Status, conditions.OOMKilled) {
			t.Errorf("the stamp was not stored: %+v", p.Status.Conditions)
		}
	})
	t.Run("status of a pod on another node", func(t *testing.T) {
		_, err := pods.Patch(ctx, workB.Name, types.StrategicMergePatchType, stamp, metav1.PatchOptions{}, "status")
		wantDenied(t, err, ownNode, "coroner-agent on node node-a may only write pods bound to its own node; pod "+ns+"/work-b is on node node-b")
	})
	t.Run("status of an unscheduled pod", func(t *testing.T) {
		_, err := pods.Patch(ctx, unscheduled.Name, types.StrategicMergePatchType, stamp, metav1.PatchOptions{}, "status")
		wantDenied(t, err, ownNode, "pod "+ns+"/work-none is not bound to a node")
	})
	t.Run("exit history on a pod of its own node", func(t *testing.T) {
		// The status subresource of a pod stores metadata (labels, annotations,
		// finalizers) too, so the agent writes its exit history there and needs no patch
		// on pods; the policy holds pods/status to the metadata rule below.
		p, err := pods.Patch(ctx, workA.Name, types.MergePatchType, exitHistory(`[{"container":"main","exitCode":2}]`), metav1.PatchOptions{}, "status")
		wantAllowed(t, err)
		if err == nil && !strings.Contains(p.Annotations[conditions.AnnotationExitHistory], `"exitCode":2`) {
			t.Errorf("pods/status did not store the annotation: %v", p.Annotations)
		}
	})
	t.Run("exit history on a pod of another node", func(t *testing.T) {
		_, err := pods.Patch(ctx, workB.Name, types.MergePatchType, exitHistory("[]"), metav1.PatchOptions{}, "status")
		wantDenied(t, err, ownNode, "is on node node-b")
	})
	t.Run("the pod itself is not granted", func(t *testing.T) {
		_, err := pods.Patch(ctx, workA.Name, types.MergePatchType, exitHistory("[]"), metav1.PatchOptions{})
		wantDenied(t, err, `cannot patch resource "pods"`)
		_, err = pods.Patch(ctx, workA.Name, types.MergePatchType, []byte(`{"spec":{"activeDeadlineSeconds":5}}`), metav1.PatchOptions{})
		wantDenied(t, err, `cannot patch resource "pods"`)
	})
	for _, tc := range []struct {
		name, patch, want string
	}{
		{"another annotation", `{"metadata":{"annotations":{"example.com/x":"y"}}}`, "may change no label, finalizer or annotation of a pod except coroner.dev/exit-history"},
		{"a label", `{"metadata":{"labels":{"app":"x"}}}`, "may change no label"},
		{"a finalizer", `{"metadata":{"finalizers":["example.com/hold"]}}`, "may change no label, finalizer"},
	} {
		t.Run(tc.name+" through pods/status on its own node", func(t *testing.T) {
			_, err := pods.Patch(ctx, workA.Name, types.MergePatchType, []byte(tc.patch), metav1.PatchOptions{}, "status")
			wantDenied(t, err, ownNode, tc.want)
		})
	}
	t.Run("delete and create are not granted", func(t *testing.T) {
		err := pods.Delete(ctx, workA.Name, metav1.DeleteOptions{})
		wantDenied(t, err, `cannot delete resource "pods"`)
		_, err = pods.Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "x"}, Spec: workA.Spec}, metav1.CreateOptions{})
		wantDenied(t, err, `cannot create resource "pods"`)
	})
	t.Run("list its node's pods", func(t *testing.T) {
		list, err := agent.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=node-a"})
		wantAllowed(t, err)
		if err == nil && len(list.Items) < 2 {
			t.Errorf("listed %d pods on node-a, want the agent's and work-a", len(list.Items))
		}
	})
	t.Run("its own Lease only", func(t *testing.T) {
		leases := agent.CoordinationV1().Leases(namespace)
		own := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "coroner-agent-node-a"}, Spec: coordinationv1.LeaseSpec{HolderIdentity: ptrTo("node-a")}}
		l, err := leases.Create(ctx, own, metav1.CreateOptions{})
		wantAllowed(t, err)
		if err == nil {
			l.Spec.LeaseDurationSeconds = ptrTo[int32](40)
			_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
			wantAllowed(t, err)
		}
		other := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "coroner-agent-node-b"}}
		_, err = leases.Create(ctx, other, metav1.CreateOptions{})
		wantDenied(t, err, ownNode, "may only write its own Lease coroner-agent-node-a, not coroner-agent-node-b")
		_, err = agent.CoordinationV1().Leases(ns).Create(ctx, own, metav1.CreateOptions{})
		wantDenied(t, err, `cannot create resource "leases"`)
	})
	t.Run("a token without the node claim writes nothing", func(t *testing.T) {
		c := kubernetes.NewForConfigOrDie(tokenConfig(env, unbound))
		_, err := c.CoreV1().Pods(ns).Patch(ctx, workA.Name, types.StrategicMergePatchType, stamp, metav1.PatchOptions{}, "status")
		wantDenied(t, err, ownNode, "this token has no authentication.kubernetes.io/node-name claim")
	})
	t.Run("the shim and admins are not held by it", func(t *testing.T) {
		// The shim's own policy lets it write the status of an opted-in pod only.
		_, err := admin.CoreV1().Pods(ns).Patch(ctx, workB.Name, types.MergePatchType, []byte(fmt.Sprintf(`{"metadata":{"annotations":{%q:"true"}}}`, conditions.AnnotationSafeToForcefullyDelete)), metav1.PatchOptions{})
		wantAllowed(t, err)
		shim := kubernetes.NewForConfigOrDie(tokenConfig(env, tokenFor(t, admin, "coroner-shim", nil)))
		_, err = shim.CoreV1().Pods(ns).Patch(ctx, workB.Name, types.StrategicMergePatchType, stamp, metav1.PatchOptions{}, "status")
		wantAllowed(t, err)
		_, err = admin.CoreV1().Pods(ns).Patch(ctx, workB.Name, types.MergePatchType, []byte(`{"metadata":{"labels":{"app":"x"}}}`), metav1.PatchOptions{})
		wantAllowed(t, err)
	})
}

// TestAdmissionPolicyKeepsTheShimToItsJobs uses a real token of the shim (a TokenRequest
// bound to a pod of its ServiceAccount, as the kubelet projects it into the Deployment's
// pods) and checks that the policy lets it make the writes its controller makes (with the
// controller's own writers and patches where they are exported) and none of the others
// its ClusterRole grants.
func TestAdmissionPolicyKeepsTheShimToItsJobs(t *testing.T) {
	env := deployed(t)
	ctx := context.Background()
	admin := kubernetes.NewForConfigOrDie(env.Config)
	ns := env.Namespace(t)

	shimPod := createPod(t, admin, namespace, "coroner-shim-test", "", "coroner-shim")
	shim := kubernetes.NewForConfigOrDie(tokenConfig(env, tokenFor(t, admin, "coroner-shim", shimPod)))
	review, err := shim.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if u := review.Status.UserInfo.Username; u != "system:serviceaccount:coroner-system:coroner-shim" {
		t.Fatalf("the shim is %q; want coroner-system's coroner-shim", u)
	}

	var managed *batchv1.Job
	for _, j := range []*batchv1.Job{
		wrappers.MakeJob("managed", ns).ManagedBy(conditions.ManagedBy).Suspend(true).Obj(),
		wrappers.MakeJob("builtin", ns).Suspend(true).Obj(),
		wrappers.MakeJob("other", ns).ManagedBy("example.com/other").Suspend(true).Obj(),
	} {
		created, err := admin.BatchV1().Jobs(ns).Create(ctx, j, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if created.Name == "managed" {
			managed = created
		}
	}
	jobPod := mustCreatePod(t, admin, wrappers.MakePod("managed-0", ns).ControlledBy(managed).Finalizer(conditions.JobTrackingFinalizer).Obj())
	bare := mustCreatePod(t, admin, wrappers.MakePod("bare", ns).Obj())
	optedIn := mustCreatePod(t, admin, wrappers.MakePod("opted-in", ns).Annotation(conditions.AnnotationKueueSafeToForcefullyTerminate, "true").Obj())
	saysYes := mustCreatePod(t, admin, wrappers.MakePod("says-yes", ns).Annotation(conditions.AnnotationSafeToForcefullyDelete, "yes").Obj())

	jobs := shim.BatchV1().Jobs(ns)
	pods := shim.CoreV1().Pods(ns)
	patcher := conditions.NewPodPatcher(shim, "coroner-shim")
	ownJobs := fmt.Sprintf("ValidatingAdmissionPolicy '%s'", shimPolicyName)
	dry := metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}}
	dryDelete := metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}
	failed := []byte(`{"status":{"failed":1}}`)
	// The shim's patch (shim/controller removeTrackingFinalizerPatch).
	removeTracking := []byte(fmt.Sprintf(`{"metadata":{"$deleteFromPrimitiveList/finalizers":[%q]}}`, conditions.JobTrackingFinalizer))
	unreachable := corev1.PodCondition{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: conditions.ReasonNodeUnreachable, Message: "written with the shim's token"}

	// The policy is enforced once the API server's admission plugin has seen it.
	err = eventually(30*time.Second, func() error {
		_, err := jobs.Patch(ctx, "builtin", types.MergePatchType, failed, dry, "status")
		if isForbiddenBy(err, ownJobs) {
			return nil
		}
		return fmt.Errorf("patching the status of a Job without managedBy as the shim: %v", err)
	})
	if err != nil {
		t.Fatalf("the policy is not enforced: %v", err)
	}

	t.Run("status of a Job it manages", func(t *testing.T) {
		j := managed.DeepCopy()
		j.Status.Failed = 1
		got, err := jobs.UpdateStatus(ctx, j, metav1.UpdateOptions{})
		wantAllowed(t, err)
		if err == nil && got.Status.Failed != 1 {
			t.Errorf("the status was not stored: %+v", got.Status)
		}
	})
	t.Run("status of a Job without managedBy", func(t *testing.T) {
		_, err := jobs.Patch(ctx, "builtin", types.MergePatchType, failed, metav1.PatchOptions{}, "status")
		wantDenied(t, err, ownJobs, "coroner-shim may only write the status of Jobs with spec.managedBy coroner.dev/shim; Job "+ns+"/builtin has no spec.managedBy")
	})
	t.Run("status of a Job managed by another controller", func(t *testing.T) {
		_, err := jobs.Patch(ctx, "other", types.MergePatchType, failed, metav1.PatchOptions{}, "status")
		wantDenied(t, err, ownJobs, "Job "+ns+"/other has spec.managedBy example.com/other")
	})

	t.Run("create, delete and release a pod of a Job it manages", func(t *testing.T) {
		pod := wrappers.MakePod("", ns).ControlledBy(managed).Finalizer(conditions.JobTrackingFinalizer).Obj()
		pod.GenerateName = managed.Name + "-"
		p, err := pods.Create(ctx, pod, metav1.CreateOptions{})
		wantAllowed(t, err)
		if err != nil {
			return
		}
		removeAtEnd(t, admin, ns, p.Name)
		wantAllowed(t, pods.Delete(ctx, p.Name, metav1.DeleteOptions{}))
		_, err = pods.Patch(ctx, p.Name, types.StrategicMergePatchType, removeTracking, metav1.PatchOptions{})
		wantAllowed(t, err)
		if _, err := admin.CoreV1().Pods(ns).Get(ctx, p.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("the pod is still there once deleted and released: %v", err)
		}
	})
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want string
	}{
		{"a bare pod", wrappers.MakePod("shim-made", ns).Obj(), "pod " + ns + "/shim-made has none"},
		{"a bare pod in kube-system", wrappers.MakePod("shim-made", "kube-system").Obj(), "pod kube-system/shim-made has none"},
		{"a pod owned but not controlled by a Job", func() *corev1.Pod {
			p := wrappers.MakePod("shim-made", ns).ControlledBy(managed).Obj()
			p.OwnerReferences[0].Controller = nil
			return p
		}(), "pod " + ns + "/shim-made has none"},
		{"a pod controlled by a ReplicaSet", func() *corev1.Pod {
			p := wrappers.MakePod("shim-made", ns).Obj()
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "rs", UID: "1234", Controller: ptrTo(true)}}
			return p
		}(), "pod " + ns + "/shim-made has none"},
	} {
		t.Run("create "+tc.name, func(t *testing.T) {
			_, err := shim.CoreV1().Pods(tc.pod.Namespace).Create(ctx, tc.pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			wantDenied(t, err, ownJobs, "coroner-shim may only create pods controlled by a Job", tc.want)
		})
	}

	t.Run("status of a pod of a Job", func(t *testing.T) {
		_, err := conditions.EnsurePodCondition(ctx, patcher, jobPod, unreachable, metav1.Now)
		wantAllowed(t, err)
	})
	t.Run("release a pod of a Job", func(t *testing.T) {
		p, err := pods.Patch(ctx, jobPod.Name, types.StrategicMergePatchType, removeTracking, metav1.PatchOptions{})
		wantAllowed(t, err)
		if err == nil && len(p.Finalizers) != 0 {
			t.Errorf("finalizers %q left", p.Finalizers)
		}
	})
	// From here on jobPod has no finalizer.
	managedLabel := fmt.Sprintf(`{"metadata":{"labels":{%q:"true"}}}`, conditions.ManagedPodLabel)
	t.Run("label a pod of a Job managed", func(t *testing.T) {
		p, err := pods.Patch(ctx, jobPod.Name, types.StrategicMergePatchType, []byte(managedLabel), metav1.PatchOptions{})
		wantAllowed(t, err)
		if err == nil && p.Labels[conditions.ManagedPodLabel] != "true" {
			t.Errorf("labels %v after the patch", p.Labels)
		}
	})
	patchDenied := "coroner-shim may patch a pod only to remove the finalizer batch.kubernetes.io/job-tracking (labelling a finished pod coroner.dev/counted=true, or writing coroner.dev/disruption-budget-verdict on a failed one), to adopt an orphan"
	// The shim's patch of a counted pod (shim/controller countedPatch) and its variations.
	counted := func(labels string) string {
		return fmt.Sprintf(`{"metadata":{"$deleteFromPrimitiveList/finalizers":[%q],"labels":{%s}}}`, conditions.JobTrackingFinalizer, labels)
	}
	countedLabel := fmt.Sprintf("%q:%q", conditions.CountedLabel, "true")
	otherRef := fmt.Sprintf(`{"apiVersion":"batch/v1","kind":"Job","name":"other","uid":"%s","controller":true}`, "0c5e6e4e-0000-4000-8000-000000000001")
	for _, tc := range []struct {
		name, patch string
	}{
		{"adding a label", `{"metadata":{"labels":{"app":"x"}}}`},
		{"adding an annotation", `{"metadata":{"annotations":{"example.com/x":"y"}}}`},
		{"adding a finalizer", `{"metadata":{"finalizers":["example.com/hold"]}}`},
		{"releasing it and adding a label", fmt.Sprintf(`{"metadata":{"$deleteFromPrimitiveList/finalizers":[%q],"labels":{"app":"x"}}}`, conditions.JobTrackingFinalizer)},
		{"taking its owner reference off and adding a label", `{"metadata":{"ownerReferences":null,"labels":{"app":"x"}}}`},
		{"taking its owner reference off and adding a finalizer", `{"metadata":{"ownerReferences":null,"finalizers":["example.com/hold"]}}`},
		{"giving it to another Job", `{"metadata":{"ownerReferences":[{"$patch":"replace"},` + otherRef + `]}}`},
		{"changing its spec", `{"spec":{"activeDeadlineSeconds":5}}`},
		{"labelling it counted while it has not finished", counted(countedLabel)},
		{"labelling it managed with another value", fmt.Sprintf(`{"metadata":{"labels":{%q:"yes"}}}`, conditions.ManagedPodLabel)},
		{"labelling it managed and adding a label", fmt.Sprintf(`{"metadata":{"labels":{%q:"true","app":"x"}}}`, conditions.ManagedPodLabel)},
		{"labelling it managed and adding a finalizer", fmt.Sprintf(`{"metadata":{"labels":{%q:"true"},"finalizers":["example.com/hold"]}}`, conditions.ManagedPodLabel)},
	} {
		t.Run("patch a pod of a Job "+tc.name, func(t *testing.T) {
			_, err := pods.Patch(ctx, jobPod.Name, types.StrategicMergePatchType, []byte(tc.patch), dry)
			wantDenied(t, err, ownJobs, patchDenied, "changing nothing else; pod "+ns+"/managed-0")
		})
	}

	t.Run("label a finished pod of a Job counted as its finalizer goes", func(t *testing.T) {
		done := mustCreatePod(t, admin, wrappers.MakePod("managed-done", ns).ControlledBy(managed).Label("app", "a").Finalizer(conditions.JobTrackingFinalizer).Obj())
		done.Status.Phase = corev1.PodSucceeded
		if _, err := admin.CoreV1().Pods(ns).UpdateStatus(ctx, done, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct{ name, patch string }{
			{"with another value", counted(fmt.Sprintf("%q:%q", conditions.CountedLabel, "yes"))},
			{"and another label", counted(countedLabel + `,"app":"b"`)},
			{"and an annotation", fmt.Sprintf(`{"metadata":{"$deleteFromPrimitiveList/finalizers":[%q],"labels":{%s},"annotations":{"example.com/x":"y"}}}`, conditions.JobTrackingFinalizer, countedLabel)},
			{"and a finalizer", fmt.Sprintf(`{"metadata":{"finalizers":["example.com/hold"],"labels":{%s}}}`, countedLabel)},
		} {
			_, err := pods.Patch(ctx, done.Name, types.StrategicMergePatchType, []byte(tc.patch), dry)
			wantDenied(t, err, ownJobs, patchDenied, "pod "+ns+"/managed-done")
		}
		p, err := pods.Patch(ctx, done.Name, types.StrategicMergePatchType, []byte(counted(countedLabel)), metav1.PatchOptions{})
		wantAllowed(t, err)
		if err == nil && (len(p.Finalizers) != 0 || p.Labels[conditions.CountedLabel] != "true" || p.Labels["app"] != "a") {
			t.Errorf("counted pod has finalizers %q and labels %v", p.Finalizers, p.Labels)
		}
	})

	t.Run("write the disruption budget's verdict on a failed pod of a Job as its finalizer goes", func(t *testing.T) {
		// shim/controller's budgetVerdictPatch and its variations.
		verdict := func(annotations string) string {
			return fmt.Sprintf(`{"metadata":{"$deleteFromPrimitiveList/finalizers":[%q],"annotations":{%s}}}`, conditions.JobTrackingFinalizer, annotations)
		}
		spent := fmt.Sprintf("%q:%q", v1alpha1.AnnotationBudgetVerdict, "spent device")
		live := mustCreatePod(t, admin, wrappers.MakePod("managed-live", ns).ControlledBy(managed).Annotation("a", "1").Finalizer(conditions.JobTrackingFinalizer).Obj())
		_, err := pods.Patch(ctx, live.Name, types.StrategicMergePatchType, []byte(verdict(spent)), dry)
		wantDenied(t, err, ownJobs, patchDenied, "pod "+ns+"/managed-live")
		lost := mustCreatePod(t, admin, wrappers.MakePod("managed-lost", ns).ControlledBy(managed).Annotation("a", "1").Finalizer(conditions.JobTrackingFinalizer).Obj())
		lost.Status.Phase = corev1.PodFailed
		if _, err := admin.CoreV1().Pods(ns).UpdateStatus(ctx, lost, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct{ name, patch string }{
			{"and another annotation", verdict(spent + `,"example.com/x":"y"`)},
			{"changing another annotation", verdict(spent + `,"a":"2"`)},
			{"removing another annotation", verdict(spent + `,"a":null`)},
			{"and a label", fmt.Sprintf(`{"metadata":{"$deleteFromPrimitiveList/finalizers":[%q],"labels":{"app":"x"},"annotations":{%s}}}`, conditions.JobTrackingFinalizer, spent)},
			{"empty", verdict(fmt.Sprintf("%q:%q", v1alpha1.AnnotationBudgetVerdict, ""))},
		} {
			_, err := pods.Patch(ctx, lost.Name, types.StrategicMergePatchType, []byte(tc.patch), dry)
			wantDenied(t, err, ownJobs, patchDenied, "pod "+ns+"/managed-lost")
		}
		p, err := pods.Patch(ctx, lost.Name, types.StrategicMergePatchType, []byte(verdict(spent)), metav1.PatchOptions{})
		wantAllowed(t, err)
		if err == nil && (len(p.Finalizers) != 0 || p.Annotations[v1alpha1.AnnotationBudgetVerdict] != "spent device" || p.Annotations["a"] != "1") {
			t.Errorf("pod has finalizers %q and annotations %v", p.Finalizers, p.Annotations)
		}
	})

	// Adoption and release as shim/controller patches (claim.go): an orphan whose
	// controller-uid label is the Job's UID gets the Job's controller reference and the
	// tracking finalizer; a pod loses them again.
	controllerRef := func(j *batchv1.Job) string {
		return fmt.Sprintf(`{"apiVersion":"batch/v1","kind":"Job","name":%q,"uid":%q,"controller":true,"blockOwnerDeletion":true}`, j.Name, j.UID)
	}
	adopt := func(j *batchv1.Job, extra string) []byte {
		return []byte(fmt.Sprintf(`{"metadata":{"ownerReferences":[%s],"finalizers":[%q]%s}}`, controllerRef(j), conditions.JobTrackingFinalizer, extra))
	}
	release := []byte(fmt.Sprintf(`{"metadata":{"ownerReferences":[{"$patch":"delete","uid":%q}],"$deleteFromPrimitiveList/finalizers":[%q]}}`, managed.UID, conditions.JobTrackingFinalizer))
	orphan := mustCreatePod(t, admin, wrappers.MakePod("orphan", ns).Label(batchv1.ControllerUidLabel, string(managed.UID)).Finalizer("example.com/keep").Obj())
	removeAtEnd(t, admin, ns, orphan.Name)
	stranger := mustCreatePod(t, admin, wrappers.MakePod("stranger", ns).Label(batchv1.ControllerUidLabel, "0c5e6e4e-0000-4000-8000-000000000002").Obj())
	// A pod another controller controls (a ConfigMap, as a controller that exists: the
	// garbage collector would delete a pod whose owner does not).
	owner, err := admin.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "owner"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rsPod := wrappers.MakePod("controlled", ns).Label(batchv1.ControllerUidLabel, string(managed.UID)).Obj()
	rsPod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID, Controller: ptrTo(true)}}
	mustCreatePod(t, admin, rsPod)
	for _, tc := range []struct {
		name  string
		pod   string
		patch []byte
	}{
		{"adopt an orphan into a Job its label does not name", stranger.Name, adopt(managed, "")},
		{"adopt a pod another controller controls, in its place", rsPod.Name, []byte(fmt.Sprintf(`{"metadata":{"ownerReferences":[{"$patch":"replace"},%s],"finalizers":[%q]}}`, controllerRef(managed), conditions.JobTrackingFinalizer))},
		{"adopt an orphan and label it", orphan.Name, adopt(managed, `,"labels":{"app":"x"}`)},
		{"adopt an orphan without the tracking finalizer", orphan.Name, []byte(fmt.Sprintf(`{"metadata":{"ownerReferences":[%s]}}`, controllerRef(managed)))},
		{"label a pod without a controller managed", stranger.Name, []byte(managedLabel)},
		{"label a pod another controller controls managed", rsPod.Name, []byte(managedLabel)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := pods.Patch(ctx, tc.pod, types.StrategicMergePatchType, tc.patch, dry)
			wantDenied(t, err, ownJobs, patchDenied, "pod "+ns+"/"+tc.pod)
		})
	}
	t.Run("adopt an orphan, then release it", func(t *testing.T) {
		p, err := pods.Patch(ctx, orphan.Name, types.StrategicMergePatchType, adopt(managed, ""), metav1.PatchOptions{})
		wantAllowed(t, err)
		if err != nil {
			return
		}
		if ref := metav1.GetControllerOf(p); ref == nil || ref.UID != managed.UID || len(p.Finalizers) != 2 ||
			!slices.Contains(p.Finalizers, "example.com/keep") || !slices.Contains(p.Finalizers, conditions.JobTrackingFinalizer) {
			t.Fatalf("adopted pod has owners %v and finalizers %q", p.OwnerReferences, p.Finalizers)
		}
		p, err = pods.Patch(ctx, orphan.Name, types.StrategicMergePatchType, release, metav1.PatchOptions{})
		wantAllowed(t, err)
		if err == nil && (len(p.OwnerReferences) != 0 || !slices.Equal(p.Finalizers, []string{"example.com/keep"})) {
			t.Errorf("released pod has owners %v and finalizers %q", p.OwnerReferences, p.Finalizers)
		}
	})
	t.Run("a label through pods/status of a pod of a Job", func(t *testing.T) {
		_, err := pods.Patch(ctx, jobPod.Name, types.MergePatchType, []byte(`{"metadata":{"labels":{"app":"x"}}}`), dry, "status")
		wantDenied(t, err, ownJobs, "coroner-shim may change no label, annotation or finalizer of a pod through pods/status; pod "+ns+"/managed-0")
	})

	t.Run("recover a pod opted in: phase Failed, then a forced deletion", func(t *testing.T) {
		_, err := conditions.EnsurePodPhase(ctx, patcher, optedIn, corev1.PodFailed, metav1.Now, unreachable)
		wantAllowed(t, err)
		err = pods.Delete(ctx, optedIn.Name, metav1.DeleteOptions{GracePeriodSeconds: ptrTo[int64](0), Preconditions: &metav1.Preconditions{UID: &optedIn.UID}})
		wantAllowed(t, err)
	})
	for _, p := range []*corev1.Pod{bare, saysYes} {
		t.Run("status of "+p.Name, func(t *testing.T) {
			_, err := conditions.EnsurePodCondition(ctx, patcher, p, unreachable, metav1.Now)
			wantDenied(t, err, ownJobs, "coroner-shim may only write the status of pods controlled by a Job or opted in to recovery; pod "+ns+"/"+p.Name+" is neither")
		})
		t.Run("delete "+p.Name, func(t *testing.T) {
			err := pods.Delete(ctx, p.Name, dryDelete)
			wantDenied(t, err, ownJobs, "coroner-shim may only delete pods controlled by a Job or opted in to recovery", "pod "+ns+"/"+p.Name+" is neither")
		})
	}
	t.Run("opt a bare pod in through pods/status", func(t *testing.T) {
		_, err := pods.Patch(ctx, bare.Name, types.MergePatchType, []byte(fmt.Sprintf(`{"metadata":{"annotations":{%q:"true"}}}`, conditions.AnnotationSafeToForcefullyDelete)), dry, "status")
		wantDenied(t, err, ownJobs, "pod "+ns+"/bare is neither")
	})
}

// createPod creates a pod bound to node (none when empty), run by serviceAccount (the
// namespace's default when empty), and removes it when the test ends (mustCreatePod).
func createPod(t *testing.T, c kubernetes.Interface, ns, name, node, serviceAccount string) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			NodeName:           node,
			ServiceAccountName: serviceAccount,
			Containers:         []corev1.Container{{Name: "main", Image: "busybox:local"}},
		},
	}
	return mustCreatePod(t, c, pod)
}

// mustCreatePod creates pod with the admin client c and removes it when the test ends.
func mustCreatePod(t *testing.T, c kubernetes.Interface, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	p, err := c.CoreV1().Pods(pod.Namespace).Create(context.Background(), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating pod %s/%s: %v", pod.Namespace, pod.Name, err)
	}
	removeAtEnd(t, c, p.Namespace, p.Name)
	return p
}

// removeAtEnd takes the pod's finalizers off and force-deletes it when the test ends, with
// the admin client c: no kubelet would finish a graceful deletion, and no Job controller
// takes the tracking finalizer off.
func removeAtEnd(t *testing.T, c kubernetes.Interface, ns, name string) {
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = c.CoreV1().Pods(ns).Patch(ctx, name, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
		_ = c.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptrTo[int64](0)})
	})
}

func wantDenied(t *testing.T, err error, parts ...string) {
	t.Helper()
	if !isForbiddenBy(err, parts...) {
		t.Errorf("err = %v; want 403 Forbidden naming %q", err, parts)
	}
}

func wantAllowed(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Errorf("err = %v; want allowed", err)
	}
}

// tokenFor requests a token for the service account of coroner's namespace, bound to pod
// when not nil, as the kubelet does for a projected service account token.
func tokenFor(t *testing.T, c kubernetes.Interface, serviceAccount string, pod *corev1.Pod) string {
	t.Helper()
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptrTo[int64](600)}}
	if pod != nil {
		req.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
	}
	tr, err := c.CoreV1().ServiceAccounts(namespace).CreateToken(context.Background(), serviceAccount, req, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("TokenRequest for %s: %v", serviceAccount, err)
	}
	return tr.Status.Token
}

func tokenConfig(env *harness.Env, token string) *rest.Config {
	return &rest.Config{
		Host:            env.Config.Host,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: env.Config.CAData},
		QPS:             50,
		Burst:           100,
	}
}

type ref struct {
	Name string `json:"name"`
	UID  string `json:"uid"`
}

type tokenClaims struct {
	Kubernetes struct {
		Namespace string `json:"namespace"`
		Pod       *ref   `json:"pod"`
		Node      *ref   `json:"node"`
	} `json:"kubernetes.io"`
}

// jwtClaims decodes (without verifying) the payload of a JWT.
func jwtClaims(t *testing.T, token string) tokenClaims {
	t.Helper()
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		t.Fatalf("not a JWT: %d parts", len(parts))
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var c tokenClaims
	if err := json.Unmarshal(payload, &c); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestAdmissionPolicyKeepsTheShimToTheQuarantineTaint uses a real token of the shim and
// checks that, on Nodes, it may add, change and remove the taint coroner.dev/quarantined
// (with the patch shim/quarantine makes, conditions.QuarantineTaintPatch) and nothing else
// its ClusterRole's nodes patch would allow: no cordon, no other taint, no label or
// annotation, no NoExecute; RBAC refuses the rest (update, status, create, delete).
func TestAdmissionPolicyKeepsTheShimToTheQuarantineTaint(t *testing.T) {
	env := deployed(t)
	ctx := context.Background()
	admin := kubernetes.NewForConfigOrDie(env.Config)

	gpu := corev1.Taint{Key: "example.com/gpu", Value: "a100", Effect: corev1.TaintEffectNoSchedule}
	node, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "quarantine-policy-a", Labels: map[string]string{"pool": "gpu"}},
		Spec:       corev1.NodeSpec{Taints: []corev1.Taint{gpu}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.CoreV1().Nodes().Delete(context.Background(), node.Name, metav1.DeleteOptions{}) })
	// The API server adds node.kubernetes.io/not-ready (TaintNodesByCondition): the taints
	// that are not the quarantine's are the stored ones.
	others := node.Spec.Taints
	othersJSON, err := json.Marshal(others)
	if err != nil {
		t.Fatal(err)
	}
	withOthers := func(extra ...string) string {
		return `{"spec":{"taints":[` + strings.Join(append([]string{strings.Trim(string(othersJSON), "[]")}, extra...), ",") + `]}}`
	}

	shimPod := createPod(t, admin, namespace, "coroner-shim-quarantine", "", "coroner-shim")
	shim := kubernetes.NewForConfigOrDie(tokenConfig(env, tokenFor(t, admin, "coroner-shim", shimPod)))
	nodes := shim.CoreV1().Nodes()
	onNodes := fmt.Sprintf("ValidatingAdmissionPolicy '%s'", nodePolicyName)
	dry := metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}}
	cordon := []byte(`{"spec":{"unschedulable":true}}`)

	err = eventually(30*time.Second, func() error {
		_, err := nodes.Patch(ctx, node.Name, types.StrategicMergePatchType, cordon, dry)
		if isForbiddenBy(err, onNodes) {
			return nil
		}
		return fmt.Errorf("cordoning a node as the shim: %v", err)
	})
	if err != nil {
		t.Fatalf("the policy is not enforced: %v", err)
	}

	// The shim's own patches, from the node as it is stored.
	quarantine := func(t *testing.T, taint *corev1.Taint) (*corev1.Node, error) {
		t.Helper()
		cur, err := admin.CoreV1().Nodes().Get(ctx, node.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		body, err := conditions.QuarantineTaintPatch(cur, taint)
		if err != nil {
			t.Fatal(err)
		}
		return nodes.Patch(ctx, node.Name, types.JSONPatchType, body, metav1.PatchOptions{FieldManager: "coroner-shim-quarantine"})
	}
	taint := func(value string, effect corev1.TaintEffect) *corev1.Taint {
		return &corev1.Taint{Key: conditions.QuarantineTaintKey, Value: value, Effect: effect, TimeAdded: &metav1.Time{Time: time.Now().Truncate(time.Second)}}
	}
	t.Run("add the quarantine taint", func(t *testing.T) {
		n, err := quarantine(t, taint("device", corev1.TaintEffectNoSchedule))
		wantAllowed(t, err)
		if err == nil && (len(n.Spec.Taints) != len(others)+1 || !slices.Equal(n.Spec.Taints[:len(others)], others) ||
			n.Spec.Taints[len(others)].Key != conditions.QuarantineTaintKey || n.Spec.Taints[len(others)].TimeAdded == nil) {
			t.Errorf("taints after the patch: %+v", n.Spec.Taints)
		}
	})
	t.Run("change its cause", func(t *testing.T) {
		n, err := quarantine(t, taint("node-oom", corev1.TaintEffectNoSchedule))
		wantAllowed(t, err)
		if err == nil && (len(n.Spec.Taints) != len(others)+1 || n.Spec.Taints[len(others)].Value != "node-oom") {
			t.Errorf("taints after the patch: %+v", n.Spec.Taints)
		}
	})
	t.Run("a patch from a stale copy is refused by its resourceVersion test", func(t *testing.T) {
		stale := node.DeepCopy() // the resourceVersion at creation
		body, err := conditions.QuarantineTaintPatch(stale, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, err = nodes.Patch(ctx, node.Name, types.JSONPatchType, body, metav1.PatchOptions{})
		if err == nil || isForbiddenBy(err, onNodes) {
			t.Errorf("err = %v; want the JSON patch's test to fail", err)
		} else {
			t.Logf("stale patch: %v (reason %s)", err, apierrors.ReasonForError(err))
		}
	})

	quarantineTaint := fmt.Sprintf(`{"key":%q,"value":"device","effect":"NoSchedule"}`, conditions.QuarantineTaintKey)
	for _, tc := range []struct {
		name, patch, want string
	}{
		{"cordon it", string(cordon), "may change no field of a Node spec but its taint coroner.dev/quarantined (not unschedulable: no cordon); node quarantine-policy-a"},
		{"set its podCIDR", `{"spec":{"podCIDR":"10.244.9.0/24","podCIDRs":["10.244.9.0/24"]}}`, "may change no field of a Node spec"},
		{"add another taint", withOthers(quarantineTaint, `{"key":"example.com/x","effect":"NoSchedule"}`), "may add, change or remove no taint of a Node but coroner.dev/quarantined; node quarantine-policy-a"},
		{"remove another taint", `{"spec":{"taints":[` + quarantineTaint + `]}}`, "may add, change or remove no taint of a Node but coroner.dev/quarantined"},
		{"change another taint", strings.Replace(withOthers(quarantineTaint), "a100", "h100", 1), "may add, change or remove no taint"},
		{"make the quarantine NoExecute", withOthers(fmt.Sprintf(`{"key":%q,"value":"device","effect":"NoExecute"}`, conditions.QuarantineTaintKey)), "may set one taint coroner.dev/quarantined, with effect NoSchedule (running pods are never evicted)"},
		{"set two quarantine taints", withOthers(quarantineTaint, fmt.Sprintf(`{"key":%q,"value":"node-oom","effect":"PreferNoSchedule"}`, conditions.QuarantineTaintKey)), "may set one taint coroner.dev/quarantined"},
		{"add a label", `{"metadata":{"labels":{"chaos":"x"}}}`, "may change no label, annotation, finalizer or owner reference of a Node; node quarantine-policy-a"},
		{"remove a label", `{"metadata":{"labels":{"pool":null}}}`, "may change no label"},
		{"add an annotation", `{"metadata":{"annotations":{"example.com/x":"y"}}}`, "may change no label, annotation"},
		{"add a finalizer", `{"metadata":{"finalizers":["example.com/hold"]}}`, "may change no label, annotation, finalizer"},
		{"quarantine and label it at once", `{"metadata":{"labels":{"chaos":"x"}},` + strings.TrimPrefix(withOthers(quarantineTaint), "{"), "may change no label"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := nodes.Patch(ctx, node.Name, types.MergePatchType, []byte(tc.patch), dry)
			wantDenied(t, err, onNodes, tc.want)
		})
	}
	t.Run("the rest is not granted", func(t *testing.T) {
		err := nodes.Delete(ctx, node.Name, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		wantDenied(t, err, `cannot delete resource "nodes"`)
		_, err = nodes.Patch(ctx, node.Name, types.MergePatchType, []byte(`{"status":{"capacity":{"cpu":"1"}}}`), dry, "status")
		wantDenied(t, err, `cannot patch resource "nodes/status"`)
		_, err = nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "quarantine-policy-new"}}, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		wantDenied(t, err, `cannot create resource "nodes"`)
		cur, err := admin.CoreV1().Nodes().Get(ctx, node.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		_, err = nodes.Update(ctx, cur, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
		wantDenied(t, err, `cannot update resource "nodes"`)
	})
	t.Run("remove the quarantine taint", func(t *testing.T) {
		n, err := quarantine(t, nil)
		wantAllowed(t, err)
		if err == nil && !slices.Equal(n.Spec.Taints, others) {
			t.Errorf("taints after the patch: %+v", n.Spec.Taints)
		}
	})
	t.Run("admins are not held by it", func(t *testing.T) {
		_, err := admin.CoreV1().Nodes().Patch(ctx, node.Name, types.MergePatchType, cordon, dry)
		wantAllowed(t, err)
	})
}
