// Package daemon is the start-up plumbing coroner's two daemons, coroner-agent and
// coroner-shim, share: the check that the API server answers, and the HTTP server of
// their metrics and probes.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// readHeaderTimeout bounds how long a client of Serve's server may take to send its
// request's headers.
const readHeaderTimeout = 10 * time.Second

// CheckAPIServer asks the API server for its version, within timeout.
func CheckAPIServer(ctx context.Context, client kubernetes.Interface, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	body, err := client.Discovery().RESTClient().Get().AbsPath("/version").Do(ctx).Raw()
	if err != nil {
		return err
	}
	klog.FromContext(ctx).V(2).Info("The API server answers", "version", string(body))
	return nil
}

// Serve listens on addr (synchronously, so that a bad or busy address fails the daemon's
// start) and serves h in the background until the server returned is shut down. name says
// what it serves, in the error ("serving NAME: ...") and the logs.
func Serve(ctx context.Context, name, addr string, h http.Handler) (*http.Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("serving %s: %w", name, err)
	}
	s := &http.Server{Handler: h, ReadHeaderTimeout: readHeaderTimeout}
	logger := klog.FromContext(ctx)
	logger.Info("Serving", "server", name, "address", ln.Addr().String())
	go func() {
		if err := s.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error(err, "HTTP server stopped", "server", name)
		}
	}()
	return s, nil
}
