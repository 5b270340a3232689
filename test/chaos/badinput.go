package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/coroner-dev/coroner/agent/exithistory"
	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/test/lab"
)

// starved is the name of the API priority level (and flow schema) that answers coroner's
// pod, Job and Event requests with 429 during the throttle window.
const starved = "coroner-chaos-starved"

// badInput feeds coroner what it must survive, and checks after each that no coroner
// container restarted or panicked and that the input is named in an Event or a log line:
//   - garbage in batch.kubernetes.io/job-index-failure-count and -ignored-failure-count of
//     running pods of a managed Job whose every index then fails once (the counts must be
//     read as 0, as the built-in controller reads them, and the Job complete), and garbage
//     coroner.dev/avoid-failed-nodes and coroner.dev/disruption-budget on that Job (it
//     runs as without them, each named in a Warning);
//   - garbage in coroner.dev/exit-history of a pod restarted in place (the agent must
//     write a valid history with the exits);
//   - CRI containers of pod UIDs the API server never heard of, on containerd 2.x (events)
//     and 1.6 (relist), exiting 7;
//   - 429s: an API priority level with no seats for coroner's ServiceAccounts (pods, Jobs,
//     Events; not Leases: leader election and fencing would end the replicas by design)
//     for 15s, while a managed Job's pods fail and a pod restarts in place; the stamps and
//     counts must land after. (500s are not injected: coroner talks to the API server
//     directly over TLS, and the lab has no proxy in between.)
//
// Opt-in annotations with values other than "true" are in the partition scenario, where
// they matter.
func badInput(ctx context.Context, e *env, o options) result {
	r := result{Name: "bad-input"}
	start := time.Now()
	before, err := e.restartCounts(ctx)
	if err != nil {
		return r.fail(err)
	}
	st, err := e.stage(ctx, "badinput")
	if err != nil {
		return r.fail(err)
	}
	defer func() { st.end(len(r.Problems) > 0) }()
	ns, dir, tr := st.ns, st.dir, st.tr
	var faults []string

	// 1. Garbage failure counts.
	garbage := stormJob{Name: "garbage-counts", Completions: 4, Parallelism: 4, Fail: []int{0, 1, 2, 3}, RunTicks: 16, RerunTicks: 4, Jitter: 1}
	garbageJob := garbage.job(ns, dir)
	// And garbage node-blame opt-ins: the Job runs as without them (its outcome is the
	// storm's truth), and each is named in a Warning.
	jobValues := []struct{ key, value string }{
		{v1alpha1.AnnotationAvoidFailedNodes, "always"},
		{v1alpha1.AnnotationDisruptionBudget, "gpu=3,device=-1"},
	}
	if garbageJob.Annotations == nil {
		garbageJob.Annotations = map[string]string{}
	}
	for _, v := range jobValues {
		garbageJob.Annotations[v.key] = v.value
	}
	if _, err := e.cs.BatchV1().Jobs(ns).Create(ctx, garbageJob, metav1.CreateOptions{}); err != nil {
		return r.fail(err)
	}
	// 2. Garbage exit history, on a pod restarted in place.
	hist := truthPod("garbage-history", ns, dir, "lab-node-1", corev1.RestartPolicyOnFailure, restartScript)
	hist.Annotations = map[string]string{conditions.AnnotationExitHistory: `{"not": "a list"`}
	if _, err := e.cs.CoreV1().Pods(ns).Create(ctx, hist, metav1.CreateOptions{}); err != nil {
		return r.fail(err)
	}
	values := []struct{ key, value string }{
		{batchv1.JobIndexFailureCountAnnotation, "garbage"},
		{batchv1.JobIndexFailureCountAnnotation, "-1"},
		{batchv1.JobIndexFailureCountAnnotation, "99999999999"},
		{batchv1.JobIndexIgnoredFailureCountAnnotation, "x"},
	}
	patched := map[int]bool{}
	err = lab.Poll(ctx, 2*time.Minute, "the garbage-counts pods running, then patched", func() (bool, error) {
		for _, p := range tr.jobPodsOf(garbage.Name) {
			ix := indexOf(p)
			if ix < 0 || ix >= len(values) || patched[ix] || p.Status.Phase != corev1.PodRunning {
				continue
			}
			v := values[ix]
			patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, v.key, v.value)
			if _, err := e.cs.CoreV1().Pods(ns).Patch(ctx, p.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
				return false, err
			}
			patched[ix] = true
		}
		return len(patched) == len(values), nil
	})
	if err != nil {
		return r.fail(err)
	}
	faults = append(faults, "4 garbage failure counts", "2 garbage node-blame opt-ins", "1 garbage exit history")

	// 3. CRI containers nobody asked for.
	var unknown []lab.UnknownContainer
	// The kubelet kills a running pod sandbox it does not know at its next housekeeping
	// (every 2 s, "Clean up containers for orphaned pod"), so a start may lose that race: a
	// CI run's container failed to start because the sandbox's pause process was gone
	// ("namespace path: lstat /proc/N/ns/ipc: no such file"). Such an attempt is noted and
	// made again; the fault is missing only when three attempts lose.
	for _, n := range []string{"lab-node-1", "lab-node-2"} {
		var errs []string
		for attempt := 1; attempt <= 3; attempt++ {
			u, err := e.cfg.RunUnknownContainer(ctx, n, fmt.Sprintf("chaos-unknown-%s-%d", strings.TrimPrefix(n, "lab-"), attempt), 7)
			if u.SandboxID != "" {
				u := u
				rm := e.pushUndo("remove the unknown sandbox on "+n, func(ctx context.Context) error { return e.cfg.RemoveUnknownContainer(ctx, u) })
				defer func() { _ = rm(context.Background()) }()
			}
			if err == nil {
				unknown = append(unknown, u)
				break
			}
			errs = append(errs, err.Error())
		}
		switch {
		case len(errs) == 3:
			r.problem("unknown CRI container on %s: not started in 3 attempts: %v", n, errs)
		case len(errs) > 0:
			r.note("unknown CRI container on %s: started at attempt %d (the kubelet's housekeeping won before: %v)", n, len(errs)+1, errs)
		}
	}
	faults = append(faults, fmt.Sprintf("%d unknown CRI pods", len(unknown)))

	jobs, err := e.waitJobsFinished(ctx, ns, []string{garbage.Name}, 3*time.Minute)
	if err != nil {
		r.problem("%v", err)
	}
	truth, err := readJobTruth(dir, garbage.Name)
	if err != nil {
		return r.fail(err)
	}
	r.add(checkStormJob(garbage, jobs[garbage.Name], truth, tr.jobPodsOf(garbage.Name)), 1)
	for _, u := range unknown {
		code, _, ok, err := e.cfg.ContainerExit(ctx, u.Node, u.ContainerID)
		if err != nil || !ok {
			r.note("the unknown container on %s: exited %v (%v)", u.Node, ok, err)
		} else {
			r.note("the unknown container on %s (pod uid %s) exited %d", u.Node, u.PodUID, code)
		}
	}

	// The garbage history replaced by a valid one with the exits.
	var histVal string
	err = lab.Poll(ctx, time.Minute, "garbage-history's exit-history valid, with its exits", func() (bool, error) {
		p, err := e.cs.CoreV1().Pods(ns).Get(ctx, hist.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		histVal = p.Annotations[conditions.AnnotationExitHistory]
		h, err := v1alpha1.ParseExitHistory(histVal)
		return err == nil && len(h) > 0, nil
	})
	if err != nil {
		r.problem("the garbage exit history was not replaced by the exits: %q (%v)", histVal, err)
		r.Lost++
	}

	// 4. 429s.
	throttled := stormJob{Name: "throttled", Completions: 3, Parallelism: 3, Fail: []int{0, 1, 2}, RunTicks: 8, RerunTicks: 4, Jitter: 1}
	if _, err := e.cs.BatchV1().Jobs(ns).Create(ctx, throttled.job(ns, dir), metav1.CreateOptions{}); err != nil {
		return r.fail(err)
	}
	restarter := truthPod("throttled-exits", ns, dir, "lab-node-3", corev1.RestartPolicyOnFailure, restartScript)
	if _, err := e.cs.CoreV1().Pods(ns).Create(ctx, restarter, metav1.CreateOptions{}); err != nil {
		return r.fail(err)
	}
	if err := lab.Poll(ctx, time.Minute, "the throttled pods running", func() (bool, error) {
		return tr.active(throttled.Name) == 3, nil
	}); err != nil {
		return r.fail(err)
	}
	rejectedBefore := rejected(ctx, e)
	unthrottle, err := throttle(ctx, e)
	if err != nil {
		return r.fail(err)
	}
	// The starved level still has a seat or so: a neighbour with coroner's own tokens keeps
	// it busy, so that coroner's requests find it taken.
	fl, err := flood(ctx, e, ns, 15*time.Second)
	if err != nil {
		_ = unthrottle(ctx)
		return r.fail(err)
	}
	rejectedN := rejected(ctx, e) - rejectedBefore - fl.rejected
	if err := unthrottle(ctx); err != nil {
		r.problem("remove the 429 flow schema: %v", err)
	}
	faults = append(faults, fmt.Sprintf("%d 429s to coroner in 15s", rejectedN))
	r.note("429 window: the API server rejected %d requests of coroner's ServiceAccounts besides %d of the suite's %d flooding requests", rejectedN, fl.rejected, fl.sent)
	if rejectedN <= 0 {
		// The starved level keeps a seat, so whether coroner's few requests of the window
		// find it taken is luck: say so, the counts below are checked either way.
		r.note("no 429 reached coroner in this run's window (the level keeps a seat); the suite's own requests got %d", fl.rejected)
	}
	if fl.rejected <= 0 {
		r.problem("the API server answered no 429 at all in the throttle window: the fault was not injected")
	}
	jobs, err = e.waitJobsFinished(ctx, ns, []string{throttled.Name}, 2*time.Minute)
	if err != nil {
		r.problem("%v", err)
	}
	truth, err = readJobTruth(dir, throttled.Name)
	if err != nil {
		return r.fail(err)
	}
	r.add(checkStormJob(throttled, jobs[throttled.Name], truth, tr.jobPodsOf(throttled.Name)), 1)
	restartTruth, _ := readRestartTruth(dir)
	err = lab.Poll(ctx, time.Minute, "throttled-exits' exits recorded", func() (bool, error) {
		p, err := e.cs.CoreV1().Pods(ns).Get(ctx, restarter.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		h, _ := v1alpha1.ParseExitHistory(p.Annotations[conditions.AnnotationExitHistory])
		restartTruth, _ = readRestartTruth(dir)
		want := 0
		for _, run := range restartTruth[restarter.Name] {
			if run.Exited {
				want++
			}
		}
		return want > 0 && len(h) >= min(want, exithistory.DefaultLimits.MaxEntries), nil
	})
	if err != nil {
		r.problem("exits of a pod restarted during the 429s not recorded: %v", err)
		r.Lost++
	}
	r.note("500s not injected: coroner reaches the API server directly over TLS (in-cluster config), the lab has no proxy to answer 500 in its stead; 429s come from the API server's own priority and fairness")

	// No restart, no panic; the garbage named somewhere.
	after, _ := e.restartCounts(ctx)
	if rs := restartsSince(before, after); len(rs) > 0 {
		r.problem("coroner containers restarted during bad input: %v", rs)
	}
	logs := e.coronerLogs(ctx, start)
	if p := panics(logs); len(p) > 0 {
		r.problem("panics: %v", p)
	}
	var silent []string
	for _, v := range values {
		// Each value named, not only the key: four garbage values, four mentions.
		evs := e.events(ctx, ns, v.key, strconv.Quote(v.value))
		lines := grepLogs(logs, v.key, v.value)
		if len(evs) == 0 && len(lines) == 0 {
			silent = append(silent, fmt.Sprintf("%s=%q", v.key, v.value))
		} else {
			r.note("%s=%q: %s", v.key, v.value, firstOf(append(evs, lines...)))
		}
	}
	if len(silent) > 0 {
		r.problem("garbage failure counts on pods of a managed Job read as 0 without an Event or a log line naming them: %s", joinComma(silent))
	}
	for _, v := range jobValues {
		if evs := e.events(ctx, ns, v.key, strconv.Quote(v.value)); len(evs) > 0 {
			r.note("%s=%q: %s", v.key, v.value, evs[0])
		} else {
			r.problem("the garbage %s=%q of a managed Job was ignored without a Warning naming it", v.key, v.value)
		}
	}
	if lines := grepLogs(logs, hist.Name, "exit-history"); len(lines) == 0 && len(e.events(ctx, ns, "exit-history")) == 0 {
		r.problem("the malformed coroner.dev/exit-history of %s was replaced without an Event or a log line naming it", hist.Name)
	}
	for _, u := range unknown {
		if lines := grepLogs(logs, u.PodUID); len(lines) > 0 {
			r.note("the agent on %s about the unknown pod: %s", u.Node, lines[0])
		}
	}
	if lines := grepLogs(logs, "429"); len(lines) > 0 {
		r.note("429 in coroner's logs: %d lines, e.g. %s", len(lines), lines[0])
	} else if lines := grepLogs(logs, "too many requests"); len(lines) > 0 {
		r.note("429 in coroner's logs: %d lines, e.g. %s", len(lines), lines[0])
	}
	r.Faults = joinComma(faults)
	r.Pods = len(tr.allPods())
	return r
}

func indexOf(p *corev1.Pod) int {
	v, ok := p.Annotations[batchv1.JobCompletionIndexAnnotation]
	if !ok {
		return -1
	}
	n := 0
	for _, ch := range v {
		if ch < '0' || ch > '9' {
			return -1
		}
		n = n*10 + int(ch-'0')
	}
	return n
}

func firstOf(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}

// throttle routes coroner's ServiceAccounts' requests for pods, Jobs and Events to a
// priority level without seats that rejects: every such request gets 429 until the
// returned undo removes it.
func throttle(ctx context.Context, e *env) (func(context.Context) error, error) {
	fc := e.cs.FlowcontrolV1()
	zero := int32(0)
	pl := &flowcontrolv1.PriorityLevelConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: starved},
		Spec: flowcontrolv1.PriorityLevelConfigurationSpec{
			Type: flowcontrolv1.PriorityLevelEnablementLimited,
			Limited: &flowcontrolv1.LimitedPriorityLevelConfiguration{
				NominalConcurrencyShares: &zero,
				LendablePercent:          &zero,
				BorrowingLimitPercent:    &zero,
				LimitResponse:            flowcontrolv1.LimitResponse{Type: flowcontrolv1.LimitResponseTypeReject},
			},
		},
	}
	var subjects []flowcontrolv1.Subject
	for _, sa := range []string{"coroner-agent", "coroner-shim"} {
		subjects = append(subjects, flowcontrolv1.Subject{Kind: flowcontrolv1.SubjectKindServiceAccount,
			ServiceAccount: &flowcontrolv1.ServiceAccountSubject{Namespace: lab.ShimNamespace, Name: sa}})
	}
	fs := &flowcontrolv1.FlowSchema{
		ObjectMeta: metav1.ObjectMeta{Name: starved},
		Spec: flowcontrolv1.FlowSchemaSpec{
			PriorityLevelConfiguration: flowcontrolv1.PriorityLevelConfigurationReference{Name: starved},
			MatchingPrecedence:         50,
			DistinguisherMethod:        &flowcontrolv1.FlowDistinguisherMethod{Type: flowcontrolv1.FlowDistinguisherMethodByUserType},
			Rules: []flowcontrolv1.PolicyRulesWithSubjects{{
				Subjects: subjects,
				ResourceRules: []flowcontrolv1.ResourcePolicyRule{{
					Verbs:        []string{"*"},
					APIGroups:    []string{"", "batch", "events.k8s.io"},
					Resources:    []string{"pods", "pods/status", "jobs", "jobs/status", "events"},
					ClusterScope: true,
					Namespaces:   []string{"*"},
				}},
			}},
		},
	}
	undo := e.pushUndo("delete the 429 flow schema "+starved, func(ctx context.Context) error {
		err1 := fc.FlowSchemas().Delete(ctx, starved, metav1.DeleteOptions{})
		err2 := fc.PriorityLevelConfigurations().Delete(ctx, starved, metav1.DeleteOptions{})
		if err1 != nil {
			return err1
		}
		return err2
	})
	if _, err := fc.PriorityLevelConfigurations().Create(ctx, pl, metav1.CreateOptions{}); err != nil {
		return undo, err
	}
	if _, err := fc.FlowSchemas().Create(ctx, fs, metav1.CreateOptions{}); err != nil {
		return undo, err
	}
	return undo, nil
}

// rejected sums apiserver_flowcontrol_rejected_requests_total of the starved level.
func rejected(ctx context.Context, e *env) int {
	b, err := e.cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return 0
	}
	n := 0.0
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "apiserver_flowcontrol_rejected_requests_total{") && strings.Contains(line, `priority_level="`+starved+`"`) {
			var v float64
			if _, err := fmt.Sscan(line[strings.LastIndex(line, " ")+1:], &v); err == nil {
				n += v
			}
		}
	}
	return int(n)
}

type floodStats struct{ sent, rejected int }

// flood lists every pod of the cluster with tokens of coroner's ServiceAccounts from 12
// goroutines each for d, counting its own requests and 429s.
func flood(ctx context.Context, e *env, ns string, d time.Duration) (floodStats, error) {
	var clients []kubernetes.Interface
	for _, sel := range []string{"app.kubernetes.io/name=coroner-agent", "app.kubernetes.io/name=coroner-shim"} {
		c, err := podToken(ctx, e, sel, "")
		if err != nil {
			return floodStats{}, err
		}
		clients = append(clients, c)
	}
	fctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var mu sync.Mutex
	var st floodStats
	var wg sync.WaitGroup
	for _, c := range clients {
		for range 12 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for fctx.Err() == nil {
					// No retries: client-go would otherwise wait out every Retry-After.
					// Every pod of the cluster: a request that holds its seat a while.
					err := c.CoreV1().RESTClient().Get().Resource("pods").MaxRetries(0).Do(fctx).Error()
					mu.Lock()
					st.sent++
					if apierrors.IsTooManyRequests(err) {
						st.rejected++
					}
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	return st, nil
}
