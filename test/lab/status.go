package lab

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/coroner-dev/coroner/test/vm"
)

// ErrNotUp is Status's error when the lab is not (fully) up.
var ErrNotUp = errors.New("the lab is not up")

// Status prints the lab's processes, nodes and coroner's pods; ErrNotUp when it is not
// running as it should.
func Status(ctx context.Context, c Config) error {
	w := c.out()
	st, err := loadState(c.statePath())
	if err != nil {
		return err
	}
	if st == nil {
		fmt.Fprintln(w, "coroner lab: not up (no state file)")
		if c.anythingLeft() {
			fmt.Fprintln(w, "leftovers of a lab are on this machine: make lab-down removes them")
		}
		return ErrNotUp
	}
	fmt.Fprintf(w, "coroner lab: phase %s, started %s\n", st.Phase, st.StartedAt.Local().Format("2006-01-02 15:04:05"))
	down, kubeletsDown := 0, 0
	for _, p := range st.procs() {
		state := "running"
		if !p.running() {
			state = "NOT RUNNING"
			down++
			if strings.HasPrefix(p.Name, "kubelet-") {
				kubeletsDown++
				state += " (coronerctl chaos start-kubelet " + p.Node + " starts it again)"
			}
		}
		fmt.Fprintf(w, "  %-32s pid %-7d %s\n", p.Name, p.PID, state)
	}
	if _, ok := vmRunning(st); ok {
		state, err := vm.Status(ctx, c.vmMachine().QMP)
		if err != nil {
			state = err.Error()
		}
		fmt.Fprintf(w, "  %-32s %s\n", VMNode().Name+" guest (QMP)", state)
	}
	for _, n := range c.Nodes {
		if cut, err := c.Partitioned(n.Name); err == nil && cut {
			fmt.Fprintf(w, "  %s is partitioned: link %s is down (coronerctl chaos heal %s)\n", n.Name, n.HostVeth, n.Name)
		}
	}
	if down > kubeletsDown || st.Phase != phaseReady {
		fmt.Fprintln(w, "make lab repairs it (removes and starts again); make lab-down removes it")
		return ErrNotUp
	}
	if err := c.health(ctx, st); err != nil {
		fmt.Fprintf(w, "%v\n", err)
		return ErrNotUp
	}
	if out, err := c.Kubectl(ctx, nil, "get", "nodes", "-o", "wide"); err == nil {
		fmt.Fprintf(w, "\n%s\n", strings.TrimSpace(string(out)))
	}
	if len(st.Workloads) > 0 {
		fmt.Fprintln(w, "\ncoroner:")
		cs, err := c.Clientset()
		if err == nil {
			var sts []workloadStatus
			for _, wl := range st.Workloads {
				sts = append(sts, workloadState(ctx, cs, wl))
			}
			c.reportWorkloads(ctx, sts, func(format string, args ...any) { fmt.Fprintf(w, "  "+format+"\n", args...) })
		}
	}
	if out, err := c.Kubectl(ctx, nil, "get", "pods", "-A", "-o", "wide"); err == nil {
		fmt.Fprintf(w, "\n%s\n", strings.TrimSpace(string(out)))
	}
	fmt.Fprintf(w, "\nkubeconfig: %s\n", c.Kubeconfig())
	return nil
}

// Demo runs the demo Job on a lab that is up.
func Demo(ctx context.Context, c Config) error {
	st, err := loadState(c.statePath())
	if err != nil {
		return err
	}
	if st == nil || st.Phase == phaseStarting {
		return ErrNotUp
	}
	if err := c.health(ctx, st); err != nil {
		return fmt.Errorf("%w: %v", ErrNotUp, err)
	}
	pr := newProgress(c.out(), 1)
	return pr.step("demo Job", func() error {
		cs, err := c.Clientset()
		if err != nil {
			return err
		}
		var sts []workloadStatus
		for _, wl := range st.Workloads {
			sts = append(sts, workloadState(ctx, cs, wl))
		}
		if ok, why := shimRunning(sts); !ok {
			return fmt.Errorf("coroner-shim is not running (%s): the demo Job needs it", why)
		}
		return c.runDemo(ctx, pr.say, 2*time.Minute)
	})
}
