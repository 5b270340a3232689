package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/coroner-dev/coroner/test/lab"
)

// env is what every scenario uses: the lab, clients, the truth directory, the undo stack.
type env struct {
	cfg   lab.Config
	rest  *rest.Config
	cs    kubernetes.Interface
	rng   *rand.Rand
	runID string
	// truthRoot holds one directory per namespace (hostPath of the pods).
	truthRoot string
	keep      bool

	mu    sync.Mutex
	undos []undo
}

type undo struct {
	what string
	f    func(context.Context) error
}

func (e *env) logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s  %s\n", time.Now().Format("15:04:05.0"), fmt.Sprintf(format, args...))
}

// pushUndo registers what puts the lab back if the run stops half-way; the returned
// function runs it now (once) and unregisters it.
func (e *env) pushUndo(what string, f func(context.Context) error) func(context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	u := &undo{what: what, f: f}
	e.undos = append(e.undos, *u)
	idx := len(e.undos) - 1
	done := false
	return func(ctx context.Context) error {
		e.mu.Lock()
		if done {
			e.mu.Unlock()
			return nil
		}
		done = true
		e.undos[idx].f = nil
		e.mu.Unlock()
		return f(ctx)
	}
}

// runUndos runs what is still registered, newest first.
func (e *env) runUndos(ctx context.Context) {
	e.mu.Lock()
	us := slices.Clone(e.undos)
	e.undos = nil
	e.mu.Unlock()
	for i := len(us) - 1; i >= 0; i-- {
		if us[i].f == nil {
			continue
		}
		e.logf("undo: %s", us[i].what)
		if err := us[i].f(ctx); err != nil {
			e.logf("undo %s: %v (do it by hand)", us[i].what, err)
		}
	}
}

// namespace makes a fresh namespace for a scenario (an earlier run's goes first) and its
// truth directory; the returned cleanup deletes both unless the scenario failed or -keep.
func (e *env) namespace(ctx context.Context, scenario string) (string, string, func(failed bool), error) {
	ns := "chaos-" + scenario
	if err := lab.FreshNamespace(ctx, e.cs, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
		Labels: map[string]string{"coroner.dev/chaos": e.runID}}}, 3*time.Minute); err != nil {
		return "", "", nil, err
	}
	dir := filepath.Join(e.truthRoot, ns)
	if err := os.RemoveAll(dir); err != nil {
		return "", "", nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", nil, err
	}
	cleanup := func(failed bool) {
		if failed || e.keep {
			e.logf("%s: namespace %s and truth %s kept for a look", scenario, ns, dir)
			return
		}
		_ = e.cs.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
		_ = os.RemoveAll(dir)
	}
	return ns, dir, cleanup, nil
}

// tracker follows a namespace's pods and Jobs through informers (which survive API server
// restarts by relisting): the last state of every pod ever seen, deletions included, and
// the times of the shim's writes (a Job's resourceVersion changed, a pod created).
type tracker struct {
	mu     sync.Mutex
	pods   map[types.UID]*corev1.Pod
	gone   map[types.UID]time.Time
	writes []time.Time
	stop   context.CancelFunc
}

// stage is what a scenario runs in: its namespace, the directory its pods record into,
// and the tracker of its pods and Jobs.
type stage struct {
	ns, dir string
	tr      *tracker
	cleanup func(failed bool)
}

// stage makes a scenario's namespace and starts tracking it.
func (e *env) stage(ctx context.Context, scenario string) (*stage, error) {
	ns, dir, cleanup, err := e.namespace(ctx, scenario)
	if err != nil {
		return nil, err
	}
	tr, err := e.track(ctx, ns)
	if err != nil {
		cleanup(true)
		return nil, err
	}
	return &stage{ns: ns, dir: dir, tr: tr, cleanup: cleanup}, nil
}

// end stops the tracking, then removes the namespace (kept when the scenario failed).
func (s *stage) end(failed bool) {
	s.tr.stop()
	s.cleanup(failed)
}

func (e *env) track(ctx context.Context, ns string) (*tracker, error) {
	t := &tracker{pods: map[types.UID]*corev1.Pod{}, gone: map[types.UID]time.Time{}}
	ctx, t.stop = context.WithCancel(ctx)
	f := informers.NewSharedInformerFactoryWithOptions(e.cs, 0, informers.WithNamespace(ns))
	pi := f.Core().V1().Pods().Informer()
	ji := f.Batch().V1().Jobs().Informer()
	_, err := pi.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			p := obj.(*corev1.Pod)
			t.mu.Lock()
			defer t.mu.Unlock()
			if ref := metav1.GetControllerOf(p); ref != nil && ref.Kind == "Job" {
				// a pod the shim created: a write
				t.writes = append(t.writes, time.Now())
			}
			t.pods[p.UID] = p
		},
		UpdateFunc: func(_, obj any) {
			p := obj.(*corev1.Pod)
			t.mu.Lock()
			t.pods[p.UID] = p
			t.mu.Unlock()
		},
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			p, ok := obj.(*corev1.Pod)
			if !ok {
				return
			}
			t.mu.Lock()
			t.gone[p.UID] = time.Now()
			t.pods[p.UID] = p // its final state
			t.mu.Unlock()
		},
	})
	if err != nil {
		return nil, err
	}
	_, err = ji.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(old, obj any) {
			if old.(*batchv1.Job).ResourceVersion != obj.(*batchv1.Job).ResourceVersion {
				t.mu.Lock()
				t.writes = append(t.writes, time.Now())
				t.mu.Unlock()
			}
		},
	})
	if err != nil {
		return nil, err
	}
	f.Start(ctx.Done())
	for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return nil, fmt.Errorf("cache of %v in %s did not sync", typ, ns)
		}
	}
	return t, nil
}

// firstWriteAfter is the first write of the shim seen after at (zero when none yet).
func (t *tracker) firstWriteAfter(at time.Time) time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, w := range t.writes {
		if w.After(at) {
			return w
		}
	}
	return time.Time{}
}

// allPods is the last seen state of every pod, gone ones included.
func (t *tracker) allPods() []*corev1.Pod {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]*corev1.Pod, 0, len(t.pods))
	for _, p := range t.pods {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b *corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	return out
}

func (t *tracker) wasDeleted(uid types.UID) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.gone[uid]
	return ok
}

// jobPodsOf is the tracked pods of a Job (by its job-name label).
func (t *tracker) jobPodsOf(job string) []*corev1.Pod {
	var out []*corev1.Pod
	for _, p := range t.allPods() {
		if p.Labels[batchv1.JobNameLabel] == job {
			out = append(out, p)
		}
	}
	return out
}

// active counts the tracked pods of a Job that are neither terminal nor gone.
func (t *tracker) active(job string) int {
	n := 0
	for _, p := range t.jobPodsOf(job) {
		if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed && !t.wasDeleted(p.UID) {
			n++
		}
	}
	return n
}

// finishedCondition is the Job's Complete or Failed condition, if it has one.
func finishedCondition(j *batchv1.Job) *batchv1.JobCondition {
	for i := range j.Status.Conditions {
		c := &j.Status.Conditions[i]
		if (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) && c.Status == corev1.ConditionTrue {
			return c
		}
	}
	return nil
}

// waitJobsFinished waits until every named Job of ns is Complete or Failed.
func (e *env) waitJobsFinished(ctx context.Context, ns string, names []string, timeout time.Duration) (map[string]*batchv1.Job, error) {
	out := map[string]*batchv1.Job{}
	err := lab.Poll(ctx, timeout, "Jobs "+strings.Join(names, ", ")+" to finish", func() (bool, error) {
		for _, n := range names {
			if out[n] != nil {
				continue
			}
			j, err := e.cs.BatchV1().Jobs(ns).Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				return false, nil // the API server may be restarting
			}
			if finishedCondition(j) != nil {
				out[n] = j
			}
		}
		return len(out) == len(names), nil
	})
	if err != nil {
		// What was reached, for the report.
		for _, n := range names {
			if out[n] == nil {
				if j, gerr := e.cs.BatchV1().Jobs(ns).Get(ctx, n, metav1.GetOptions{}); gerr == nil {
					out[n] = j
				}
			}
		}
	}
	return out, err
}

// coronerPods lists coroner's pods (agent and shim).
func (e *env) coronerPods(ctx context.Context) ([]corev1.Pod, error) {
	l, err := e.cs.CoreV1().Pods(lab.ShimNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	return l.Items, nil
}

// restartCounts is the restart count of every coroner container, by pod/container.
func (e *env) restartCounts(ctx context.Context) (map[string]int32, error) {
	pods, err := e.coronerPods(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]int32{}
	for _, p := range pods {
		for _, s := range p.Status.ContainerStatuses {
			out[p.Name+"/"+s.Name] = s.RestartCount
		}
	}
	return out, nil
}

// restartsSince lists the coroner containers that restarted since before (and pods that
// are new or gone).
func restartsSince(before, after map[string]int32) []string {
	var out []string
	for k, v := range after {
		b, ok := before[k]
		switch {
		case !ok:
			out = append(out, k+" (new pod)")
		case v > b:
			out = append(out, fmt.Sprintf("%s restarted %d time(s)", k, v-b))
		}
	}
	for k := range before {
		if _, ok := after[k]; !ok {
			out = append(out, k+" (gone)")
		}
	}
	slices.Sort(out)
	return out
}

// coronerLogs returns the logs of coroner's containers, the previous instance's too, by
// pod/container, since a time.
func (e *env) coronerLogs(ctx context.Context, since time.Time) map[string]string {
	out := map[string]string{}
	pods, err := e.coronerPods(ctx)
	if err != nil {
		return out
	}
	st := metav1.NewTime(since)
	for _, p := range pods {
		for _, s := range p.Status.ContainerStatuses {
			for _, prev := range []bool{false, true} {
				if prev && s.RestartCount == 0 {
					continue
				}
				opts := &corev1.PodLogOptions{Container: s.Name, Previous: prev}
				if !prev {
					opts.SinceTime = &st
				}
				b, err := e.cs.CoreV1().Pods(p.Namespace).GetLogs(p.Name, opts).DoRaw(ctx)
				if err != nil {
					continue
				}
				key := p.Name + "/" + s.Name
				if prev {
					key += " (previous)"
				}
				out[key] = string(b)
			}
		}
	}
	return out
}

// panics finds panics and fatal errors in coroner's logs.
func panics(logs map[string]string) []string {
	var out []string
	for k, l := range logs {
		for _, line := range strings.Split(l, "\n") {
			if strings.HasPrefix(line, "panic: ") || strings.HasPrefix(line, "fatal error: ") || strings.Contains(line, "Observed a panic") {
				out = append(out, k+": "+line)
				break
			}
		}
	}
	slices.Sort(out)
	return out
}

// grepLogs returns the log lines of any coroner container that contain every part.
func grepLogs(logs map[string]string, parts ...string) []string {
	var out []string
	for k, l := range logs {
	line:
		for _, line := range strings.Split(l, "\n") {
			for _, p := range parts {
				if !strings.Contains(line, p) {
					continue line
				}
			}
			out = append(out, k+": "+line)
		}
	}
	slices.Sort(out)
	return out
}

// events lists the Events of ns whose message or reason contains every part.
func (e *env) events(ctx context.Context, ns string, parts ...string) []string {
	l, err := e.cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil
	}
	var out []string
ev:
	for _, ev := range l.Items {
		s := ev.Reason + ": " + ev.Message
		for _, p := range parts {
			if !strings.Contains(s, p) {
				continue ev
			}
		}
		out = append(out, fmt.Sprintf("%s %s/%s %s", ev.Type, strings.ToLower(ev.InvolvedObject.Kind), ev.InvolvedObject.Name, s))
	}
	return out
}

// jitter is a random duration in [lo, hi).
func (e *env) jitter(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(e.rng.Int64N(int64(hi-lo)))
}
