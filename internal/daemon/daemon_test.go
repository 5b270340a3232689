package daemon

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

func TestCheckAPIServer(t *testing.T) {
	apiserver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/version" {
			http.NotFound(w, r)
			return
		}
		_, _ = io.WriteString(w, `{"gitVersion":"v1.36.3"}`)
	}))
	defer apiserver.Close()
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
	}))
	defer slow.Close()
	cases := []struct {
		name    string
		host    string
		wantErr bool
	}{
		{name: "answers", host: apiserver.URL},
		{name: "unreachable", host: "http://127.0.0.1:1", wantErr: true},
		{name: "does not answer within the timeout", host: slow.URL, wantErr: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			client, err := kubernetes.NewForConfig(&rest.Config{Host: tc.host})
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			err = CheckAPIServer(context.Background(), client, 200*time.Millisecond)
			if gotErr := err != nil; gotErr != tc.wantErr {
				t.Fatalf("CheckAPIServer = %v, want error: %v", err, tc.wantErr)
			}
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("CheckAPIServer took %v, want it bounded by its timeout", took)
			}
		})
	}
}

func TestServe(t *testing.T) {
	ctx := context.Background()
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") })
	// A free port (the server returned does not say where it listens).
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := free.Addr().String()
	_ = free.Close()
	s, err := Serve(ctx, "health", addr, mux)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Shutdown(ctx) }()
	if s.ReadHeaderTimeout <= 0 {
		t.Errorf("ReadHeaderTimeout = %v, want a bound", s.ReadHeaderTimeout)
	}
	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(body) != "ok" {
		t.Errorf("GET /healthz = %d %q, want 200 \"ok\"", resp.StatusCode, body)
	}

	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	if _, err := Serve(ctx, "metrics", busy.Addr().String(), mux); err == nil || !strings.HasPrefix(err.Error(), "serving metrics: ") {
		t.Errorf("Serve on a busy address = %v, want an error starting with %q", err, "serving metrics: ")
	}
}
