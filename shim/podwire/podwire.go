// Package podwire is coroner-shim's core/v1 client with a cheaper protobuf decoder for
// pods, the objects the shim decodes most: every pod event of every Job, and the answers
// to its pod writes.
//
// client-go's protobuf path copies each watch event's bytes twice before it decodes them
// (the WatchEvent's RawExtension, then the runtime.Unknown envelope inside it), and
// decodes metadata.managedFields, which the shim never reads and its informers drop
// (shim/informers): a third of the bytes the shim allocated at 10,000 pods
// (docs/performance.md). This package's decoders read both envelopes in place and skip
// managedFields on the wire; everything else of a pod is decoded by the pod types' own
// generated code, so the result is what client-go's decoder gives with ManagedFields
// nil. Anything else (another kind, an envelope with a content encoding, bytes this
// package does not parse as it expects) goes to client-go's decoder unchanged, errors
// included.
//
// The price: a pod read through this client has no managedFields. Nothing in the shim
// writes a pod whole (pods are patched), so none are lost on the server.
package podwire

import (
	"bytes"
	"fmt"
	"net/http"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"

	"google.golang.org/protobuf/encoding/protowire"
)

// NewClientset returns a clientset for cfg whose CoreV1() decodes pods with this
// package's decoders. The clientset and its core/v1 client share one HTTP client and one
// rate limiter (cfg's QPS and Burst hold for them together, as for a clientset of
// kubernetes.NewForConfig).
func NewClientset(cfg *rest.Config) (kubernetes.Interface, error) {
	c := *cfg
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	if c.RateLimiter == nil && c.QPS > 0 {
		if c.Burst <= 0 {
			return nil, fmt.Errorf("burst is required to be greater than 0 when RateLimiter is not set and QPS is set to greater than 0")
		}
		c.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(c.QPS, c.Burst)
	}
	httpClient, err := rest.HTTPClientFor(&c)
	if err != nil {
		return nil, err
	}
	return newClientset(&c, httpClient)
}

func newClientset(c *rest.Config, httpClient *http.Client) (kubernetes.Interface, error) {
	cs, err := kubernetes.NewForConfigAndClient(c, httpClient)
	if err != nil {
		return nil, err
	}
	core := rest.CopyConfig(c)
	gv := corev1.SchemeGroupVersion
	core.GroupVersion = &gv
	core.APIPath = "/api"
	core.NegotiatedSerializer = NegotiatedSerializer(scheme.Codecs.WithoutConversion())
	rc, err := rest.RESTClientForConfigAndClient(core, httpClient)
	if err != nil {
		return nil, err
	}
	return &clientset{Clientset: cs, core: corev1client.New(rc)}, nil
}

// clientset is a kubernetes.Clientset whose CoreV1 is the one with this package's
// decoders.
type clientset struct {
	*kubernetes.Clientset
	core corev1client.CoreV1Interface
}

func (c *clientset) CoreV1() corev1client.CoreV1Interface { return c.core }

// NegotiatedSerializer returns ns with its protobuf serializer's pod decoding and its
// protobuf stream's watch-event decoding replaced by this package's; the rest is ns's.
func NegotiatedSerializer(ns runtime.NegotiatedSerializer) runtime.NegotiatedSerializer {
	infos := slices.Clone(ns.SupportedMediaTypes())
	for i := range infos {
		info := &infos[i]
		if info.MediaType != runtime.ContentTypeProtobuf {
			continue
		}
		info.Serializer = podDecoder{Serializer: info.Serializer}
		if info.StreamSerializer != nil {
			s := *info.StreamSerializer
			s.Serializer = watchEventDecoder{Serializer: s.Serializer}
			info.StreamSerializer = &s
		}
	}
	return negotiated{NegotiatedSerializer: ns, infos: infos}
}

type negotiated struct {
	runtime.NegotiatedSerializer
	infos []runtime.SerializerInfo
}

func (n negotiated) SupportedMediaTypes() []runtime.SerializerInfo { return n.infos }

// protobufPrefix starts every protobuf-encoded object: "k8s" and a zero byte.
var protobufPrefix = []byte{0x6b, 0x38, 0x73, 0x00}

var podKind = corev1.SchemeGroupVersion.WithKind("Pod")

// podDecoder decodes a protobuf pod (runtime.Unknown around a Pod) without copying the
// envelope and without managedFields; anything else with Serializer.
type podDecoder struct {
	runtime.Serializer
}

func (d podDecoder) Decode(data []byte, defaults *schema.GroupVersionKind, into runtime.Object) (runtime.Object, *schema.GroupVersionKind, error) {
	pod, ok := into.(*corev1.Pod)
	if into != nil && !ok {
		return d.Serializer.Decode(data, defaults, into)
	}
	if pod == nil {
		pod = &corev1.Pod{}
	}
	if !decodePod(data, pod) {
		return d.Serializer.Decode(data, defaults, into)
	}
	gvk := podKind
	pod.SetGroupVersionKind(gvk)
	return pod, &gvk, nil
}

// decodePod decodes data, a protobuf-encoded Pod in its envelope, into pod (reset
// first); false when data is not that or not as this package expects, pod then in any
// state.
func decodePod(data []byte, pod *corev1.Pod) bool {
	if !bytes.HasPrefix(data, protobufPrefix) {
		return false
	}
	raw, ok := unknownPod(data[len(protobufPrefix):])
	if !ok {
		return false
	}
	pod.Reset()
	return unmarshalPod(raw, pod) == nil
}

// unknownPod returns the Raw of a runtime.Unknown whose TypeMeta is v1 Pod, with no content
// encoding or type; false for any other.
func unknownPod(b []byte) (raw []byte, ok bool) {
	var apiVersion, kind, encoding, contentType []byte
	var haveRaw bool
	err := fields(b, func(num int, typ protowire.Type, v []byte) error {
		if typ != protowire.BytesType {
			return errUnexpected
		}
		switch num {
		case 1: // typeMeta
			return fields(v, func(num int, typ protowire.Type, v []byte) error {
				if typ != protowire.BytesType {
					return errUnexpected
				}
				switch num {
				case 1:
					apiVersion = v
				case 2:
					kind = v
				}
				return nil
			})
		case 2:
			raw, haveRaw = v, true
		case 3:
			encoding = v
		case 4:
			contentType = v
		}
		return nil
	})
	if err != nil || !haveRaw || len(encoding) != 0 || len(contentType) != 0 ||
		string(apiVersion) != podKind.Version || string(kind) != podKind.Kind {
		return nil, false
	}
	return raw, true
}

// unmarshalPod decodes a Pod message as Pod.Unmarshal does, but for managedFields (field
// 17 of ObjectMeta), which it skips. The generated Unmarshal methods merge into their
// receiver, so a message's fields may be given to them in runs.
func unmarshalPod(b []byte, pod *corev1.Pod) error {
	return fields(b, func(num int, typ protowire.Type, v []byte) error {
		if typ != protowire.BytesType {
			return errUnexpected
		}
		switch num {
		case 1:
			return unmarshalMetaWithoutManagedFields(v, &pod.ObjectMeta)
		case 2:
			return pod.Spec.Unmarshal(v)
		case 3:
			return pod.Status.Unmarshal(v)
		}
		return errUnexpected // a field this version of the Pod type does not know
	})
}

// managedFieldsField is ObjectMeta's field number of managedFields.
const managedFieldsField = 17

func unmarshalMetaWithoutManagedFields(b []byte, meta *metav1.ObjectMeta) error {
	start, pos := 0, 0
	flush := func(end int) error {
		if end > start {
			return meta.Unmarshal(b[start:end])
		}
		return nil
	}
	for pos < len(b) {
		num, _, _, n := field(b[pos:])
		if n < 0 {
			return errUnexpected
		}
		next := pos + n
		if num == managedFieldsField {
			if err := flush(pos); err != nil {
				return err
			}
			start = next
		}
		pos = next
	}
	return flush(len(b))
}

// watchEventDecoder decodes a protobuf metav1.WatchEvent with its object's bytes left in
// place (Object.Raw is a slice of data, valid until data is reused: client-go decodes the
// object before it reads the next frame); anything else with Serializer.
type watchEventDecoder struct {
	runtime.Serializer
}

func (d watchEventDecoder) Decode(data []byte, defaults *schema.GroupVersionKind, into runtime.Object) (runtime.Object, *schema.GroupVersionKind, error) {
	ev, ok := into.(*metav1.WatchEvent)
	if !ok || ev == nil {
		return d.Serializer.Decode(data, defaults, into)
	}
	var typ, raw []byte
	var haveRaw bool
	err := fields(data, func(num int, t protowire.Type, v []byte) error {
		if t != protowire.BytesType {
			return errUnexpected
		}
		switch num {
		case 1:
			typ = v
		case 2: // object, a RawExtension
			return fields(v, func(num int, t protowire.Type, v []byte) error {
				if t != protowire.BytesType || num != 1 {
					return errUnexpected
				}
				raw, haveRaw = v, true
				return nil
			})
		default:
			return errUnexpected
		}
		return nil
	})
	if err != nil || !haveRaw {
		return d.Serializer.Decode(data, defaults, into)
	}
	*ev = metav1.WatchEvent{Type: eventType(typ), Object: runtime.RawExtension{Raw: raw}}
	return ev, nil, nil
}

// eventType returns typ as a string, without allocating for the watch's own types.
func eventType(typ []byte) string {
	for _, t := range []string{"ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"} {
		if string(typ) == t {
			return t
		}
	}
	return string(typ)
}
