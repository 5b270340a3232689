package shim

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// TestRunFailsFast checks that Run returns a clear error at once, instead of hanging,
// when the API server cannot be reached or a listen address cannot be bound.
func TestRunFailsFast(t *testing.T) {
	apiserver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/version" {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"major":"1","minor":"36","gitVersion":"v1.36.3"}`))
			return
		}
		http.NotFound(w, r)
	}))
	defer apiserver.Close()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()

	cases := []struct {
		name    string
		host    string
		opts    func(o *Options)
		wantErr string
	}{
		{
			name:    "API server unreachable",
			host:    "http://127.0.0.1:1",
			wantErr: "cannot reach the API server at http://127.0.0.1:1",
		},
		{
			name:    "metrics address in use",
			host:    apiserver.URL,
			opts:    func(o *Options) { o.MetricsAddress = busy.Addr().String() },
			wantErr: "serving metrics",
		},
		{
			name: "health address in use",
			host: apiserver.URL,
			opts: func(o *Options) {
				o.MetricsAddress = "0"
				o.HealthAddress = busy.Addr().String()
			},
			wantErr: "serving health",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			opts := NewOptions()
			if tc.opts != nil {
				tc.opts(opts)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := Run(ctx, &rest.Config{Host: tc.host}, opts)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Run = %v, want an error containing %q", err, tc.wantErr)
			}
			if ctx.Err() != nil {
				t.Errorf("Run took until the test's deadline")
			}
		})
	}
}
