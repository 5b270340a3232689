package main

import (
	"context"
	"fmt"
	"slices"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coroner-dev/coroner/test/lab"
)

// controlPlane: a storm Job while kube-apiserver is restarted twice (once gracefully with
// SIGTERM, once crashing with SIGKILL) and etcd is paused (SIGSTOP) for 10s. After each
// fault, the time until the shim writes again (its recovery) is measured.
func controlPlane(ctx context.Context, e *env, o options) result {
	r := result{Name: "control-plane"}
	st, err := e.stage(ctx, "controlplane")
	if err != nil {
		return r.fail(err)
	}
	defer func() { st.end(len(r.Problems) > 0) }()
	ns, dir, tr := st.ns, st.dir, st.tr
	s := stormJob{Name: "storm", Completions: 60, Parallelism: 10,
		Fail: randomIndexes(e.rng, 60, 0.3), RunTicks: 8, RerunTicks: 8, Jitter: 5}
	if _, err := e.cs.BatchV1().Jobs(ns).Create(ctx, s.job(ns, dir), metav1.CreateOptions{}); err != nil {
		return r.fail(err)
	}
	if err := lab.Poll(ctx, 2*time.Minute, "the storm to start", func() (bool, error) {
		return tr.active(s.Name) >= int(s.Parallelism)/2, nil
	}); err != nil {
		return r.fail(err)
	}
	resume := e.pushUndo("SIGCONT etcd", func(context.Context) error { return e.cfg.ResumeEtcd() })

	var recoveries []time.Duration
	var faults []string
	recovered := func(what string, end time.Time) {
		var w time.Time
		_ = lab.Poll(ctx, 90*time.Second, "the shim to write again after "+what, func() (bool, error) {
			w = tr.firstWriteAfter(end)
			return !w.IsZero(), nil
		})
		if w.IsZero() {
			r.problem("the shim wrote nothing within 90s after %s", what)
			return
		}
		d := w.Sub(end)
		recoveries = append(recoveries, d)
		e.logf("control-plane: %s: the shim wrote again %.1fs after", what, d.Seconds())
	}
	for i, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		if err := lab.Sleep(ctx, e.jitter(4*time.Second, 10*time.Second)); err != nil {
			return r.fail(err)
		}
		rs, err := e.cfg.RestartAPIServer(ctx, sig)
		if err != nil {
			return r.fail(fmt.Errorf("restart %d of kube-apiserver: %w", i+1, err))
		}
		what := fmt.Sprintf("kube-apiserver restart %d (%v, pid %d -> %d, %.1fs without it)", i+1, sig, rs.OldPID, rs.NewPID, rs.Down.Seconds())
		e.logf("control-plane: %s", what)
		how := map[syscall.Signal]string{syscall.SIGTERM: "TERM", syscall.SIGKILL: "KILL"}[sig]
		if rs.Killed {
			how += "+KILL@10s"
		}
		faults = append(faults, fmt.Sprintf("apiserver %s (down %.0fs)", how, rs.Down.Seconds()))
		recovered(what, time.Now())
	}
	if err := lab.Sleep(ctx, e.jitter(4*time.Second, 10*time.Second)); err != nil {
		return r.fail(err)
	}
	if err := e.cfg.PauseEtcd(ctx, 10*time.Second); err != nil {
		return r.fail(fmt.Errorf("pause etcd: %w", err))
	}
	_ = resume(ctx)
	faults = append(faults, "etcd STOP 10s")
	e.logf("control-plane: etcd paused 10s, continued")
	recovered("etcd's 10s pause", time.Now())

	jobs, err := e.waitJobsFinished(ctx, ns, []string{s.Name}, 6*time.Minute)
	if err != nil {
		r.problem("%v", err)
	}
	truth, err := readJobTruth(dir, s.Name)
	if err != nil {
		return r.fail(err)
	}
	r.add(checkStormJob(s, jobs[s.Name], truth, tr.jobPodsOf(s.Name)), 1)
	r.Pods = len(tr.jobPodsOf(s.Name))
	r.Faults = joinComma(faults)
	if len(recoveries) > 0 {
		worst := slices.Max(recoveries)
		r.Failover = fmt.Sprintf("shim writes again: max %.1f", worst.Seconds())
		if worst > failoverGoal {
			r.problem("the shim wrote again %.1fs after a fault ended (goal %v)", worst.Seconds(), failoverGoal)
		}
	}
	return r
}

func joinComma(s []string) string {
	out := ""
	for i, x := range s {
		if i > 0 {
			out += ", "
		}
		out += x
	}
	return out
}
