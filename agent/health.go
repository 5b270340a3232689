package agent

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/coroner-dev/coroner/cri"
)

// RuntimeHealth is the agent's health: nil while the container runtime answers, else an
// error that says why not (the Source's LastError when it has one, as cri.Watcher does:
// "socket ... does not exist: is the container runtime running?").
func RuntimeHealth(src cri.Source) error {
	if src.Connected() {
		return nil
	}
	if le, ok := src.(interface{ LastError() error }); ok {
		if err := le.LastError(); err != nil {
			return fmt.Errorf("container runtime unreachable: %w", err)
		}
	}
	return errors.New("container runtime not connected (yet)")
}

// HealthHandler serves /healthz: 200 "ok" while check returns nil, else 503 with the
// reason.
func HealthHandler(check func() error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if err := check(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
}
