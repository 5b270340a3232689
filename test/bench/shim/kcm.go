package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coroner-dev/coroner/test/bench/measure"
	"github.com/coroner-dev/coroner/test/harness"
	"github.com/coroner-dev/coroner/test/host"
)

// controllerManager is kube-controller-manager running only the built-in Job controller.
// The benchmark starts it itself, with the flags of harness.Env.StartControllerManager
// plus the client's rate limits and --authorization-always-allow-paths for /metrics:
// that helper takes neither and does not say which port it serves on.
type controllerManager struct {
	proc *host.Process
	base string // https://127.0.0.1:port
	http *http.Client

	stopping atomic.Bool
	exitOnce sync.Once
	exit     chan error
}

// startControllerManager starts kube-controller-manager v1.36.3 from the harness's
// binaries against env, logging to env.Dir/kube-controller-manager.log, and waits until
// it serves /healthz.
func startControllerManager(env *harness.Env, workers int, qps float64, burst int) (*controllerManager, error) {
	binDir := os.Getenv("CORONER_BIN_DIR")
	if binDir == "" {
		root, err := host.RepoRoot()
		if err != nil {
			return nil, err
		}
		binDir = filepath.Join(root, "_output", "bin")
	}
	bin := filepath.Join(binDir, "kube-controller-manager")
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("%w: run `make tools` (test/tools/build.sh) first", err)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	p, err := host.StartProcess(env.Dir, "kube-controller-manager", bin,
		"--kubeconfig="+env.Kubeconfig,
		"--authentication-kubeconfig="+env.Kubeconfig,
		"--authorization-kubeconfig="+env.Kubeconfig,
		"--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics,/debug/pprof/*",
		"--controllers=job",
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", port),
		"--use-service-account-credentials=false",
		fmt.Sprintf("--concurrent-job-syncs=%d", workers),
		fmt.Sprintf("--kube-api-qps=%v", qps),
		fmt.Sprintf("--kube-api-burst=%d", burst),
		"--v=1",
	)
	if err != nil {
		return nil, err
	}
	cm := &controllerManager{
		proc: p,
		base: "https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		// Its serving certificate is self-signed, made at start-up; this is loopback.
		http: &http.Client{
			Timeout:   10 * time.Second,
			Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, //nolint:gosec // loopback, self-signed
		},
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if done, err := p.Exited(); done {
			return nil, fmt.Errorf("kube-controller-manager exited during start-up: %v\n%s", err, p.LogTail(4000))
		}
		body, err := cm.get(context.Background(), "/healthz")
		if err == nil && body == "ok" {
			return cm, nil
		}
		if time.Now().After(deadline) {
			cm.stop()
			return nil, fmt.Errorf("kube-controller-manager not healthy within 60s (last: %q, %v)\n%s", body, err, p.LogTail(4000))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (cm *controllerManager) stop() {
	cm.stopping.Store(true)
	cm.proc.Stop(10 * time.Second)
}

// synced is true: kube-controller-manager does not say when its Job controller's caches
// synced; the warm-up Job shows it.
func (cm *controllerManager) synced(context.Context) (bool, error) { return true, nil }

func (cm *controllerManager) cpu() (time.Duration, bool) { return measure.CPUTime(cm.proc.PID()) }
func (cm *controllerManager) pid() int                   { return cm.proc.PID() }

// heapProfile reads kube-controller-manager's heap profile (--profiling is on by default).
func (cm *controllerManager) heapProfile(ctx context.Context) ([]byte, error) {
	body, err := cm.get(ctx, "/debug/pprof/heap?gc=1")
	return []byte(body), err
}

// exited reports kube-controller-manager's exit, unless stop caused it.
func (cm *controllerManager) exited() <-chan error {
	cm.exitOnce.Do(func() {
		cm.exit = make(chan error, 1)
		go func() {
			for {
				if done, err := cm.proc.Exited(); done {
					if !cm.stopping.Load() {
						cm.exit <- fmt.Errorf("kube-controller-manager exited: %v\n%s", err, cm.proc.LogTail(4000))
					}
					return
				}
				time.Sleep(200 * time.Millisecond)
			}
		}()
	})
	return cm.exit
}

func (cm *controllerManager) get(ctx context.Context, path string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, cm.base+path, nil)
	if err != nil {
		return "", err
	}
	resp, err := cm.http.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return string(b), fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return string(b), nil
}

// snapshot reads the client request counters of kube-controller-manager from its
// /metrics: rest_client_requests_total counts a request once, with its final attempt;
// rest_client_request_retries_total counts the attempts before it. Their sum is every
// attempt, over every client of the process (all of them serve the Job controller: it is
// the only controller running, without leader election).
func (cm *controllerManager) snapshot(ctx context.Context) (calls, error) {
	if done, err := cm.proc.Exited(); done {
		return nil, fmt.Errorf("kube-controller-manager exited: %v\n%s", err, cm.proc.LogTail(4000))
	}
	body, err := cm.get(ctx, "/metrics")
	if err != nil {
		return nil, fmt.Errorf("scraping kube-controller-manager's /metrics: %w", err)
	}
	c, found, err := parseRequestMetrics(body, "rest_client_requests_total", "rest_client_request_retries_total")
	if err != nil {
		return nil, fmt.Errorf("kube-controller-manager's /metrics: %w", err)
	}
	if !found["rest_client_requests_total"] {
		return nil, errors.New("kube-controller-manager's /metrics has no rest_client_requests_total")
	}
	return c, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
