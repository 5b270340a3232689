package main

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/test/lab"
)

const partitionFor = 60 * time.Second

// partition: three Jobs whose first pods run on lab-node-3 (they tolerate unreachable for
// 5s, so the taint manager deletes them: zombies), the node cut off for 60s and healed.
//   - fenced: opted in (coroner.dev/safe-to-forcefully-delete "true"): the node's agent
//     stops the containers after --fence-after, the shim recovers the pods (NodeFenced) and
//     the replacements run on lab-node-1 while the node is still cut off;
//   - not-opted-in: no annotation: nobody may say the pods stopped, so the replacements
//     wait for the node to come back and its kubelet to end them;
//   - bad-opt-in: the annotation with "True" (not "true"): the same as not opted in.
//
// No index may run twice at once, whatever the pods' record says.
func partition(ctx context.Context, e *env, o options) result {
	r := result{Name: "partition"}
	st, err := e.stage(ctx, "partition")
	if err != nil {
		return r.fail(err)
	}
	defer func() { st.end(len(r.Problems) > 0) }()
	ns, dir, tr := st.ns, st.dir, st.tr
	const node, other = "lab-node-3", "lab-node-1"
	jobs := []stormJob{
		{Name: "fenced", Annotations: map[string]string{conditions.AnnotationSafeToForcefullyDelete: "true"}},
		{Name: "not-opted-in"},
		{Name: "bad-opt-in", Annotations: map[string]string{conditions.AnnotationSafeToForcefullyDelete: "True"}},
	}
	var names []string
	for i := range jobs {
		s := &jobs[i]
		// The first attempt outlives the partition; a replacement takes 5s.
		s.Completions, s.Parallelism, s.RunTicks, s.RerunTicks, s.Jitter = 2, 2, 360, 10, 1
		s.Nodes, s.Prefer, s.EvictAfter = []string{node, other}, node, ptr.To[int64](5)
		if _, err := e.cs.BatchV1().Jobs(ns).Create(ctx, s.job(ns, dir), metav1.CreateOptions{}); err != nil {
			return r.fail(err)
		}
		names = append(names, s.Name)
	}
	first := map[string]*corev1.Pod{}
	err = lab.Poll(ctx, 2*time.Minute, "every first pod running on "+node, func() (bool, error) {
		first = map[string]*corev1.Pod{}
		running := 0
		for _, p := range tr.allPods() {
			if p.Status.Phase == corev1.PodRunning {
				running++
				first[p.Name] = p
			}
		}
		return running == 6, nil
	})
	if err != nil {
		return r.fail(err)
	}
	for _, p := range first {
		if p.Spec.NodeName != node {
			return r.fail(fmt.Errorf("pod %s runs on %s, not on %s (its preferred node)", p.Name, p.Spec.NodeName, node))
		}
	}
	_ = lab.Sleep(ctx, 3*time.Second) // their truth files written

	t0 := time.Now()
	if err := e.cfg.Partition(node); err != nil {
		return r.fail(err)
	}
	heal := e.pushUndo("heal "+node, func(context.Context) error { return e.cfg.Heal(node) })
	e.logf("partition: %s cut off", node)
	_ = lab.Sleep(ctx, partitionFor)
	healU, err := uptime()
	if err != nil {
		return r.fail(err)
	}
	if err := heal(ctx); err != nil {
		return r.fail(err)
	}
	healedAt := time.Now()
	e.logf("partition: %s healed after %.0fs", node, healedAt.Sub(t0).Seconds())

	finished, err := e.waitJobsFinished(ctx, ns, names, 4*time.Minute)
	if err != nil {
		r.problem("%v", err)
	}
	var recoveries []string
	var recoveredIn time.Duration
	// Replacements that started while the node was cut off, by Job (from the pods' own
	// record): only the opted-in Job may have any.
	early := map[string]int{}
	for _, s := range jobs {
		truth, err := readJobTruth(dir, s.Name)
		if err != nil {
			return r.fail(err)
		}
		for _, as := range truth {
			for _, a := range as {
				if first[a.Pod] == nil && a.Start < healU {
					early[s.Name]++
				}
			}
		}
		pods := tr.jobPodsOf(s.Name)
		r.add(checkStormJob(s, finished[s.Name], truth, pods), 1)
		r.Pods += len(pods)
		for _, p := range pods {
			if first[p.Name] == nil {
				continue
			}
			reason := forcefullyTerminated(p)
			switch {
			case s.Name == "fenced" && reason == "":
				r.problem("fenced: %s was not recovered by the shim (no %s)", p.Name, conditions.ForcefullyTerminated)
			case s.Name == "fenced":
				recoveries = append(recoveries, p.Name+": "+reason)
			case reason != "":
				r.problem("%s: %s (annotation %q) was force-terminated (%s): it did not opt in", s.Name, p.Name, p.Annotations[conditions.AnnotationSafeToForcefullyDelete], reason)
			}
		}
		if s.Name != "fenced" && early[s.Name] > 0 {
			r.problem("%s: %d replacement(s) ran while the node was cut off, without an opt-in", s.Name, early[s.Name])
		}
		if s.Name == "fenced" {
			// Recovery time: the partition to the first replacement created.
			for _, p := range pods {
				if first[p.Name] == nil {
					if d := p.CreationTimestamp.Sub(t0); recoveredIn == 0 || d < recoveredIn {
						recoveredIn = d
					}
				}
			}
			if early[s.Name] == 0 {
				r.problem("fenced: no replacement ran while the node was cut off for %v", partitionFor)
			}
		}
	}
	r.Faults = fmt.Sprintf("%s cut off %.0fs (fencing on: 1 Job opted in, 2 not)", node, healedAt.Sub(t0).Seconds())
	r.Failover = fmt.Sprintf("fenced pod replaced %.0f after the cut", recoveredIn.Seconds())
	r.note("recovered: %v; replacements started while cut off: %v", recoveries, early)
	// The node's agent says it fenced.
	evs, _ := e.cs.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Node,involvedObject.name=" + node + ",reason=" + conditions.EventReasonFenced})
	if evs != nil {
		for _, ev := range evs.Items {
			if ev.LastTimestamp.After(t0) {
				r.note("%s: %s", node, ev.Message)
			}
		}
	}
	return r
}
