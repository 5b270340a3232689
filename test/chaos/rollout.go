package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coroner-dev/coroner/agent/exithistory"
	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/test/lab"
)

const (
	agentDaemonSet = "coroner-agent"
	agentContainer = "agent"
)

// agentRollout: while containers on every node exit (restarted in place: each exit must
// land in coroner.dev/exit-history) and pods go over their memory limit (each OOM kill
// must be stamped coroner.dev/OOMKilled), the agent DaemonSet is rolled to a new image tag
// (the same image under another name, as a release would be) and back: every node's
// agent is replaced twice, and the agents reconcile what happened while none watched.
func agentRollout(ctx context.Context, e *env, o options) result {
	r := result{Name: "agent-rollout"}
	st, err := e.stage(ctx, "rollout")
	if err != nil {
		return r.fail(err)
	}
	defer func() { st.end(len(r.Problems) > 0) }()
	ns, dir, tr := st.ns, st.dir, st.tr

	ds, err := e.cs.AppsV1().DaemonSets(lab.ShimNamespace).Get(ctx, agentDaemonSet, metav1.GetOptions{})
	if err != nil {
		return r.fail(err)
	}
	orig := ""
	for _, c := range ds.Spec.Template.Spec.Containers {
		if c.Name == agentContainer {
			orig = c.Image
		}
	}
	if orig == "" {
		return r.fail(fmt.Errorf("no container %s in daemonset %s", agentContainer, agentDaemonSet))
	}
	base := orig
	if i := strings.LastIndex(orig, ":"); i > strings.LastIndex(orig, "/") {
		base = orig[:i]
	}
	// Two new tags, so that the agents are replaced four times: the agent starts in a
	// second here, one rollout takes a few.
	var newImages []string
	var untags []func(context.Context) error
	for _, t := range []string{"a", "b"} {
		img := base + ":chaos-" + e.runID + "-" + t
		if err := e.cfg.TagImage(ctx, orig, img); err != nil {
			return r.fail(err)
		}
		newImages = append(newImages, img)
		untags = append(untags, e.pushUndo("untag "+img, func(ctx context.Context) error { return e.cfg.UntagImage(ctx, img) }))
	}
	restore := e.pushUndo("set the agent image back to "+orig, func(ctx context.Context) error {
		return setAgentImage(ctx, e, orig)
	})

	// Containers restarted in place, two per node.
	var restarters []string
	for _, n := range e.cfg.Nodes {
		for i := range 2 {
			name := fmt.Sprintf("restarter-%d-%d", n.Index, i)
			if _, err := e.cs.CoreV1().Pods(ns).Create(ctx, truthPod(name, ns, dir, n.Name, corev1.RestartPolicyOnFailure, restartScript), metav1.CreateOptions{}); err != nil {
				return r.fail(err)
			}
			restarters = append(restarters, name)
		}
	}
	// Pods over their memory limit, one every 0.7s round the nodes, until the rollouts end.
	oomCtx, stopOOM := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var oomPods []string
	var oomErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; oomCtx.Err() == nil; i++ {
			n := e.cfg.Nodes[i%len(e.cfg.Nodes)]
			name := fmt.Sprintf("oom-%d-%d", n.Index, i)
			p := truthPod(name, ns, dir, n.Name, corev1.RestartPolicyNever, "sleep 1; exec memhog")
			p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("24Mi")}
			if _, err := e.cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
				oomErr = err
				return
			}
			oomPods = append(oomPods, name)
			_ = lab.Sleep(oomCtx, 700*time.Millisecond)
		}
	}()

	_ = lab.Sleep(ctx, 8*time.Second)
	rollStart := time.Now()
	for _, img := range []string{newImages[0], orig, newImages[1], orig} {
		e.logf("agent-rollout: rolling %s to %s", agentDaemonSet, img)
		if err := setAgentImage(ctx, e, img); err != nil {
			stopOOM()
			wg.Wait()
			return r.fail(err)
		}
	}
	_ = restore(ctx)
	rollEnd := time.Now()
	stopOOM()
	wg.Wait()
	if oomErr != nil {
		r.problem("creating OOM pods: %v", oomErr)
	}
	e.logf("agent-rollout: four rollouts in %.1fs; %d OOM pods", rollEnd.Sub(rollStart).Seconds(), len(oomPods))

	// Every OOM pod terminal and stamped, every exit recorded: the agents have up to 60s.
	var unstamped, exitsMissing []string
	var oomExits, oomDuring, stamped, exits, recorded, dup int
	check := func() bool {
		unstamped, exitsMissing = nil, nil
		oomExits, oomDuring, stamped, exits, recorded, dup = 0, 0, 0, 0, 0, 0
		pods := map[string]*corev1.Pod{}
		for _, p := range tr.allPods() {
			pods[p.Name] = p
		}
		for _, name := range oomPods {
			p := pods[name]
			if p == nil || p.Status.Phase != corev1.PodFailed {
				unstamped = append(unstamped, name+" (not failed yet)")
				continue
			}
			t := mainTerminated(p)
			if t == nil || t.Reason != "OOMKilled" {
				r.note("%s failed without the kernel's OOM kill (%+v): not counted", name, t)
				continue
			}
			oomExits++
			if !t.FinishedAt.Time.Before(rollStart.Truncate(time.Second)) && !t.FinishedAt.After(rollEnd) {
				oomDuring++
			}
			if c := condition(p, conditions.OOMKilled); c != nil && c.Status == corev1.ConditionTrue && c.Reason == conditions.ReasonMemoryLimitExceeded {
				stamped++
			} else {
				unstamped = append(unstamped, name+" on "+p.Spec.NodeName)
			}
		}
		truth, err := readRestartTruth(dir)
		if err != nil {
			unstamped = append(unstamped, err.Error())
			return false
		}
		for _, name := range restarters {
			p := pods[name]
			if p == nil {
				continue
			}
			hist, _ := v1alpha1.ParseExitHistory(p.Annotations[conditions.AnnotationExitHistory])
			seen := map[int32]int{}
			for _, h := range hist {
				seen[h.RestartCount]++
			}
			for _, n := range seen {
				if n > 1 {
					dup += n - 1
				}
			}
			runs := truth[name]
			for i, run := range runs {
				if !run.Exited {
					continue
				}
				if len(runs)-i > exithistory.DefaultLimits.MaxEntries {
					continue // older than the bounded history keeps
				}
				exits++
				if seen[int32(run.Ordinal)] > 0 {
					recorded++
				} else {
					exitsMissing = append(exitsMissing, fmt.Sprintf("%s run %d", name, run.Ordinal))
				}
			}
		}
		return len(unstamped) == 0 && len(exitsMissing) == 0
	}
	_ = lab.Poll(ctx, 60*time.Second, "every exit stamped", func() (bool, error) { return check(), nil })
	for _, name := range restarters {
		_ = e.cs.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{})
	}
	for _, u := range untags {
		_ = u(ctx)
	}

	r.Faults = fmt.Sprintf("4 rollouts (%.0fs): %d exits, %d OOM kills (%d during the rollouts)", rollEnd.Sub(rollStart).Seconds(), exits, oomExits, oomDuring)
	r.Pods = len(oomPods) + len(restarters)
	r.Lost = (oomExits - stamped) + (exits - recorded)
	r.Double = dup
	if len(unstamped) > 0 {
		r.problem("OOM kills not stamped coroner.dev/OOMKilled: %v", unstamped)
	}
	if len(exitsMissing) > 0 {
		r.problem("exits missing from coroner.dev/exit-history: %v", exitsMissing)
	}
	if dup > 0 {
		r.problem("%d exits recorded twice in coroner.dev/exit-history", dup)
	}
	if oomDuring == 0 || exits == 0 {
		r.problem("the load made %d OOM kills during the rollouts and %d exits: nothing to check", oomDuring, exits)
	}
	// The new agents run, never restarted.
	pods, _ := e.coronerPods(ctx)
	for _, p := range pods {
		if strings.HasPrefix(p.Name, agentDaemonSet) {
			for _, s := range p.Status.ContainerStatuses {
				if s.RestartCount > 0 {
					r.problem("agent %s restarted %d times after the rollout", p.Name, s.RestartCount)
				}
			}
		}
	}
	return r
}

// setAgentImage sets the agent container's image and waits for the rollout.
func setAgentImage(ctx context.Context, e *env, image string) error {
	out, err := e.cfg.Kubectl(ctx, nil, "-n", lab.ShimNamespace, "set", "image", "daemonset/"+agentDaemonSet, agentContainer+"="+image)
	if err != nil {
		return fmt.Errorf("kubectl set image: %w %s", err, out)
	}
	// Five minutes for the process nodes; the VM node, under software emulation, starts a
	// pod in 10-20 s alone but in minutes while the other nodes run the scenario's load
	// (measured in CI: its new agent Ready 2.5 min after it started).
	wait := 5 * time.Minute
	if _, err := e.cs.CoreV1().Nodes().Get(ctx, lab.VMNode().Name, metav1.GetOptions{}); err == nil {
		wait = 10 * time.Minute
	}
	return lab.Poll(ctx, wait, "the agent DaemonSet rolled out to "+image, func() (bool, error) {
		ds, err := e.cs.AppsV1().DaemonSets(lab.ShimNamespace).Get(ctx, agentDaemonSet, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		return rolledOut(ds), nil
	})
}

// rolledOut is kubectl rollout status's test for a DaemonSet.
func rolledOut(ds *appsv1.DaemonSet) bool {
	st := ds.Status
	return ds.Generation <= st.ObservedGeneration &&
		st.UpdatedNumberScheduled == st.DesiredNumberScheduled &&
		st.NumberAvailable == st.DesiredNumberScheduled && st.NumberReady == st.DesiredNumberScheduled
}
