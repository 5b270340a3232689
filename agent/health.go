package agent

// Health: the readiness (/readyz, the runtime answers) and liveness (/healthz) checks and
// their handler.

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/coroner-dev/coroner/cri"
)

// RuntimeHealth is the agent's readiness (/readyz): nil while the container runtime
// answers, else an error that says why not (the Source's LastError when it has one, as
// cri.Watcher does: "socket ... does not exist: is the container runtime running?", or
// with discovery "no container runtime found: tried ...").
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

// Alive is the /healthz (liveness) check: the agent runs and answers. It does not depend
// on the container runtime: the agent reconnects to it (or keeps looking for it) by
// itself, and a kubelet restarting the agent in a loop would fix nothing and bury the
// reason; /readyz (RuntimeHealth) says why the runtime is not usable.
func Alive() error { return nil }

// HealthHandler serves a health check (/healthz, /readyz): 200 "ok" while check returns
// nil, else 503 with the reason.
func HealthHandler(check func() error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if err := check(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
}
