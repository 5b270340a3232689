package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/test/lab"
)

// The platform cases (issue 20): coroner inside the batch platforms users run, Kueue and
// JobSet as installed by test/platforms (LAB_PLATFORMS=1 make lab, or make platforms on
// a lab that is up; the same on kind) and CronJob, kube-controller-manager's own. Each
// case runs twice side by side: in a namespace opted in to coroner (its Jobs reach the
// shim through the namespace opt-in, as a platform's Jobs do, since the platform writes
// their specs) and in a plain one, where the built-in Job controller runs the same Jobs;
// the two runs must tell the same story. They run with CORONER_E2E_PLATFORMS=1 only
// (make e2e-platforms), where the platforms must be installed.

const (
	kueueQueueLabel    = "kueue.x-k8s.io/queue-name"
	kueuePriorityLabel = "kueue.x-k8s.io/priority-class"
)

var (
	workloadsGVR = schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta2", Resource: "workloads"}
	jobSetsGVR   = schema.GroupVersionResource{Group: "jobset.x-k8s.io", Version: "v1alpha2", Resource: "jobsets"}
)

var dynamicOnce struct {
	once sync.Once
	dc   dynamic.Interface
	err  error
}

// dynamicClient is the suite's client for the platforms' objects (Workloads, JobSets),
// made once.
func dynamicClient(t *testing.T) dynamic.Interface {
	t.Helper()
	dynamicOnce.once.Do(func() { dynamicOnce.dc, dynamicOnce.err = dynamic.NewForConfig(suite.rest) })
	if dynamicOnce.err != nil {
		t.Fatal(dynamicOnce.err)
	}
	return dynamicOnce.dc
}

// platformsChecked holds, per group/version asked for, whether the API server serves it
// (a platformCheck).
var platformsChecked sync.Map

type platformCheck struct{ err error }

// needPlatforms skips a platform case unless CORONER_E2E_PLATFORMS=1, and fails it when
// Kueue or JobSet is not installed then.
func needPlatforms(t *testing.T) {
	t.Helper()
	needPlatformAPIs(t, "kueue.x-k8s.io/v1beta2", "jobset.x-k8s.io/v1alpha2")
}

// needJobSet is needPlatforms for a case of JobSet alone (make platforms, or go run
// ./test/platforms/cmd -platforms jobset install).
func needJobSet(t *testing.T) {
	t.Helper()
	needPlatformAPIs(t, "jobset.x-k8s.io/v1alpha2")
}

func needPlatformAPIs(t *testing.T, groupVersions ...string) {
	t.Helper()
	if suite.skip != "" {
		t.Skip(suite.skip)
	}
	if os.Getenv("CORONER_E2E_PLATFORMS") != "1" {
		t.Skip("the platform cases need Kueue and JobSet installed (LAB_PLATFORMS=1 make lab, or make platforms): make e2e-platforms")
	}
	for _, gv := range groupVersions {
		v, seen := platformsChecked.Load(gv)
		if !seen {
			_, err := suite.cs.Discovery().ServerResourcesForGroupVersion(gv)
			v, _ = platformsChecked.LoadOrStore(gv, platformCheck{err})
		}
		if err := v.(platformCheck).err; err != nil {
			t.Fatalf("%s is not served (make platforms): %v", gv, err)
		}
	}
}

// controllerRun is one of a case's two runs: coroner's (an opted-in namespace) or the
// built-in Job controller's.
type controllerRun struct {
	name    string
	coroner bool
}

var bothControllers = []controllerRun{{"coroner", true}, {"builtin", false}}

// sideBySide runs f once per controller, the two at once, then hands their results to
// compare (in a test that failed neither).
func sideBySide[R any](t *testing.T, f func(t *testing.T, run controllerRun) R, compare func(t *testing.T, coroner, builtin R)) {
	t.Helper()
	var mu sync.Mutex
	results := map[string]R{}
	ok := t.Run("both", func(t *testing.T) {
		for _, run := range bothControllers {
			t.Run(run.name, func(t *testing.T) {
				t.Parallel()
				r := f(t, run)
				mu.Lock()
				results[run.name] = r
				mu.Unlock()
			})
		}
	})
	if ok {
		compare(t, results["coroner"], results["builtin"])
	}
}

// platformNamespace is setup's namespace, opted in to coroner for coroner's run.
func platformNamespace(t *testing.T, run controllerRun, timeout time.Duration) (context.Context, string) {
	t.Helper()
	ctx, ns := setup(t, timeout)
	if run.coroner {
		optIn(ctx, t, ns)
	}
	return ctx, ns
}

// wantController checks who runs the Job: coroner in coroner's run (the opt-in set
// managedBy, and the platform left it), the built-in controller otherwise.
func wantController(t *testing.T, run controllerRun, j *batchv1.Job) {
	t.Helper()
	want := ""
	if run.coroner {
		want = lab.ManagedBy
	}
	if got := ptr.Deref(j.Spec.ManagedBy, ""); got != want {
		t.Errorf("Job %s: managedBy %q, want %q", j.Name, got, want)
	}
}

// apply applies YAML documents server-side; cluster-scoped objects it names in
// cleanup are deleted when the test ends.
func apply(ctx context.Context, t *testing.T, doc string, cleanup ...string) {
	t.Helper()
	cmd := kubectlCmd(ctx, "apply", "--server-side", "--field-manager=coroner-e2e", "-f", "-")
	cmd.Stdin = strings.NewReader(doc)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("kubectl apply: %v\n%s\n%s", err, out, doc)
	}
	for _, ref := range cleanup {
		t.Cleanup(func() { _, _ = kubectl(context.Background(), "delete", "--wait=false", "--ignore-not-found", ref) })
	}
}

// kueueQueue makes, for the namespace alone, a ResourceFlavor that sends pods to the
// quiet node (Kueue writes its node labels into a Job's pod template at admission), a
// ClusterQueue with cpuQuota of it (preempting lower priorities within itself), and the
// LocalQueue "q" in the namespace. Quotas and requests are tens of millicores: every
// case's queues send pods to the one quiet node, both runs of a case at once and the
// cases in parallel, beside Kueue's and JobSet's managers (500m each); with 400m a pod the
// node once ran out of CPU, a pod stayed Pending past waitForPodsReady's 40 s, and Kueue
// evicted a Job the case never meant to.
func kueueQueue(ctx context.Context, t *testing.T, ns, cpuQuota string) {
	t.Helper()
	apply(ctx, t, fmt.Sprintf(`apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata:
  name: %[1]s
spec:
  nodeLabels:
    %[3]s: %[4]s
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata:
  name: %[1]s
spec:
  namespaceSelector:
    matchLabels:
      kubernetes.io/metadata.name: %[1]s
  preemption:
    withinClusterQueue: LowerPriority
  resourceGroups:
  - coveredResources: ["cpu"]
    flavors:
    - name: %[1]s
      resources:
      - name: cpu
        nominalQuota: %[2]s
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata:
  name: q
  namespace: %[1]s
spec:
  clusterQueue: %[1]s
`, ns, cpuQuota, hostnameLabel, quietNode), "clusterqueue/"+ns, "resourceflavor/"+ns)
	// The LocalQueue is usable once Kueue has seen the ClusterQueue active.
	err := lab.Poll(ctx, time.Minute, "LocalQueue "+ns+"/q active", func() (bool, error) {
		out, err := kubectl(ctx, "-n", ns, "get", "localqueue", "q", "-o", `jsonpath={.status.conditions[?(@.type=="Active")].status}`)
		return err == nil && strings.TrimSpace(string(out)) == "True", nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// queuedJob is a Job for the LocalQueue q: one pod asking for cpu, not pinned (Kueue
// places it through the flavor), suspended at creation by Kueue's webhook.
func queuedJob(name, ns, cpu string, script string) *batchv1.Job {
	j := job(name, ns).Command("sh", "-c", script).Obj()
	j.Spec.ManagedBy = nil // the namespace decides: the opt-in, or the built-in controller
	j.Labels = map[string]string{kueueQueueLabel: "q"}
	withResources(j, quantities("cpu", cpu), nil)
	return j
}

// kueueStory is what a Kueue case saw of its Jobs, compared between the two runs.
type kueueStory struct {
	Order    []string          // Jobs in the order Kueue admitted them (first unsuspended)
	Outcomes map[string]string // Job -> its end
}

// TestPlatformKueueQueueing: Jobs of a LocalQueue over its quota are held suspended with
// no pod until quota frees, then admitted one at a time in the order they came; the pods
// of an admitted Job carry the node selector Kueue injects from the flavor, and run there.
func TestPlatformKueueQueueing(t *testing.T) {
	needPlatforms(t)
	t.Parallel()
	sideBySide(t, func(t *testing.T, run controllerRun) kueueStory {
		ctx, ns := platformNamespace(t, run, 6*time.Minute)
		kueueQueue(ctx, t, ns, "50m")
		names := []string{"first", "second", "third"}
		for _, n := range names {
			createJob(ctx, t, queuedJob(n, ns, "40m", "sleep 6"))
			// Kueue orders a queue by creation time, which has a second's resolution.
			time.Sleep(1100 * time.Millisecond)
		}
		story := kueueStory{Outcomes: map[string]string{}}
		admitted := map[string]time.Time{}
		done := map[string]time.Time{}
		err := lab.Poll(ctx, 4*time.Minute, "the three Jobs to run one after the other", func() (bool, error) {
			running := 0
			for _, n := range names {
				// The pods first, then the Job: a Job never admitted and still suspended
				// after the list was suspended when it was taken, so its pods must be none
				// (the other order races with an admission between the two reads).
				pods := jobPods(ctx, t, ns, n)
				j, err := suite.cs.BatchV1().Jobs(ns).Get(ctx, n, metav1.GetOptions{})
				if err != nil {
					return false, err
				}
				suspended := ptr.Deref(j.Spec.Suspend, false)
				if suspended && admitted[n].IsZero() && len(pods) > 0 {
					// Held by Kueue: no pod may exist.
					return false, fmt.Errorf("Job %s is suspended (queued) but has pod %s", n, pods[0].Name)
				}
				if !suspended && admitted[n].IsZero() {
					admitted[n] = time.Now()
					story.Order = append(story.Order, n)
				}
				if c := finished(j); c != nil {
					if done[n].IsZero() {
						done[n] = time.Now()
						story.Outcomes[n] = outcomeString(j)
						wantController(t, run, j)
					}
				} else if !suspended {
					running++
				}
			}
			if running > 1 {
				return false, fmt.Errorf("%d Jobs admitted at once over a quota for one", running)
			}
			return len(done) == len(names), nil
		})
		if err != nil {
			t.Fatalf("%v\n%s", err, describe(ns, ""))
		}
		for i := 1; i < len(story.Order); i++ {
			prev, cur := story.Order[i-1], story.Order[i]
			if admitted[cur].Before(done[prev]) {
				t.Errorf("%s admitted %v before %s finished", cur, done[prev].Sub(admitted[cur]), prev)
			}
		}
		for _, n := range names {
			for _, p := range jobPods(ctx, t, ns, n) {
				if p.Spec.NodeSelector[hostnameLabel] != quietNode || p.Spec.NodeName != quietNode {
					t.Errorf("pod %s: node selector %v, on %q; want Kueue's flavor %s=%s", p.Name, p.Spec.NodeSelector, p.Spec.NodeName, hostnameLabel, quietNode)
				}
			}
		}
		t.Logf("%s: admitted in order %v", run.name, story.Order)
		return story
	}, compareKueueStories)
}

func compareKueueStories(t *testing.T, coroner, builtin kueueStory) {
	t.Helper()
	if fmt.Sprint(coroner.Order) != fmt.Sprint(builtin.Order) || fmt.Sprint(coroner.Outcomes) != fmt.Sprint(builtin.Outcomes) {
		t.Errorf("coroner and the built-in controller under Kueue disagree:\n  coroner:  %+v\n  built-in: %+v", coroner, builtin)
	}
	if want := []string{"first", "second", "third"}; fmt.Sprint(coroner.Order) != fmt.Sprint(want) {
		t.Errorf("admission order %v, want %v", coroner.Order, want)
	}
}

// outcomeString is a Job's end for comparisons between the runs.
func outcomeString(j *batchv1.Job) string {
	o := outcomeOf(j)
	return fmt.Sprintf("%s/%s succeeded=%d failed=%d completed=%q failedIndexes=%q", o.Condition, o.Reason, o.Succeeded, o.Failed, o.CompletedIndexes, o.FailedIndexes)
}

// preemptionStory is what the preemption case saw of the low-priority Job.
type preemptionStory struct {
	BeforeCompleted, AfterCompleted string // completedIndexes before the preemption, after the resumption
	BeforeFailed, AfterFailed       int32
	ResumedFailureCount             string // the failure count annotation of index 2's new pod
	HighOutcome                     string
	Evictions                       string // why Kueue stopped the low Job, each time
}

// kueueStops returns the Job's "Stopped" Events (Kueue's, one per eviction: preemption,
// the PodsReady timeout, ...), their messages' first words joined by "; ".
func kueueStops(ctx context.Context, t *testing.T, ns, job string) string {
	t.Helper()
	var out []string
	for _, e := range jobEvents(ctx, t, ns, job) {
		if msg, ok := strings.CutPrefix(e, "Stopped: "); ok {
			if i := strings.Index(msg, " ("); i > 0 {
				msg = msg[:i] // "Preempted to accommodate a workload (UID: ...) ..."
			}
			out = append(out, msg)
		}
	}
	return strings.Join(out, "; ")
}

// TestPlatformKueuePreemption: a low-priority Indexed Job (backoffLimitPerIndex) has
// finished two indexes, one after a counted failure, when a high-priority Job needs its
// quota: Kueue suspends it, its running pod is deleted, the high Job runs, and on
// re-admission the low Job resumes with its completed indexes and per-index failure
// counts kept; the pod the preemption deleted counts as no failure.
func TestPlatformKueuePreemption(t *testing.T) {
	needPlatforms(t)
	t.Parallel()
	sideBySide(t, func(t *testing.T, run controllerRun) preemptionStory {
		ctx, ns := platformNamespace(t, run, 7*time.Minute)
		apply(ctx, t, fmt.Sprintf(`apiVersion: kueue.x-k8s.io/v1beta2
kind: WorkloadPriorityClass
metadata:
  name: %[1]s-low
value: 100
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: WorkloadPriorityClass
metadata:
  name: %[1]s-high
value: 1000
`, ns), "workloadpriorityclass/"+ns+"-low", "workloadpriorityclass/"+ns+"-high")
		kueueQueue(ctx, t, ns, "50m")

		// Index 0 succeeds, index 1 fails once (exit 1, counted) and then succeeds, index
		// 2 runs until preempted, and again after. Index 0 succeeds first so that the Job
		// is PodsReady (succeeded + ready >= parallelism) at once: a counted failure
		// first, with its per-index backoff, can outlast waitForPodsReady's 40 s on a
		// loaded node, and that eviction (which deletes the retry, and with it the
		// failure count it carried, in both controllers) is not the story told here.
		low := queuedJob("low", ns, "40m", `case $JOB_COMPLETION_INDEX in
0) exit 0 ;;
1) [ "$FAILURES" = 0 ] && exit 1; exit 0 ;;
*) sleep 600 ;;
esac`)
		low.Spec.CompletionMode = ptr.To(batchv1.IndexedCompletion)
		low.Spec.Completions, low.Spec.Parallelism = ptr.To[int32](3), ptr.To[int32](1)
		low.Spec.BackoffLimitPerIndex, low.Spec.BackoffLimit = ptr.To[int32](2), nil
		low.Labels[kueuePriorityLabel] = ns + "-low"
		withFailureCount(low)
		createJob(ctx, t, low)

		var story preemptionStory
		first := waitIndexRunning(ctx, t, ns, "low", "2", "", 3*time.Minute)
		j, err := suite.cs.BatchV1().Jobs(ns).Get(ctx, "low", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		story.BeforeCompleted, story.BeforeFailed = j.Status.CompletedIndexes, j.Status.Failed

		high := queuedJob("high", ns, "40m", "sleep 3")
		high.Labels[kueuePriorityLabel] = ns + "-high"
		createJob(ctx, t, high)

		// Kueue suspends the low Job; its running pod goes.
		err = lab.Poll(ctx, 2*time.Minute, "the low Job preempted: suspended, its pod gone", func() (bool, error) {
			j, err := suite.cs.BatchV1().Jobs(ns).Get(ctx, "low", metav1.GetOptions{})
			if err != nil || !ptr.Deref(j.Spec.Suspend, false) {
				return false, nil
			}
			p, err := suite.cs.CoreV1().Pods(ns).Get(ctx, first.Name, metav1.GetOptions{})
			return err != nil || p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded, nil
		})
		if err != nil {
			t.Fatalf("%v\n%s", err, describe(ns, "low"))
		}
		h := waitFinished(ctx, t, ns, "high", 3*time.Minute)
		story.HighOutcome = outcomeString(h)
		wantController(t, run, h)

		// Re-admitted: index 2 runs again in a new pod.
		second := waitIndexRunning(ctx, t, ns, "low", "2", first.Name, 3*time.Minute)
		story.ResumedFailureCount = second.Annotations[batchv1.JobIndexFailureCountAnnotation]
		if j, err = suite.cs.BatchV1().Jobs(ns).Get(ctx, "low", metav1.GetOptions{}); err != nil {
			t.Fatal(err)
		}
		story.AfterCompleted, story.AfterFailed = j.Status.CompletedIndexes, j.Status.Failed
		wantController(t, run, j)
		story.Evictions = kueueStops(ctx, t, ns, "low")
		for _, p := range jobPods(ctx, t, ns, "low") {
			if p.Annotations[batchv1.JobCompletionIndexAnnotation] == "0" || p.Annotations[batchv1.JobCompletionIndexAnnotation] == "1" {
				if p.CreationTimestamp.After(first.CreationTimestamp.Time) {
					t.Errorf("index %s ran again after the preemption (pod %s)", p.Annotations[batchv1.JobCompletionIndexAnnotation], p.Name)
				}
			}
		}
		t.Logf("%s: %+v", run.name, story)
		return story
	}, func(t *testing.T, coroner, builtin preemptionStory) {
		if coroner != builtin {
			t.Errorf("coroner and the built-in controller under Kueue's preemption disagree:\n  coroner:  %+v\n  built-in: %+v", coroner, builtin)
		}
		want := preemptionStory{BeforeCompleted: "0,1", AfterCompleted: "0,1", BeforeFailed: 1, AfterFailed: 1, ResumedFailureCount: "0",
			HighOutcome: `Complete/CompletionsReached succeeded=1 failed=0 completed="" failedIndexes=""`,
			Evictions:   "Preempted to accommodate a workload"}
		if coroner != want {
			t.Errorf("coroner under Kueue's preemption:\n  got  %+v\n  want %+v", coroner, want)
		}
	})
}

// waitIndexRunning waits for a running pod of the Job's index other than not, and
// returns it.
func waitIndexRunning(ctx context.Context, t *testing.T, ns, job, index, not string, timeout time.Duration) *corev1.Pod {
	t.Helper()
	var found *corev1.Pod
	err := lab.Poll(ctx, timeout, fmt.Sprintf("a running pod of index %s of Job %s", index, job), func() (bool, error) {
		for _, p := range jobPods(ctx, t, ns, job) {
			if p.Name != not && p.Annotations[batchv1.JobCompletionIndexAnnotation] == index &&
				p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil && allStarted(&p) {
				found = &p
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, describe(ns, job))
	}
	return found
}

// requeueStory is what the waitForPodsReady case saw.
type requeueStory struct {
	EvictionReason string // the Workload's Evicted condition's reason
	Failed         int32  // the Job's status.failed after the eviction
	Readmitted     bool
}

// TestPlatformKueueWaitForPodsReady: a Job whose pod can never start (an image no node
// has, never pulled) is admitted, then evicted by Kueue when its pods are not Ready within
// waitForPodsReady's timeout (40 s in the lab's configuration): suspended, its pod
// deleted, requeued, and admitted again after the backoff, with a new pod.
func TestPlatformKueueWaitForPodsReady(t *testing.T) {
	needPlatforms(t)
	t.Parallel()
	sideBySide(t, func(t *testing.T, run controllerRun) requeueStory {
		ctx, ns := platformNamespace(t, run, 5*time.Minute)
		kueueQueue(ctx, t, ns, "50m")
		j := queuedJob("stuck", ns, "10m", "true")
		j.Spec.Template.Spec.Containers[0].Image = "busybox:never-there"
		createJob(ctx, t, j)

		var first corev1.Pod
		err := lab.Poll(ctx, 2*time.Minute, "the stuck Job admitted and its pod made", func() (bool, error) {
			pods := jobPods(ctx, t, ns, "stuck")
			if len(pods) == 0 {
				return false, nil
			}
			first = pods[0]
			return true, nil
		})
		if err != nil {
			t.Fatalf("%v\n%s", err, describe(ns, "stuck"))
		}
		var story requeueStory
		err = lab.Poll(ctx, 2*time.Minute, "Kueue to evict the Workload (PodsReadyTimeout) and its pod to go", func() (bool, error) {
			story.EvictionReason = workloadCondition(ctx, t, ns, "Evicted")
			if story.EvictionReason == "" {
				return false, nil
			}
			p, err := suite.cs.CoreV1().Pods(ns).Get(ctx, first.Name, metav1.GetOptions{})
			return err != nil || p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodFailed, nil
		})
		if err != nil {
			t.Fatalf("%v\n%s", err, describe(ns, "stuck"))
		}
		err = lab.Poll(ctx, 2*time.Minute, "the stuck Job admitted again, with a new pod", func() (bool, error) {
			for _, p := range jobPods(ctx, t, ns, "stuck") {
				if p.Name != first.Name && p.DeletionTimestamp == nil {
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			t.Fatalf("%v\n%s", err, describe(ns, "stuck"))
		}
		story.Readmitted = true
		got, err := suite.cs.BatchV1().Jobs(ns).Get(ctx, "stuck", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		story.Failed = got.Status.Failed
		wantController(t, run, got)
		t.Logf("%s: %+v", run.name, story)
		return story
	}, func(t *testing.T, coroner, builtin requeueStory) {
		if coroner != builtin {
			t.Errorf("coroner and the built-in controller under waitForPodsReady disagree:\n  coroner:  %+v\n  built-in: %+v", coroner, builtin)
		}
		if coroner.EvictionReason != "PodsReadyTimeout" {
			t.Errorf("the Workload's eviction reason %q, want PodsReadyTimeout", coroner.EvictionReason)
		}
	})
}

// workloadCondition returns the reason of the True condition ctype of the namespace's one
// Workload ("" when there is none).
func workloadCondition(ctx context.Context, t *testing.T, ns, ctype string) string {
	t.Helper()
	l, err := dynamicClient(t).Resource(workloadsGVR).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil || len(l.Items) == 0 {
		return ""
	}
	conds, _, _ := unstructured.NestedSlice(l.Items[0].Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == ctype && m["status"] == "True" {
			reason, _ := m["reason"].(string)
			return reason
		}
	}
	return ""
}
