package lab

import (
	"context"
	"fmt"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
)

// AsPod returns a client that authenticates as pod does: a 10-minute token of its
// ServiceAccount bound to the pod (TokenRequest), as the kubelet mounts it, so the API
// server's node-bound claims (authentication.kubernetes.io/node-name) are there for the
// admission policies that read them. base gives the server and its CA.
func AsPod(ctx context.Context, cs kubernetes.Interface, base *rest.Config, pod *corev1.Pod) (*kubernetes.Clientset, error) {
	tr, err := cs.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, pod.Spec.ServiceAccountName, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: ptr.To[int64](600),
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("a token of %s bound to %s: %w", pod.Spec.ServiceAccountName, pod.Name, err)
	}
	cfg := rest.AnonymousClientConfig(base)
	cfg.BearerToken = tr.Status.Token
	return kubernetes.NewForConfig(cfg)
}
