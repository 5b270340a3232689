package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/coroner-dev/coroner/test/host"
)

// StartControllerManager starts kube-controller-manager v1.36.3 against the Env with only
// the given controllers (for example "job"), the reference that coroner's shim is compared
// with. It is stopped by Env.Stop, or earlier by the returned function. Only one may run
// per Env at a time.
func (e *Env) StartControllerManager(controllers ...string) (stop func(), err error) {
	return e.StartControllerManagerWith(nil, controllers...)
}

// StartControllerManagerWith is StartControllerManager with flags appended to the
// harness's own (a later --flag=value wins): for example a higher --kube-api-qps, or the
// node lifecycle controller's periods.
func (e *Env) StartControllerManagerWith(flags []string, controllers ...string) (stop func(), err error) {
	if len(controllers) == 0 {
		return nil, fmt.Errorf("StartControllerManager: name at least one controller")
	}
	ports, err := freePorts(1)
	if err != nil {
		return nil, err
	}
	args := append([]string{
		"--kubeconfig=" + e.Kubeconfig,
		"--authentication-kubeconfig=" + e.Kubeconfig,
		"--authorization-kubeconfig=" + e.Kubeconfig,
		"--controllers=" + strings.Join(controllers, ","),
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", ports[0]),
		"--use-service-account-credentials=false",
		"--concurrent-job-syncs=5",
		"--v=2",
	}, flags...)
	p, err := e.startProcess("kube-controller-manager", args...)
	if err != nil {
		return nil, err
	}
	if err := waitTCP(p, hostPort(ports[0]), 30*time.Second); err != nil {
		return nil, err
	}
	return e.stopper(p), nil
}

// StartScheduler starts kube-scheduler v1.36.3 against the Env, its client allowed qps
// requests per second (the scheduler's own default is 50, which binds 10,000 pods in
// over 3 minutes). It is stopped by Env.Stop, or earlier by the returned function.
func (e *Env) StartScheduler(qps int) (stop func(), err error) {
	ports, err := freePorts(1)
	if err != nil {
		return nil, err
	}
	cfg := filepath.Join(e.Dir, "kube-scheduler.yaml")
	body := fmt.Sprintf(`apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: %q
  qps: %d
  burst: %d
leaderElection:
  leaderElect: false
`, e.Kubeconfig, qps, 2*qps)
	if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
		return nil, err
	}
	p, err := e.startProcess("kube-scheduler",
		"--config="+cfg,
		"--authentication-kubeconfig="+e.Kubeconfig,
		"--authorization-kubeconfig="+e.Kubeconfig,
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", ports[0]),
		"--v=1",
	)
	if err != nil {
		return nil, err
	}
	if err := waitTCP(p, hostPort(ports[0]), 30*time.Second); err != nil {
		return nil, err
	}
	return e.stopper(p), nil
}

// stopper stops p and forgets it.
func (e *Env) stopper(p *host.Process) func() {
	return func() {
		p.Stop(10 * time.Second)
		e.mu.Lock()
		defer e.mu.Unlock()
		for i, q := range e.procs {
			if q == p {
				e.procs = append(e.procs[:i], e.procs[i+1:]...)
				break
			}
		}
	}
}
