package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/jobsync"
	"github.com/coroner-dev/coroner/test/lab"
)

// jobSet is a JobSet of one replicatedJob "workers" of replicas child Jobs, one pod each,
// on node, whose pod failure policy fails the child Job on coroner.dev/OOMKilled and
// ignores DisruptionTarget, and whose JobSet failure policy fails the whole JobSet when a
// child Job failed by its pod failure policy (up to 2 restarts otherwise). In coroner's
// run the template names coroner (JobSet copies it into each child Job). script runs with
// $WORKER (the child Job's index) and $IGNORED (its pod's ignored failures); memLimit is
// the container's memory limit ("": none).
func jobSet(name, ns, node string, replicas int, run controllerRun, memLimit, script string) string {
	managedBy, resources := "", ""
	if run.coroner {
		managedBy = "\n        managedBy: " + lab.ManagedBy
	}
	if memLimit != "" {
		resources = "\n              resources:\n                limits:\n                  memory: " + memLimit
	}
	return fmt.Sprintf(`apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata:
  name: %[1]s
  namespace: %[2]s
spec:
  failurePolicy:
    maxRestarts: 2
    rules:
    - action: FailJobSet
      onJobFailureReasons: [PodFailurePolicy]
  replicatedJobs:
  - name: workers
    replicas: %[4]d
    template:
      spec:%[5]s
        completionMode: Indexed
        completions: 1
        parallelism: 1
        backoffLimitPerIndex: 1
        podFailurePolicy:
          rules:
          - action: FailJob
            onPodConditions:
            - type: %[6]s
          - action: Ignore
            onPodConditions:
            - type: DisruptionTarget
        template:
          spec:
            restartPolicy: Never
            terminationGracePeriodSeconds: 1
            nodeSelector:
              %[7]s: %[3]s
            containers:
            - name: main
              image: busybox:local
              imagePullPolicy: Never
              command: ["sh", "-c", %[8]q]
              env:
              - name: WORKER
                valueFrom:
                  fieldRef:
                    fieldPath: metadata.annotations['jobset.sigs.k8s.io/job-index']
              - name: IGNORED
                valueFrom:
                  fieldRef:
                    fieldPath: metadata.annotations['batch.kubernetes.io/job-index-ignored-failure-count']%[9]s
`, name, ns, node, replicas, managedBy, conditions.OOMKilled, hostnameLabel, script, resources)
}

// growUntilKilledOnce is a worker's script: the first pod of an index (no ignored
// failure yet) grows its memory until the node's OOM killer takes it; its replacement is
// done at once.
const growUntilKilledOnce = `if [ "${IGNORED:-0}" = 0 ]; then exec memhog -step-mib 2 -interval 50ms -max-mib 1024; fi; echo done`

// waitWorkerRunning waits for the JobSet's one worker pod in ns to run with its
// containers started, and returns it.
func waitWorkerRunning(ctx context.Context, t *testing.T, ns string) corev1.Pod {
	t.Helper()
	var worker corev1.Pod
	err := lab.Poll(ctx, 2*time.Minute, "the worker running", func() (bool, error) {
		l, err := suite.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil || len(l.Items) == 0 {
			return false, nil
		}
		worker = l.Items[0]
		return worker.Status.Phase == corev1.PodRunning && allStarted(&worker), nil
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, describe(ns, ""))
	}
	return worker
}

// jobSetStory is what a JobSet case saw, compared between the two runs.
type jobSetStory struct {
	Condition string // the JobSet's terminal condition: type/reason
	Restarts  int64
	Children  string // the child Jobs' ends, by name
}

// TestPlatformJobSetLimitOOM: a worker over its own memory limit fails its child Job by
// the pod failure policy (FailJob on coroner.dev/OOMKilled, the agent's stamp), and
// JobSet's failure policy, which reads the child Job's Failed reason PodFailurePolicy,
// fails the whole JobSet at once: no restart.
func TestPlatformJobSetLimitOOM(t *testing.T) {
	needJobSet(t)
	t.Parallel()
	sideBySide(t, func(t *testing.T, run controllerRun) jobSetStory {
		ctx, ns := platformNamespace(t, run, 5*time.Minute)
		apply(ctx, t, jobSet("train", ns, quietNode, 2, run, "24Mi", `if [ "$WORKER" = 0 ]; then exec memhog; fi; sleep 600`))
		story := waitJobSet(ctx, t, ns, "train", run, 3*time.Minute)
		t.Logf("%s: %+v", run.name, story)
		return story
	}, func(t *testing.T, coroner, builtin jobSetStory) {
		if coroner != builtin {
			t.Errorf("JobSet over coroner and over the built-in controller disagree:\n  coroner:  %+v\n  built-in: %+v", coroner, builtin)
		}
		if !strings.HasPrefix(coroner.Condition, "Failed/") || coroner.Restarts != 0 || !strings.Contains(coroner.Children, "train-workers-0=Failed/PodFailurePolicy") {
			t.Errorf("want the JobSet Failed with no restart and worker 0's Job failed by its pod failure policy; got %+v", coroner)
		}
	})
}

// TestPlatformJobSetNodeOOMIgnored: a worker killed by a node OOM (the kernel's choice
// when the node's pods run out, not the worker's limit) is stamped DisruptionTarget
// NodeOOMKill; its child Job's policy ignores it and replaces the pod, which completes, so
// the JobSet completes with no restart. The two runs take the disturbed node in turn.
func TestPlatformJobSetNodeOOMIgnored(t *testing.T) {
	needJobSet(t)
	stories := map[string]jobSetStory{}
	for _, run := range bothControllers {
		t.Run(run.name, func(t *testing.T) {
			ctx, ns := platformNamespace(t, run, 5*time.Minute)
			// memhog grows until the squeeze; its replacement (IGNORED=1) is done at once.
			apply(ctx, t, jobSet("train", ns, oomNode, 1, run, "",
				growUntilKilledOnce))
			victim := waitWorkerRunning(ctx, t, ns)
			time.Sleep(2 * time.Second) // let it grow past everything else on the node
			coronerctl(ctx, t, "chaos", "oom", "-n", ns, victim.Name, "--node")
			// The kernel picks the node's biggest task: it must be the worker (seen on a
			// CI run whose Kueue manager, on the same node then, was bigger and was killed).
			waitPod(ctx, t, ns, victim.Name, "the worker killed by the node OOM", time.Minute, func(p *corev1.Pod) bool {
				return p == nil || terminated(p) != nil
			})
			story := waitJobSet(ctx, t, ns, "train", run, 3*time.Minute)
			p := pod(ctx, t, ns, victim.Name)
			wantCondition(t, p, corev1.DisruptionTarget, conditions.ReasonNodeOOMKill)
			t.Logf("%s: %+v", run.name, story)
			stories[run.name] = story
		})
	}
	coroner, builtin := stories["coroner"], stories["builtin"]
	if t.Failed() {
		return
	}
	if coroner != builtin {
		t.Errorf("JobSet over coroner and over the built-in controller disagree:\n  coroner:  %+v\n  built-in: %+v", coroner, builtin)
	}
	if !strings.HasPrefix(coroner.Condition, "Completed/") || coroner.Restarts != 0 {
		t.Errorf("want the JobSet Completed with no restart; got %+v", coroner)
	}
}

// TestPlatformJobSetAvoidsFailedNode: a JobSet whose worker Job template carries
// coroner.dev/avoid-failed-nodes: required (JobSet copies the template's annotations and
// managedBy into the child Job, and the namespace is opted in, as the other JobSet cases
// hand their Jobs to coroner), its pod on node X (preferred by the template, node Y
// allowed). A node OOM kills the worker: stamped NodeOOMKill, ignored by the child Job's
// policy, and its replacement runs on Y with the required affinity away from X; the
// JobSet completes with no restart. coroner's run only: the built-in controller has no
// such annotation.
func TestPlatformJobSetAvoidsFailedNode(t *testing.T) {
	needJobSet(t)
	x, y := blamedNode(), spareNode()
	run := bothControllers[0]
	ctx, ns := platformNamespace(t, run, 4*time.Minute)
	apply(ctx, t, fmt.Sprintf(`apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata:
  name: train
  namespace: %[1]s
spec:
  failurePolicy:
    maxRestarts: 2
  replicatedJobs:
  - name: workers
    replicas: 1
    template:
      metadata:
        annotations:
          %[2]s: required
      spec:
        managedBy: %[3]s
        completionMode: Indexed
        completions: 1
        parallelism: 1
        backoffLimitPerIndex: 1
        podFailurePolicy:
          rules:
          - action: Ignore
            onPodConditions:
            - type: DisruptionTarget
        template:
          spec:
            restartPolicy: Never
            terminationGracePeriodSeconds: 1
            affinity:
              nodeAffinity:
                requiredDuringSchedulingIgnoredDuringExecution:
                  nodeSelectorTerms:
                  - matchExpressions:
                    - {key: %[4]s, operator: In, values: [%[5]s, %[6]s]}
                preferredDuringSchedulingIgnoredDuringExecution:
                - weight: 100
                  preference:
                    matchExpressions:
                    - {key: %[4]s, operator: In, values: [%[5]s]}
            containers:
            - name: main
              image: busybox:local
              imagePullPolicy: Never
              command: ["sh", "-c", %[7]q]
              env:
              - name: IGNORED
                valueFrom:
                  fieldRef:
                    fieldPath: metadata.annotations['batch.kubernetes.io/job-index-ignored-failure-count']
`, ns, v1alpha1.AnnotationAvoidFailedNodes, lab.ManagedBy, hostnameLabel, x, y,
		growUntilKilledOnce))
	victim := waitWorkerRunning(ctx, t, ns)
	if victim.Spec.NodeName != x {
		t.Fatalf("the worker %s ran on %s, not on %s (preferred by its affinity)", victim.Name, victim.Spec.NodeName, x)
	}
	child := victim.Labels[batchv1.JobNameLabel]
	cj, err := suite.cs.BatchV1().Jobs(ns).Get(ctx, child, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wantController(t, run, cj)
	if got := cj.Annotations[v1alpha1.AnnotationAvoidFailedNodes]; got != string(v1alpha1.AvoidRequired) {
		t.Fatalf("child Job %s: %s %q, want required (from the JobSet's template)", child, v1alpha1.AnnotationAvoidFailedNodes, got)
	}
	time.Sleep(2 * time.Second) // let it grow past everything else on the node
	coronerctl(ctx, t, "chaos", "oom", "-n", ns, victim.Name, "--node")
	waitPod(ctx, t, ns, victim.Name, "the worker killed by the node OOM", time.Minute, func(p *corev1.Pod) bool {
		return p == nil || terminated(p) != nil
	})
	story := waitJobSet(ctx, t, ns, "train", run, 3*time.Minute)
	t.Logf("%+v", story)
	if !strings.HasPrefix(story.Condition, "Completed/") || story.Restarts != 0 {
		t.Errorf("want the JobSet Completed with no restart; got %+v", story)
	}
	wantCondition(t, pod(ctx, t, ns, victim.Name), corev1.DisruptionTarget, conditions.ReasonNodeOOMKill)
	pods := jobPods(ctx, t, ns, child)
	if len(pods) != 2 {
		t.Fatalf("pods of %s %v, want 2 (the worker and its replacement)", child, podNames(pods))
	}
	r := &pods[1]
	wantReplacementOff(t, r, x, conditions.DisruptionNodeOOM, []string{x, y})
	wantEvent(ctx, t, ns, child, jobsync.EventReasonAvoidingNodes, x)
}

// waitJobSet waits for the JobSet's Completed or Failed condition and tells its story.
func waitJobSet(ctx context.Context, t *testing.T, ns, name string, run controllerRun, timeout time.Duration) jobSetStory {
	t.Helper()
	dc := dynamicClient(t)
	var story jobSetStory
	err := lab.Poll(ctx, timeout, "JobSet "+name+" to finish", func() (bool, error) {
		js, err := dc.Resource(jobSetsGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		story.Restarts, _, _ = unstructured.NestedInt64(js.Object, "status", "restarts")
		conds, _, _ := unstructured.NestedSlice(js.Object, "status", "conditions")
		for _, c := range conds {
			m, _ := c.(map[string]any)
			if (m["type"] == "Completed" || m["type"] == "Failed") && m["status"] == "True" {
				story.Condition = fmt.Sprintf("%s/%s", m["type"], m["reason"])
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, describe(ns, ""))
	}
	jobs, err := suite.cs.BatchV1().Jobs(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The finished child Jobs: JobSet deletes the others of a finished JobSet, at its pace.
	var children []string
	for _, j := range jobs.Items {
		wantController(t, run, &j)
		if c := finished(&j); c != nil {
			children = append(children, j.Name+"="+string(c.Type)+"/"+c.Reason)
		}
	}
	story.Children = strings.Join(children, ",")
	return story
}

// cronStory is what a CronJob case saw, compared between the two runs.
type cronStory struct {
	MaxActive        int  // the most unfinished Jobs at one time
	LastSuccessful   bool // status.lastSuccessfulTime set
	SuccessfulKept   int  // successful Jobs left by the history limit
	ReplacedDeleted  bool // Replace: the first Job was deleted when the next came
	ReplacementAlive bool
}

// TestPlatformCronJob: CronJobs whose Jobs reach coroner through the namespace opt-in.
// Forbid: a Job that outlives its minute holds back the next run, never two at once (the
// CronJob controller starts the held-back run once the Job has ended, read from coroner's
// Complete condition: with no startingDeadlineSeconds it is not skipped); lastSuccessfulTime
// is set, and the history limit keeps one successful Job. Replace: the running Job is
// deleted when the next minute's comes, and the new one runs.
func TestPlatformCronJob(t *testing.T) {
	needPlatforms(t)
	t.Parallel()
	sideBySide(t, func(t *testing.T, run controllerRun) cronStory {
		ctx, ns := platformNamespace(t, run, 8*time.Minute)
		apply(ctx, t, cronJob("forbid", ns, batchv1.ForbidConcurrent, 65, "successfulJobsHistoryLimit: 1", "backoffLimit: 0")+
			"---\n"+cronJob("replace", ns, batchv1.ReplaceConcurrent, 600, "", ""))
		var story cronStory
		var firstReplace string
		completedForbid := map[string]bool{}
		err := lab.Poll(ctx, 6*time.Minute, "two Forbid runs complete and a Replace run replaced", func() (bool, error) {
			jobs, err := suite.cs.BatchV1().Jobs(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, nil
			}
			active, succeeded := 0, 0
			replaceJobs := map[string]bool{}
			for _, j := range jobs.Items {
				owner := metav1.GetControllerOf(&j)
				if owner == nil {
					continue
				}
				switch owner.Name {
				case "forbid":
					wantController(t, run, &j)
					if c := finished(&j); c == nil {
						active++
					} else if c.Type == batchv1.JobComplete {
						succeeded++
						completedForbid[j.Name] = true
					}
				case "replace":
					if j.DeletionTimestamp == nil {
						replaceJobs[j.Name] = true
						wantController(t, run, &j)
					}
					if firstReplace == "" {
						firstReplace = j.Name
					}
				}
			}
			story.MaxActive = max(story.MaxActive, active)
			if firstReplace != "" && !replaceJobs[firstReplace] && len(replaceJobs) > 0 {
				story.ReplacedDeleted, story.ReplacementAlive = true, true
			}
			cj, err := suite.cs.BatchV1().CronJobs(ns).Get(ctx, "forbid", metav1.GetOptions{})
			if err == nil && cj.Status.LastSuccessfulTime != nil {
				story.LastSuccessful = true
			}
			story.SuccessfulKept = succeeded
			// Done when two Forbid Jobs have completed (the first then goes by the history
			// limit) and the Replace case has replaced.
			return len(completedForbid) >= 2 && story.ReplacedDeleted, nil
		})
		if err != nil {
			t.Fatalf("%v (so far %+v)\n%s", err, story, describe(ns, ""))
		}
		// The history limit removes the older successful Job once the newer one is done.
		_ = lab.Poll(ctx, 30*time.Second, "the history limit applied", func() (bool, error) {
			jobs, err := suite.cs.BatchV1().Jobs(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, nil
			}
			n := 0
			for _, j := range jobs.Items {
				if o := metav1.GetControllerOf(&j); o != nil && o.Name == "forbid" && j.DeletionTimestamp == nil {
					if c := finished(&j); c != nil && c.Type == batchv1.JobComplete {
						n++
					}
				}
			}
			story.SuccessfulKept = n
			return n == 1, nil
		})
		_, _ = kubectl(context.Background(), "-n", ns, "delete", "cronjob", "--all", "--wait=false")
		t.Logf("%s: %+v", run.name, story)
		return story
	}, func(t *testing.T, coroner, builtin cronStory) {
		if coroner != builtin {
			t.Errorf("CronJob over coroner and over the built-in controller disagree:\n  coroner:  %+v\n  built-in: %+v", coroner, builtin)
		}
		want := cronStory{MaxActive: 1, LastSuccessful: true, SuccessfulKept: 1, ReplacedDeleted: true, ReplacementAlive: true}
		if coroner != want {
			t.Errorf("CronJob over coroner:\n  got  %+v\n  want %+v", coroner, want)
		}
	})
}

// cronJob is a CronJob running every minute on the quiet node, its Jobs sleeping for
// sleep seconds; cronExtra and jobExtra are more fields of the CronJob's and the Job's
// specs ("" for none).
func cronJob(name, ns string, policy batchv1.ConcurrencyPolicy, sleep int, cronExtra, jobExtra string) string {
	indent := func(s, pad string) string {
		if s == "" {
			return ""
		}
		return pad + s + "\n"
	}
	return fmt.Sprintf(`apiVersion: batch/v1
kind: CronJob
metadata:
  name: %[1]s
  namespace: %[2]s
spec:
  schedule: "* * * * *"
  concurrencyPolicy: %[3]s
%[4]s  jobTemplate:
    spec:
%[5]s      template:
        spec:
          restartPolicy: Never
          terminationGracePeriodSeconds: 1
          nodeSelector:
            %[6]s: %[7]s
          containers:
          - name: main
            image: busybox:local
            imagePullPolicy: Never
            command: ["sleep", "%[8]d"]
`, name, ns, policy, indent(cronExtra, "  "), indent(jobExtra, "      "), hostnameLabel, quietNode, sleep)
}
