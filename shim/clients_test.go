package shim

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
)

// TestNewClientsShareOneRateLimiter: the typed client, the pods' metadata client and the
// JobRecords' clients draw from one bucket, so that --kube-api-qps bounds them together.
func TestNewClientsShareOneRateLimiter(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch {
		case strings.HasSuffix(r.URL.Path, "/pods/p"):
			_, _ = w.Write([]byte(`{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"name":"p","namespace":"ns"}}`))
		default:
			_, _ = w.Write([]byte(`{"kind":"Node","apiVersion":"v1","metadata":{"name":"n"}}`))
		}
	}))
	defer srv.Close()
	// One request a second, no burst beyond one: the second request waits about a second
	// if and only if it shares the first one's bucket.
	c, err := NewClients(&rest.Config{Host: srv.URL, QPS: 1, Burst: 1}, true, 0)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := c.Kube.CoreV1().Nodes().Get(ctx, "n", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := c.PodMetadata.Resource(corev1.SchemeGroupVersion.WithResource("pods")).Namespace("ns").Patch(ctx, "p", types.MergePatchType, []byte(`{}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(start); waited < 500*time.Millisecond {
		t.Errorf("the metadata client's request waited %v after the typed client's, want about 1s: separate rate limiters", waited)
	}
	if c.Records.Client == nil || c.Records.Metadata == nil {
		t.Errorf("no JobRecords' clients: %+v", c.Records)
	}
	if _, err := NewClients(&rest.Config{Host: srv.URL, QPS: 5, Burst: 0}, false, 0); err == nil {
		t.Error("a burst of 0 with 5 requests per second: no error")
	}
}
