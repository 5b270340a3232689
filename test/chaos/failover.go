package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/test/lab"
)

// failoverGoal is the bar of a shim failover: the standby leads and syncs within it.
const failoverGoal = 20 * time.Second

// shimFailover: an Indexed Job of opts.completions indexes, 30% of which fail once, with
// backoffLimitPerIndex 1, while the shim's leader is SIGKILLed opts.kills times at random
// moments (each time once the other replica stands by). Each failover is timed from the
// kill to the other replica holding the Lease, and to its first write (a Job status
// update or a pod created: the storm always has work for it).
func shimFailover(ctx context.Context, e *env, o options) result {
	r := result{Name: "shim-leader-kill"}
	st, err := e.stage(ctx, "failover")
	if err != nil {
		return r.fail(err)
	}
	defer func() { st.end(len(r.Problems) > 0) }()
	ns, dir, tr := st.ns, st.dir, st.tr

	s := stormJob{Name: "storm", Completions: int32(o.completions), Parallelism: int32(o.parallelism),
		Fail: randomIndexes(e.rng, o.completions, 0.3), RunTicks: 12, RerunTicks: 12, Jitter: 5}
	if _, err := e.cs.BatchV1().Jobs(ns).Create(ctx, s.job(ns, dir), metav1.CreateOptions{}); err != nil {
		return r.fail(err)
	}
	e.logf("failover: Job %s/%s: %d completions, parallelism %d, %d indexes fail once", ns, s.Name, s.Completions, s.Parallelism, len(s.Fail))
	if err := lab.Poll(ctx, 2*time.Minute, "the storm to start", func() (bool, error) {
		return tr.active(s.Name) >= int(s.Parallelism)/2, nil
	}); err != nil {
		return r.fail(err)
	}

	var leads, syncs []time.Duration
	restarted, replaced, byRestarted := 0, 0, 0
	afterStorm := 0
	for len(leads) < o.kills {
		// A kill needs work for the new leader: not in the storm's last wave.
		if j, err := e.cs.BatchV1().Jobs(ns).Get(ctx, s.Name, metav1.GetOptions{}); err == nil &&
			(finishedCondition(j) != nil || j.Status.Succeeded >= s.Completions-2*s.Parallelism) {
			break
		}
		if err := waitStandby(ctx, e); err != nil {
			return r.fail(fmt.Errorf("before kill %d: %w", len(leads)+1, err))
		}
		if err := lab.Sleep(ctx, e.jitter(500*time.Millisecond, 4*time.Second)); err != nil {
			return r.fail(err)
		}
		k, err := e.cfg.KillShimLeader(ctx, e.cs)
		if err != nil {
			return r.fail(fmt.Errorf("kill %d: %w", len(leads)+1, err))
		}
		var newHolder string
		var led time.Time
		err = lab.Poll(ctx, 90*time.Second, "another replica to hold the Lease", func() (bool, error) {
			h, _, err := lab.LeaseHolder(ctx, e.cs, lab.ShimNamespace, lab.ShimLease)
			if err != nil || h == "" || h == k.Identity {
				return false, nil
			}
			newHolder, led = h, time.Now()
			return true, nil
		})
		if err != nil {
			return r.fail(fmt.Errorf("kill %d of %s: %w", len(leads)+1, k.Pod, err))
		}
		var synced time.Time
		_ = lab.Poll(ctx, 60*time.Second, "the new leader's first write", func() (bool, error) {
			synced = tr.firstWriteAfter(led)
			return !synced.IsZero(), nil
		})
		lead := led.Sub(k.At)
		if synced.IsZero() {
			if j, err := e.cs.BatchV1().Jobs(ns).Get(ctx, s.Name, metav1.GetOptions{}); err == nil {
				if fc := finishedCondition(j); fc != nil && !fc.LastTransitionTime.After(led) {
					// The storm ended before the new leader led: nothing to sync, not a
					// failover under load.
					afterStorm++
					e.logf("failover: kill after the storm ended (the Job finished at %v): not counted", fc.LastTransitionTime.Format("15:04:05"))
					break
				}
			}
		}
		leads = append(leads, lead)
		if lab.PodOfIdentity(newHolder) == k.Pod {
			// The kubelet restarted the killed container and it won the expired Lease first.
			byRestarted++
		}
		if synced.IsZero() {
			r.problem("kill %d: the new leader %s wrote nothing within 60s of leading", len(leads), lab.PodOfIdentity(newHolder))
			syncs = append(syncs, time.Hour)
		} else {
			syncs = append(syncs, synced.Sub(k.At))
		}
		e.logf("failover: kill %d: SIGKILL %s (pid %d on %s); %s leads after %.1fs, first write after %.1fs",
			len(leads), k.Pod, k.PID, k.Node, lab.PodOfIdentity(newHolder), lead.Seconds(), syncs[len(syncs)-1].Seconds())
		// The killed replica comes back: the kubelet restarts its container (with its crash
		// back-off); once the back-off would keep it down for long, its pod is deleted and
		// the Deployment makes a fresh one, so that the next kill has a standby.
		how, err := recoverReplica(ctx, e, k)
		if err != nil {
			return r.fail(err)
		}
		if how == "restarted" {
			restarted++
		} else {
			replaced++
		}
	}

	jobs, err := e.waitJobsFinished(ctx, ns, []string{s.Name}, 8*time.Minute)
	if err != nil {
		r.problem("%v", err)
	}
	truth, err := readJobTruth(dir, s.Name)
	if err != nil {
		return r.fail(err)
	}
	c := checkStormJob(s, jobs[s.Name], truth, tr.jobPodsOf(s.Name))
	r.add(c, 1)
	r.Pods = len(tr.jobPodsOf(s.Name))
	r.Faults = fmt.Sprintf("%d SIGKILLs of the leader", len(leads))
	if len(leads) < o.kills {
		r.problem("only %d kills before the Job finished (want %d): raise -completions", len(leads), o.kills)
	}
	worst := slices.Max(append(slices.Clone(syncs), 0))
	r.Failover = fmt.Sprintf("lead p50 %.1f max %.1f; sync max %.1f", pct(leads, 50), pct(leads, 100), worst.Seconds())
	for i, d := range syncs {
		if d > failoverGoal {
			r.problem("kill %d: the standby led and synced %.1fs after the kill (goal %v)", i+1, d.Seconds(), failoverGoal)
		}
	}
	if afterStorm > 0 {
		r.note("%d kill(s) after the Job had finished, not counted", afterStorm)
	}
	r.note("killed replicas: %d restarted by the kubelet, %d replaced (pod deleted once its crash back-off was long); the Lease went to the standby %d times, to the killed replica's restarted container %d times", restarted, replaced, len(leads)-byRestarted, byRestarted)
	return r
}

// waitStandby waits until both shim replicas run (containers running, pods not being
// deleted) and one holds the Lease: the next kill then has a standby to fail over to.
func waitStandby(ctx context.Context, e *env) error {
	return lab.Poll(ctx, 3*time.Minute, "two shim replicas running, one leading", func() (bool, error) {
		pods, err := e.cs.CoreV1().Pods(lab.ShimNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=coroner-shim"})
		if err != nil {
			return false, nil
		}
		running := 0
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil {
				continue
			}
			for _, s := range p.Status.ContainerStatuses {
				// Running for 2s: the process has started its leader elector.
				if s.Name == lab.ShimContainer && s.State.Running != nil && time.Since(s.State.Running.StartedAt.Time) > 2*time.Second {
					running++
				}
			}
		}
		if running < 2 {
			return false, nil
		}
		h, renew, err := lab.LeaseHolder(ctx, e.cs, lab.ShimNamespace, lab.ShimLease)
		return err == nil && h != "" && time.Since(renew) < 5*time.Second, nil
	})
}

// replicaBackWithin is how long the kubelet has to restart a killed shim container before
// its pod is deleted for a fresh one (its crash back-off doubles from 10s per restart).
const replicaBackWithin = 5 * time.Second

// recoverReplica waits for the killed shim container to run again; if the kubelet's
// crash back-off keeps it down for more than replicaBackWithin, the pod is deleted (grace
// 0) for the Deployment to replace: the failover was measured already, the next kill needs
// a standby.
func recoverReplica(ctx context.Context, e *env, k lab.ShimKill) (string, error) {
	deadline := time.Now().Add(replicaBackWithin)
	for time.Now().Before(deadline) {
		p, err := e.cs.CoreV1().Pods(lab.ShimNamespace).Get(ctx, k.Pod, metav1.GetOptions{})
		if err == nil {
			for _, s := range p.Status.ContainerStatuses {
				if s.Name == lab.ShimContainer && s.State.Running != nil && !strings.HasSuffix(s.ContainerID, k.ContainerID) {
					return "restarted", nil
				}
			}
		}
		if err := lab.Sleep(ctx, 250*time.Millisecond); err != nil {
			return "", err
		}
	}
	err := e.cs.CoreV1().Pods(lab.ShimNamespace).Delete(ctx, k.Pod, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	if err != nil {
		return "", fmt.Errorf("delete the crash-looping shim pod %s: %w", k.Pod, err)
	}
	return "replaced", nil
}

// pct is the p-th percentile of ds in seconds (nearest rank).
func pct(ds []time.Duration, p int) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (p*len(s) + 99) / 100
	if i > 0 {
		i--
	}
	return s[min(i, len(s)-1)].Seconds()
}
