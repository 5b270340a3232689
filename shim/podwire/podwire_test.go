package podwire

import (
	"bytes"
	"context"
	"encoding/binary"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protowire"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
)

// standard is client-go's protobuf serializer, the reference; ours is this package's.
func serializers(t *testing.T) (standard, ours runtime.SerializerInfo) {
	t.Helper()
	find := func(ns runtime.NegotiatedSerializer) runtime.SerializerInfo {
		for _, i := range ns.SupportedMediaTypes() {
			if i.MediaType == runtime.ContentTypeProtobuf {
				return i
			}
		}
		t.Fatal("no protobuf serializer")
		return runtime.SerializerInfo{}
	}
	codecs := scheme.Codecs.WithoutConversion()
	return find(codecs), find(NegotiatedSerializer(codecs))
}

// jobPod is a pod as the shim's Jobs have them once a kubelet ran it: the Job's labels,
// annotations, owner and finalizer, a spec with resources and env, a terminated status,
// and the managedFields of three writers.
func jobPod() *corev1.Pod {
	ts := metav1.NewTime(time.Date(2026, 11, 29, 9, 0, 0, 0, time.UTC))
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: "train-0-x7k2p", GenerateName: "train-0-", Namespace: "ml", UID: "5f1c-pod",
			ResourceVersion: "123456", Generation: 1, CreationTimestamp: ts,
			DeletionTimestamp: &ts, DeletionGracePeriodSeconds: ptr.To[int64](30),
			Labels: map[string]string{
				"batch.kubernetes.io/controller-uid": "9a1b-job", "batch.kubernetes.io/job-name": "train",
				"batch.kubernetes.io/job-completion-index": "0",
			},
			Annotations:     map[string]string{"batch.kubernetes.io/job-completion-index": "0", "coroner.dev/x": "y"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "train", UID: "9a1b-job", Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}},
			Finalizers:      []string{"batch.kubernetes.io/job-tracking"},
			ManagedFields: []metav1.ManagedFieldsEntry{
				{Manager: "coroner-shim", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", Time: &ts, FieldsType: "FieldsV1",
					FieldsV1: metav1.NewFieldsV1(`{"f:metadata":{"f:labels":{".":{},"f:batch.kubernetes.io/job-name":{}}},"f:spec":{"f:containers":{}}}`)},
				{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", Time: &ts, FieldsType: "FieldsV1", Subresource: "status",
					FieldsV1: metav1.NewFieldsV1(`{"f:status":{"f:conditions":{},"f:phase":{}}}`)},
				{Manager: "coroner-agent", Operation: metav1.ManagedFieldsOperationApply, APIVersion: "v1", Time: &ts, FieldsType: "FieldsV1", Subresource: "status",
					FieldsV1: metav1.NewFieldsV1(`{"f:status":{"f:conditions":{"k:{\"type\":\"DisruptionTarget\"}":{}}}}`)},
			},
		},
		Spec: corev1.PodSpec{
			NodeName: "node-a", RestartPolicy: corev1.RestartPolicyNever, Hostname: "train-0", Subdomain: "train",
			Containers: []corev1.Container{{
				Name: "main", Image: "trainer:1", Command: []string{"sh", "-c", "exit 1"},
				Env:       []corev1.EnvVar{{Name: "JOB_COMPLETION_INDEX", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels['batch.kubernetes.io/job-completion-index']"}}}},
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")}},
			}},
			Tolerations: []corev1.Toleration{{Key: "node.kubernetes.io/unreachable", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To[int64](300)}},
		},
		Status: corev1.PodStatus{
			Phase: corev1.PodFailed, StartTime: &ts,
			Conditions:        []corev1.PodCondition{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: "TerminationByKubelet", Message: "node pressure", LastTransitionTime: ts}},
			ContainerStatuses: []corev1.ContainerStatus{{Name: "main", ContainerID: "containerd://abc", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "OOMKilled", StartedAt: ts, FinishedAt: ts}}}},
		},
	}
}

// encode encodes obj as the API server does, its kind set.
func encode(t *testing.T, info runtime.SerializerInfo, obj runtime.Object) []byte {
	t.Helper()
	kinds, _, err := scheme.Scheme.ObjectKinds(obj)
	if err != nil {
		t.Fatal(err)
	}
	obj = obj.DeepCopyObject()
	obj.GetObjectKind().SetGroupVersionKind(kinds[0])
	var buf bytes.Buffer
	if err := info.Serializer.Encode(obj, &buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// withoutManagedFields is what ours must give: client-go's pod, managedFields nil.
func withoutManagedFields(obj runtime.Object) runtime.Object {
	if p, ok := obj.(*corev1.Pod); ok {
		p = p.DeepCopy()
		p.ManagedFields = nil
		return p
	}
	return obj
}

func TestDecodeLikeClientGo(t *testing.T) {
	standard, ours := serializers(t)
	bare := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "bare"}}
	full := jobPod()
	noMF := jobPod()
	noMF.ManagedFields = nil
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", ManagedFields: full.ManagedFields}}
	list := &corev1.PodList{Items: []corev1.Pod{*full, *bare}}
	for name, obj := range map[string]runtime.Object{
		"a bare pod": bare, "a Job's pod": full, "a pod without managedFields": noMF,
		"a node (client-go's decoder)": node, "a pod list (client-go's decoder)": list,
	} {
		t.Run(name, func(t *testing.T) {
			data := encode(t, standard, obj)
			want, wantGVK, err := standard.Serializer.Decode(data, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			got, gotGVK, err := ours.Serializer.Decode(data, nil, nil)
			if err != nil {
				t.Fatalf("ours: %v", err)
			}
			if diff := cmp.Diff(withoutManagedFields(want), got); diff != "" {
				t.Errorf("decoded object (-client-go's, managedFields dropped, +ours):\n%s", diff)
			}
			if *gotGVK != *wantGVK {
				t.Errorf("kind: got %v, want %v", gotGVK, wantGVK)
			}
			// Into an object that holds something already: reset first, as client-go does.
			into := jobPod()
			into.Spec.NodeName, into.Labels["stale"] = "stale", "stale"
			if _, isPod := obj.(*corev1.Pod); isPod {
				got, _, err := ours.Serializer.Decode(data, nil, into)
				if err != nil || got != into {
					t.Fatalf("decoding into a pod: %v (same object: %v)", err, got == into)
				}
				if diff := cmp.Diff(withoutManagedFields(want), runtime.Object(into)); diff != "" {
					t.Errorf("decoded into a used pod (-want +got):\n%s", diff)
				}
			}
		})
	}
}

// TestManagedFieldsAnywhere: ObjectMeta's fields are decoded around managedFields wherever
// they are in the message (the API server writes them last; the wire format allows any
// order, and repeated messages merge).
func TestManagedFieldsAnywhere(t *testing.T) {
	p := jobPod()
	mf := p.ManagedFields
	p.ManagedFields = nil
	head, err := (&metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, Labels: p.Labels}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	tail, err := (&metav1.ObjectMeta{UID: p.UID, Annotations: p.Annotations, Finalizers: p.Finalizers, OwnerReferences: p.OwnerReferences}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	var meta []byte
	meta = append(meta, head...)
	for _, e := range mf[:2] {
		b, err := e.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		meta = protowire.AppendTag(meta, managedFieldsField, protowire.BytesType)
		meta = protowire.AppendBytes(meta, b)
	}
	meta = append(meta, tail...)
	spec, err := p.Spec.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	var raw []byte
	raw = protowire.AppendTag(raw, 2, protowire.BytesType)
	raw = protowire.AppendBytes(raw, spec)
	raw = protowire.AppendTag(raw, 1, protowire.BytesType) // metadata after spec
	raw = protowire.AppendBytes(raw, meta)

	want := &corev1.Pod{}
	if err := want.Unmarshal(raw); err != nil {
		t.Fatal(err)
	}
	if len(want.ManagedFields) != 2 || want.UID != p.UID || want.Labels["batch.kubernetes.io/job-name"] != "train" {
		t.Fatalf("the test's message is not what it means to be: %+v", want.ObjectMeta)
	}
	got := &corev1.Pod{}
	if err := unmarshalPod(raw, got); err != nil {
		t.Fatal(err)
	}
	want.ManagedFields = nil
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-Pod.Unmarshal, managedFields dropped, +unmarshalPod):\n%s", diff)
	}
}

// TestDamagedBytes: whatever the bytes, ours decodes what client-go decodes, the same way
// (managedFields aside when the fast path took it), and fails where it fails (but for a
// damaged managedFields entry, which the fast path skips): a damaged message is never
// taken for a different pod. Bytes are flipped and messages cut at random, seeded for repeatability.
func TestDamagedBytes(t *testing.T) {
	standard, ours := serializers(t)
	data := encode(t, standard, jobPod())
	// Where the managedFields entries are, each with its key and length (3 bytes here).
	var mfRanges [][2]int
	for _, e := range jobPod().ManagedFields {
		b, err := e.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		at := bytes.Index(data, b)
		if at < 0 {
			t.Fatal("a managedFields entry is not in the encoded pod")
		}
		mfRanges = append(mfRanges, [2]int{at - 3, at + len(b)})
	}
	// Some damage in managedFields (the rest may be harmless, inside a string).
	inManagedFields := func(pos []int) bool {
		for _, p := range pos {
			for _, r := range mfRanges {
				if p >= r[0] && p < r[1] {
					return true
				}
			}
		}
		return false
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var agreedOK, agreedErr, fast, skippedDamage int
	for i := range 20000 {
		d := bytes.Clone(data)
		var damaged []int // positions changed; none for a cut
		switch i % 3 {
		case 0:
			at := 4 + rng.IntN(len(d)-4)
			d[at] ^= byte(1 + rng.IntN(255))
			damaged = append(damaged, at)
		case 1:
			d = d[:4+rng.IntN(len(d)-4)]
		case 2:
			for range 1 + rng.IntN(4) {
				at := 4 + rng.IntN(len(d)-4)
				d[at] = byte(rng.IntN(256))
				damaged = append(damaged, at)
			}
		}
		want, _, wantErr := standard.Serializer.Decode(d, nil, nil)
		got, _, gotErr := ours.Serializer.Decode(d, nil, nil)
		switch {
		case wantErr == nil && gotErr != nil:
			t.Fatalf("case %d: client-go decodes it, ours fails: %v", i, gotErr)
		case wantErr == nil:
			// The fast path's pod has no managedFields; where it declined, client-go's
			// decoder gave the pod whole.
			if decodePod(d, &corev1.Pod{}) {
				want = withoutManagedFields(want)
				fast++
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Fatalf("case %d: decoded differently (-client-go's +ours):\n%s", i, diff)
			}
			agreedOK++
		case gotErr == nil:
			// Only a damaged managedFields entry, which ours skips, may decode here.
			if !inManagedFields(damaged) {
				t.Fatalf("case %d: client-go fails (%v), ours decodes bytes damaged only outside managedFields (at %v)", i, wantErr, damaged)
			}
			skippedDamage++
		default:
			agreedErr++
		}
	}
	t.Logf("decoded alike: %d (%d by the fast path), both failed: %d, damage in managedFields skipped: %d", agreedOK, fast, agreedErr, skippedDamage)
	if fast == 0 || agreedErr == 0 {
		t.Errorf("the damage did not cover both outcomes: %d decoded, %d failed", agreedOK, agreedErr)
	}
}

func TestWatchEventInPlace(t *testing.T) {
	standard, ours := serializers(t)
	podBytes := encode(t, standard, jobPod())
	var buf bytes.Buffer
	ev := &metav1.WatchEvent{Type: string(watch.Modified), Object: runtime.RawExtension{Raw: podBytes}}
	if err := standard.StreamSerializer.Encode(ev, &buf); err != nil {
		t.Fatal(err)
	}
	data := buf.Bytes()
	var want, got metav1.WatchEvent
	if _, _, err := standard.StreamSerializer.Decode(data, nil, &want); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ours.StreamSerializer.Decode(data, nil, &got); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-client-go's +ours):\n%s", diff)
	}
	if end := &data[len(data)-1]; &got.Object.Raw[len(got.Object.Raw)-1] != end {
		t.Errorf("the object's bytes were copied; want them read in place")
	}
	// A damaged event: what client-go says.
	d := data[:len(data)-3]
	_, _, wantErr := standard.StreamSerializer.Decode(d, nil, &metav1.WatchEvent{})
	_, _, gotErr := ours.StreamSerializer.Decode(d, nil, &metav1.WatchEvent{})
	if (wantErr == nil) != (gotErr == nil) {
		t.Errorf("a cut event: client-go's error %v, ours %v", wantErr, gotErr)
	}
}

// TestClientset runs the clientset against a server that answers as the API server does
// in protobuf (a Get, a List and a watch stream of framed events) and checks what the
// informers and the shim's writes would read: the pods of client-go's clientset, without
// managedFields, and every other object as client-go gives it.
func TestClientset(t *testing.T) {
	standard, _ := serializers(t)
	pod := jobPod()
	other := jobPod()
	other.Name, other.ResourceVersion = "train-1-abcde", "123457"
	list := &corev1.PodList{ListMeta: metav1.ListMeta{ResourceVersion: "123457"}, Items: []corev1.Pod{*pod, *other}}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", ManagedFields: pod.ManagedFields}}

	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.Contains(r.Header.Get("Accept"), runtime.ContentTypeProtobuf) {
			http.Error(w, "protobuf only", http.StatusNotAcceptable)
			return
		}
		switch {
		case r.URL.Path == "/api/v1/namespaces/ml/pods" && r.URL.Query().Get("watch") == "true":
			w.Header().Set("Content-Type", runtime.ContentTypeProtobuf+";stream=watch")
			w.WriteHeader(http.StatusOK)
			for i, p := range []*corev1.Pod{pod, other} {
				var ev bytes.Buffer
				typ := watch.Added
				if i == 1 {
					typ = watch.Deleted
				}
				if err := standard.StreamSerializer.Encode(&metav1.WatchEvent{Type: string(typ), Object: runtime.RawExtension{Raw: encode(t, standard, p)}}, &ev); err != nil {
					t.Error(err)
					return
				}
				_ = binary.Write(w, binary.BigEndian, uint32(ev.Len()))
				_, _ = w.Write(ev.Bytes())
			}
			w.(http.Flusher).Flush()
		case r.URL.Path == "/api/v1/namespaces/ml/pods":
			w.Header().Set("Content-Type", runtime.ContentTypeProtobuf)
			_, _ = w.Write(encode(t, standard, list))
		case r.URL.Path == "/api/v1/namespaces/ml/pods/"+pod.Name:
			w.Header().Set("Content-Type", runtime.ContentTypeProtobuf)
			_, _ = w.Write(encode(t, standard, pod))
		case r.URL.Path == "/api/v1/nodes/node-a":
			w.Header().Set("Content-Type", runtime.ContentTypeProtobuf)
			_, _ = w.Write(encode(t, standard, node))
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	cfg := &rest.Config{Host: srv.URL, QPS: 50, Burst: 100}
	theirs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mine, err := NewClientset(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	wantPod, err := theirs.CoreV1().Pods("ml").Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(wantPod.ManagedFields) != 3 {
		t.Fatalf("client-go's pod has %d managedFields, want the 3 served", len(wantPod.ManagedFields))
	}
	gotPod, err := mine.CoreV1().Pods("ml").Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(withoutManagedFields(wantPod), runtime.Object(gotPod)); diff != "" {
		t.Errorf("Get (-client-go's +ours):\n%s", diff)
	}

	wantList, err := theirs.CoreV1().Pods("ml").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	gotList, err := mine.CoreV1().Pods("ml").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(wantList, gotList); diff != "" {
		t.Errorf("List (-client-go's +ours):\n%s", diff)
	}
	wantNode, err := theirs.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	gotNode, err := mine.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(wantNode, gotNode); diff != "" {
		t.Errorf("a Node (-client-go's +ours):\n%s", diff)
	}

	events := func(c kubernetes.Interface) []watch.Event {
		w, err := c.CoreV1().Pods("ml").Watch(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		var out []watch.Event
		for ev := range w.ResultChan() {
			out = append(out, ev)
		}
		return out
	}
	want, got := events(theirs), events(mine)
	if len(want) != 2 || len(got) != 2 {
		t.Fatalf("watch events: client-go's %d, ours %d, want 2 each", len(want), len(got))
	}
	for i := range want {
		want[i].Object = withoutManagedFields(want[i].Object)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("watch (-client-go's +ours):\n%s", diff)
	}
}
