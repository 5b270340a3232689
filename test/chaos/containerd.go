package main

import (
	"context"
	"fmt"
	"strconv"
	"syscall"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coroner-dev/coroner/test/lab"
)

// containerdDown is how long containerd stays down: RestartSec of containerd.service.
const containerdDown = 5 * time.Second

// containerdRestart: a storm Job on lab-node-3 (containerd 1.7), lab-node-2 (1.6) and
// lab-node-1 (2.x) while each node's containerd is restarted in turn (1.7 and 2.x killed,
// 1.6 stopped). No exit may be lost: every exit a
// pod recorded must make its pod terminal with that exit code and be counted by the Job.
// An exit whose code the runtime rewrote (containerd 2.x and 1.7 report a container that
// exited while it was down as 255 Unknown after its restart, docs/node-configurations.md) is
// reported as such, and the Job outcome is then judged against the codes the runtime
// reported.
func containerdRestart(ctx context.Context, e *env, o options) result {
	r := result{Name: "containerd-restart"}
	st, err := e.stage(ctx, "containerd")
	if err != nil {
		return r.fail(err)
	}
	defer func() { st.end(len(r.Problems) > 0) }()
	ns, dir, tr := st.ns, st.dir, st.tr
	nodes := []string{"lab-node-3", "lab-node-2", "lab-node-1"}
	s := stormJob{Name: "storm", Completions: 60, Parallelism: 16, Nodes: nodes,
		Fail: randomIndexes(e.rng, 60, 0.3), RunTicks: 4, RerunTicks: 4, Jitter: 8}
	if _, err := e.cs.BatchV1().Jobs(ns).Create(ctx, s.job(ns, dir), metav1.CreateOptions{}); err != nil {
		return r.fail(err)
	}
	if err := lab.Poll(ctx, 2*time.Minute, "the storm to start", func() (bool, error) {
		return tr.active(s.Name) >= int(s.Parallelism)/2, nil
	}); err != nil {
		return r.fail(err)
	}
	var faults []string
	windows := map[string][2]float64{}
	sigs := map[string]syscall.Signal{"lab-node-3": syscall.SIGKILL, "lab-node-2": syscall.SIGTERM, "lab-node-1": syscall.SIGKILL}
	for _, n := range nodes {
		if err := lab.Sleep(ctx, e.jitter(2*time.Second, 6*time.Second)); err != nil {
			return r.fail(err)
		}
		u0, _ := uptime()
		rs, err := e.cfg.RestartContainerd(ctx, n, sigs[n], containerdDown)
		u1, _ := uptime()
		windows[n] = [2]float64{u0, u1}
		if err != nil {
			return r.fail(fmt.Errorf("restart containerd on %s: %w", n, err))
		}
		e.logf("containerd-restart: %s: %v, pid %d -> %d, CRI ready again after %.1fs", n, sigs[n], rs.OldPID, rs.NewPID, rs.Down.Seconds())
		faults = append(faults, fmt.Sprintf("%s %s down %.1fs", n, map[syscall.Signal]string{syscall.SIGKILL: "KILL", syscall.SIGTERM: "TERM"}[sigs[n]], rs.Down.Seconds()))
	}
	jobs, err := e.waitJobsFinished(ctx, ns, []string{s.Name}, 5*time.Minute)
	if err != nil {
		r.problem("%v", err)
	}
	truth, err := readJobTruth(dir, s.Name)
	if err != nil {
		return r.fail(err)
	}
	pods := tr.jobPodsOf(s.Name)
	byName := map[string]*corev1.Pod{}
	for _, p := range pods {
		byName[p.Name] = p
	}
	// Every recorded exit: its pod terminal, with that code (or a rewritten one).
	exits, lost, during := 0, 0, 0
	rewritten := map[int]int{} // index -> exits reported failed whose pod exited 0
	var lostPods, rewrites []string
	for ix, as := range truth {
		for _, a := range as {
			if !a.Exited {
				continue
			}
			exits++
			if w, ok := windows[a.Node]; ok && a.End >= w[0] && a.End <= w[1] {
				during++
			}
			p := byName[a.Pod]
			var t *corev1.ContainerStateTerminated
			if p != nil {
				t = mainTerminated(p)
			}
			switch {
			case p == nil || t == nil || (p.Status.Phase != corev1.PodFailed && p.Status.Phase != corev1.PodSucceeded):
				lost++
				lostPods = append(lostPods, a.Pod)
			case int(t.ExitCode) != a.Code:
				rewrites = append(rewrites, fmt.Sprintf("%s on %s exited %d, the runtime says %d (%s)", a.Pod, a.Node, a.Code, t.ExitCode, t.Reason))
				if a.Code == 0 {
					rewritten[ix]++
				}
			}
		}
	}
	if lost > 0 {
		r.problem("%d exits lost (pod never terminal): %v", lost, lostPods)
	}
	c := checkStormJob(s, jobs[s.Name], truth, pods)
	if len(rewrites) > 0 {
		r.note("exit codes rewritten by the runtime: %v", rewrites)
		// Judge the Job against the codes the runtime reported: an index may then have
		// failed (and be counted) once more than its pods' own record says.
		c = rejudge(c, s, jobs[s.Name], truth, pods, rewritten)
	}
	r.add(c, 1)
	r.Lost += lost
	r.Pods = len(pods)
	r.Faults = "containerd restarted: " + joinComma(faults)
	r.note("%d exits, %d of them while a containerd was restarting", exits, during)
	return r
}

// rejudge redoes checkStormJob's count checks with the failures the runtime reported:
// the pods' own failures plus the successes the runtime turned into failures.
func rejudge(c jobCheck, s stormJob, j *batchv1.Job, truth jobTruth, pods []*corev1.Pod, rewritten map[int]int) jobCheck {
	extra := 0
	for _, n := range rewritten {
		extra += n
	}
	var out jobCheck
	out.Overlap, out.OverlapIndex = c.Overlap, c.OverlapIndex
	if out.Overlap > 0 {
		out.problem("index %d ran twice at once for %.2fs", c.OverlapIndex, c.Overlap)
	}
	if j == nil || finishedCondition(j) == nil {
		out.problem("the Job did not finish")
		return out
	}
	// Pods that ended without an exit of their own (never started, or deleted as the Job
	// failed) may each be one failure more (unrecordedFailures).
	unrec := unrecordedFailures(truth, pods)
	want := truth.failures() + extra
	if d := int(j.Status.Failed) - want - len(unrec); d > 0 {
		out.Double += d
		out.problem("status.failed %d, %d failures reported by the runtime and %d pods that ended without an exit of their own (%v): %d counted twice",
			j.Status.Failed, want, len(unrec), unrec, d)
	} else if d := want - int(j.Status.Failed); d > 0 {
		out.Lost += d
		out.problem("status.failed %d, %d failures reported by the runtime: %d lost", j.Status.Failed, want, d)
	}
	// Indexes failed twice (once by the pod, once by the runtime's rewrite) are expected to
	// fail with backoffLimitPerIndex 1; the others must complete.
	expectFailed := map[int]bool{}
	for ix, n := range rewritten {
		if truth.failuresOf(ix)+n > 1 {
			expectFailed[ix] = true
		}
	}
	for ix := 0; ix < int(*j.Spec.Completions); ix++ {
		succeeded := false
		for _, p := range pods {
			if p.Annotations[batchv1.JobCompletionIndexAnnotation] == strconv.Itoa(ix) && p.Status.Phase == corev1.PodSucceeded {
				succeeded = true
			}
		}
		if !succeeded && !expectFailed[ix] {
			out.problem("index %d did not succeed and no rewritten exit explains it", ix)
		}
	}
	out.Notes = append(out.Notes, c.Notes...)
	out.Notes = append(out.Notes, fmt.Sprintf("the Job ended %s; indexes failed by rewritten exit codes: %d", finishedCondition(j).Type, len(expectFailed)))
	return out
}
