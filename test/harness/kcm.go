package harness

import (
	"fmt"
	"time"
)

// StartControllerManager starts kube-controller-manager v1.36.3 against the Env with only
// the given controllers (for example "job"), the reference that coroner's shim is compared
// with. It is stopped by Env.Stop, or earlier by the returned function. Only one may run
// per Env at a time.
func (e *Env) StartControllerManager(controllers ...string) (stop func(), err error) {
	if len(controllers) == 0 {
		return nil, fmt.Errorf("StartControllerManager: name at least one controller")
	}
	ports, err := freePorts(1)
	if err != nil {
		return nil, err
	}
	list := ""
	for i, c := range controllers {
		if i > 0 {
			list += ","
		}
		list += c
	}
	p, err := e.startProcess("kube-controller-manager",
		"--kubeconfig="+e.Kubeconfig,
		"--authentication-kubeconfig="+e.Kubeconfig,
		"--authorization-kubeconfig="+e.Kubeconfig,
		"--controllers="+list,
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", ports[0]),
		"--use-service-account-credentials=false",
		"--concurrent-job-syncs=5",
		"--v=2",
	)
	if err != nil {
		return nil, err
	}
	if err := waitTCP(p, hostPort(ports[0]), 30*time.Second); err != nil {
		return nil, err
	}
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
	}, nil
}
