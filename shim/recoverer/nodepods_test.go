package recoverer

import (
	"context"
	"fmt"
	goruntime "runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/informers"
	"github.com/coroner-dev/coroner/shim/metrics"
	"github.com/coroner-dev/coroner/shim/recovery"
)

// TestNodePodInformers runs the recoverer on informers of a fake clientset: an informer of
// a node's pods is recorded when the node is tainted before Run (the initial list) and
// started by Run, started when a node gets the taint, stopped when the taint goes or the
// node is deleted, started again when the taint comes back; the opted-in bare pods of the
// watched nodes are recovered (failed and force-deleted), a pod that is not opted in is
// not, nor the pod of a node not tainted yet. When Run returns, every informer it started
// has stopped, none starts any more, and no goroutine is left.
func TestNodePodInformers(t *testing.T) {
	goroutines := goruntime.NumGoroutine()

	clk := clocktesting.NewFakeClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	healthy := func(name string) *corev1.Node { return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}} }
	zombie := func(name, node string, optedIn bool) *corev1.Pod {
		return deletedAt(podOn(name, node, nil, optedIn), clk.Now().Add(-2*threshold))
	}
	client := fake.NewClientset(unreachableNode("a"), healthy("b"), healthy("c"),
		zombie("on-a", "a", true), zombie("plain-on-a", "a", false), zombie("on-b", "b", true), zombie("on-c", "c", true))
	serveNodeSelector(client)
	inf := informers.New(client, informers.Config{OtherPodsNamespace: testNS})
	m := metrics.New(prometheus.NewRegistry())
	r := New(context.Background(), client, inf, Config{
		Recovery: recovery.Config{Threshold: threshold}, RecoverPods: RecoverAll,
		Clock: clk, Metrics: m, Recorder: record.NewFakeRecorder(100),
	})
	watchOf := func(node string) *nodeWatch {
		r.nodes.mu.Lock()
		defer r.nodes.mu.Unlock()
		return r.nodes.byNode[node]
	}
	watching := func(what string, want ...string) {
		t.Helper()
		eventually(t, fmt.Sprintf("%s: watching the pods of %q", what, want), func() bool { return slices.Equal(r.WatchedNodes(), want) })
	}
	gone := func(pod string) {
		t.Helper()
		eventually(t, "pod "+pod+" force-deleted", func() bool {
			_, err := client.CoreV1().Pods(testNS).Get(context.Background(), pod, metav1.GetOptions{})
			return apierrors.IsNotFound(err)
		})
	}
	exists := func(pod string) {
		t.Helper()
		if _, err := client.CoreV1().Pods(testNS).Get(context.Background(), pod, metav1.GetOptions{}); err != nil {
			t.Errorf("pod %s: %v, want it left alone", pod, err)
		}
	}
	// podLists counts the lists of pods by node (the field selector).
	podLists := func() map[string]int {
		n := map[string]int{}
		for _, a := range client.Actions() {
			if l, ok := a.(k8stesting.ListAction); ok && a.GetResource().Resource == "pods" && l.GetListRestrictions().Fields != nil {
				if node, ok := l.GetListRestrictions().Fields.RequiresExactMatch("spec.nodeName"); ok {
					n[node]++
				}
			}
		}
		return n
	}
	setTaints := func(node string, taints []corev1.Taint) {
		t.Helper()
		n, err := client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Spec.Taints = taints
		if _, err := client.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// The informers start before Run: node a's informer is recorded, not started.
	stop := make(chan struct{})
	inf.Start(stop)
	watching("before Run", "a")
	if n := podLists(); len(n) != 0 {
		t.Errorf("before Run: lists of a node's pods %v, want none", n)
	}

	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- r.Run(ctx) }()
	gone("on-a")
	exists("on-b") // node b is not tainted yet: not watched
	if n := podLists(); len(n) != 1 || n["a"] != 1 {
		t.Errorf("lists of a node's pods %v, want one of node a's", n)
	}
	if n := counter(t, m.PodsRecovered.WithLabelValues(string(recovery.ForceTerminate), conditions.ReasonNodeUnreachable)); n != 1 {
		t.Errorf("coroner_pods_recovered_total = %v, want 1", n)
	}

	setTaints("b", unreachableNode("b").Spec.Taints)
	watching("node b tainted", "a", "b")
	gone("on-b")

	onA := watchOf("a")
	setTaints("a", nil)
	watching("node a's taint removed", "b")
	eventually(t, "node a's informer stopped", onA.inf.IsStopped)

	onB := watchOf("b")
	if err := client.CoreV1().Nodes().Delete(context.Background(), "b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	watching("node b deleted")
	eventually(t, "node b's informer stopped", onB.inf.IsStopped)

	setTaints("a", unreachableNode("a").Spec.Taints)
	watching("node a tainted again", "a")
	eventually(t, "node a's pods listed again", func() bool { return podLists()["a"] == 2 })
	onA = watchOf("a")
	exists("plain-on-a") // not opted in
	exists("on-c")       // node c never tainted
	if n := podLists()["c"]; n != 0 {
		t.Errorf("node c's pods listed %d times, want never", n)
	}

	cancel()
	if err := <-runErr; err != nil {
		t.Fatalf("Run: %v", err)
	}
	// Run waited for its informers.
	if !onA.inf.IsStopped() {
		t.Error("node a's informer still runs after Run returned")
	}
	buf := make([]byte, 1<<20)
	if stacks := string(buf[:goruntime.Stack(buf, true)]); strings.Contains(stacks, "recoverer.(*nodeWatches).start") {
		t.Errorf("an informer of a node's pods still runs after Run returned:\n%s", stacks)
	}
	if got := r.WatchedNodes(); len(got) != 0 {
		t.Errorf("after Run: watching the pods of %q, want none", got)
	}
	r.updateNode(healthy("c"), unreachableNode("c"))
	if got := r.WatchedNodes(); len(got) != 0 {
		t.Errorf("a node tainted after Run returned: watching the pods of %q, want none", got)
	}

	close(stop)
	inf.Shutdown()
	eventually(t, "no goroutine left", func() bool { return goruntime.NumGoroutine() <= goroutines })
}

// serveNodeSelector makes the fake clientset serve the lists and watches of pods that
// select spec.nodeName (informers.Informers.NodePods) with only the pods of that node, as
// the API server does: the fake ignores field selectors.
func serveNodeSelector(c *fake.Clientset) {
	gvr := corev1.SchemeGroupVersion.WithResource("pods")
	gvk := corev1.SchemeGroupVersion.WithKind("Pod")
	c.PrependReactor("list", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		l := a.(k8stesting.ListActionImpl)
		node, ok := nodeSelected(l.ListRestrictions.Fields)
		if !ok {
			return false, nil, nil
		}
		obj, err := c.Tracker().List(gvr, gvk, a.GetNamespace(), l.ListOptions)
		if err != nil {
			return true, nil, err
		}
		list := obj.(*corev1.PodList)
		list.Items = slices.DeleteFunc(list.Items, func(p corev1.Pod) bool { return p.Spec.NodeName != node })
		return true, list, nil
	})
	c.PrependWatchReactor("pods", func(a k8stesting.Action) (bool, watch.Interface, error) {
		w := a.(k8stesting.WatchActionImpl)
		node, ok := nodeSelected(w.WatchRestrictions.Fields)
		if !ok {
			return false, nil, nil
		}
		src, err := c.Tracker().Watch(gvr, a.GetNamespace(), w.ListOptions)
		if err != nil {
			return true, nil, err
		}
		return true, newNodeFilter(src, node), nil
	})
}

func nodeSelected(s interface {
	RequiresExactMatch(string) (string, bool)
}) (string, bool) {
	if s == nil {
		return "", false
	}
	return s.RequiresExactMatch("spec.nodeName")
}

// nodeFilter passes on the events of src's pods bound to node. Unlike watch.Filter, its
// goroutine ends at Stop even when nobody reads the events any more.
type nodeFilter struct {
	src  watch.Interface
	out  chan watch.Event
	done chan struct{}
	once sync.Once
}

func newNodeFilter(src watch.Interface, node string) *nodeFilter {
	f := &nodeFilter{src: src, out: make(chan watch.Event), done: make(chan struct{})}
	go func() {
		defer close(f.out)
		for {
			select {
			case e, ok := <-src.ResultChan():
				if !ok {
					return
				}
				if p, isPod := e.Object.(*corev1.Pod); isPod && p.Spec.NodeName != node {
					continue
				}
				select {
				case f.out <- e:
				case <-f.done:
					return
				}
			case <-f.done:
				return
			}
		}
	}()
	return f
}

func (f *nodeFilter) ResultChan() <-chan watch.Event { return f.out }

func (f *nodeFilter) Stop() {
	f.once.Do(func() {
		close(f.done)
		f.src.Stop()
	})
}

// eventually polls cond until it holds, or fails the test after 10 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
