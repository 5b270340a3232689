package agent_test

import (
	"context"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/agent"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/test/containerd"
	"github.com/coroner-dev/coroner/test/containerd/containerdtest"
	"github.com/coroner-dev/coroner/test/integration/agent/kubeletsim"
)

// TestFencingOnNodeLease (A6, --fence-signal=node-lease): the agent watches its kubelet's
// node Lease instead of renewing its own. A kubelet (this test) renews that Lease every
// second through the node's link to the API server (the proxy), as the agent talks
// through it. At rest the agent writes nothing: its own Lease once, at the start, naming
// its pod. When the node is cut off, the kubelet's renewals stop and the agent stops the
// opted-in container at the last renewTime + fence-after (the shim's deadline, less its
// margin), and only it; back, it records fenced-at and one Fenced Event.
func TestFencingOnNodeLease(t *testing.T) { containerdtest.Each(t, testFencingOnNodeLease) }

func testFencingOnNodeLease(t *testing.T, env *containerd.Env) {
	const fenceAfter = 10 * time.Second
	node := "node-kubelet-fence-" + strings.ReplaceAll(env.Containerd.Name, ".", "-")
	f := newFixture(t, env)
	ctx := f.ctx

	n := f.registerNode(node)
	cmd := stopsOnTerm
	in := f.fencePod(node, "opted-in", map[string]string{conditions.AnnotationSafeToForcefullyDelete: "true"}, containerd.Container{Name: "main", Command: cmd})
	out := f.fencePod(node, "not-opted-in", nil, containerd.Container{Name: "main", Command: cmd})
	inID := f.start(in)
	outID := f.start(out)

	u, err := url.Parse(f.api.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	proxy := startProxy(t, u.Host)
	k := startKubeletLease(t, f, node, proxy.Addr())
	a := startAgentWith(t, f, node, proxy.Addr(), true, fenceAfter, func(o *agent.Options) {
		o.FenceSignal, o.PodName, o.PodNamespace = conditions.FenceSignalNodeLease, "coroner-agent-test", f.ns
	})

	lease := func() *coordinationv1.Lease { return f.agentLease(t, node) }
	var l *coordinationv1.Lease
	waitFor(t, "the agent's Lease", func() bool {
		l = lease()
		return l != nil
	})
	if l.Annotations[conditions.AnnotationFenceOnNodeLease] != "10s" || l.Annotations[conditions.AnnotationAgentPod] != f.ns+"/coroner-agent-test" {
		t.Fatalf("the agent's Lease annotations %v: want %s=10s, %s=%s/coroner-agent-test", l.Annotations,
			conditions.AnnotationFenceOnNodeLease, conditions.AnnotationAgentPod, f.ns)
	}
	if _, ok := l.Annotations[conditions.AnnotationFenceAfter]; ok {
		t.Errorf("the agent's Lease has %s: an older shim would take its silence for a fence", conditions.AnnotationFenceAfter)
	}
	// At rest: 8 s of kubelet renewals, no write of the agent's Lease.
	written := l.ResourceVersion
	time.Sleep(8 * time.Second)
	if got := lease(); got.ResourceVersion != written {
		t.Errorf("the agent's Lease written at rest: resourceVersion %s, then %s (annotations %v)", written, got.ResourceVersion, got.Annotations)
	}
	if v := a.metric(t, "coroner_agent_fenced"); v != 0 {
		t.Fatalf("fenced = %v before the cut", v)
	}

	// Cut the node off: the kubelet's renewals stop with the agent's link.
	cut := time.Now()
	proxy.Cut()
	time.Sleep(1500 * time.Millisecond) // a renewal in flight at the cut lands or fails
	// The agent's last renewal seen is at most the API server's last renewTime, and at
	// least the kubelet's last renewal it was told of less one period: the watch event of
	// a renewal that landed just before the cut may be cut off with the agent's link
	// (it then fences a period early, which is safe), as may the kubelet's answer.
	server, err := f.client.CoordinationV1().Leases(conditions.NodeLeaseNamespace).Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	last, lastOnServer := k.lastRenewal(t), server.Spec.RenewTime.Time
	finished := waitExited(t, f, in, inID, time.Now().Add(fenceAfter+8*time.Second), "the opted-in container")
	t.Logf("cut -> opted-in container stopped: %v (its exit %v after the kubelet's last renewTime on the API server, %v after the last it was told of; fence-after %v)",
		finished.Sub(cut).Round(time.Millisecond), finished.Sub(lastOnServer).Round(time.Millisecond), finished.Sub(last).Round(time.Millisecond), fenceAfter)
	if earliest := last.Add(fenceAfter - kubeletRenewPeriod); finished.Before(earliest) {
		t.Errorf("stopped at %v, before the kubelet's last renewal (%v) less one period + fence-after", finished, last)
	}
	// What the shim relies on: stopped within renewTime + fence-after + its margin.
	if late := finished.Sub(lastOnServer.Add(fenceAfter)); late > 3*time.Second {
		t.Errorf("stopped %v after the kubelet's last renewTime + fence-after: past what the shim's margin covers", late)
	}
	if v := a.metric(t, "coroner_agent_fenced"); v != 1 {
		t.Errorf("fenced = %v while cut off", v)
	}
	f.wantRunning(out, outID, "the pod that is not opted in")

	// Back: the kubelet renews, the agent sees it, records fenced-at and one Event.
	restored := time.Now()
	proxy.Restore()
	waitFor(t, "fenced-at on the agent's Lease", func() bool {
		l = lease()
		_, ok := l.Annotations[conditions.AnnotationFencedAt]
		return ok
	})
	t.Logf("fenced-at written %v after the restore", time.Since(restored).Round(time.Millisecond))
	ev := waitFencedEvent(t, f, n)
	t.Logf("Event %s %s: %q", ev.Type, ev.Reason, ev.Message)
	if !strings.HasPrefix(ev.Message, "The kubelet's node Lease went unrenewed for ") || !strings.Contains(ev.Message, f.ns+"/opted-in") ||
		strings.Contains(ev.Message, "not-opted-in") || !strings.Contains(ev.Message, "--fence-after 10s") {
		t.Errorf("Event message %q: want the kubelet's silence and %s/opted-in only", ev.Message, f.ns)
	}
	waitFor(t, "the fence gauge back to 0", func() bool { return a.metric(t, "coroner_agent_fenced") == 0 })
	f.wantRunning(out, outID, "the pod that is not opted in, after the fence")
}

// kubeletRenewPeriod is how often startKubeletLease renews.
const kubeletRenewPeriod = time.Second

// kubeletLease renews a node's Lease in kube-node-lease every kubeletRenewPeriod, as a
// kubelet with a 4 s node lease does, through host.
type kubeletLease struct {
	mu   sync.Mutex
	last time.Time
}

func (k *kubeletLease) lastRenewal(t *testing.T) time.Time {
	t.Helper()
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.last.IsZero() {
		t.Fatal("the kubelet never renewed its Lease")
	}
	return k.last
}

// startKubeletLease creates the node's Lease and renews it every second until the test
// ends; renewals that fail (the node cut off) are skipped, as the kubelet retries.
func startKubeletLease(t *testing.T, f *fixture, node, host string) *kubeletLease {
	t.Helper()
	cfg := rest.CopyConfig(f.api.Config)
	cfg.Host = "https://" + host
	cfg.Timeout = 2 * time.Second
	cs := kubernetes.NewForConfigOrDie(cfg)
	leases := cs.CoordinationV1().Leases(conditions.NodeLeaseNamespace)
	k := &kubeletLease{}
	renew := func(ctx context.Context) {
		now := metav1.NewMicroTime(time.Now())
		l, err := leases.Get(ctx, node, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			l, err = leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: node, Namespace: conditions.NodeLeaseNamespace},
				Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node), LeaseDurationSeconds: ptr.To[int32](4), RenewTime: &now}}, metav1.CreateOptions{})
		case err == nil:
			l.Spec.RenewTime = &now
			l, err = leases.Update(ctx, l, metav1.UpdateOptions{})
		}
		if err == nil {
			k.mu.Lock()
			k.last = l.Spec.RenewTime.Time
			k.mu.Unlock()
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
			renew(rctx)
			rcancel()
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		_ = f.client.CoordinationV1().Leases(conditions.NodeLeaseNamespace).Delete(context.Background(), node, metav1.DeleteOptions{})
	})
	waitFor(t, "the kubelet's first renewal", func() bool {
		k.mu.Lock()
		defer k.mu.Unlock()
		return !k.last.IsZero()
	})
	return k
}

// waitExited waits until the container id of p has exited, failing the test at deadline,
// and returns when it finished (the runtime's record).
func waitExited(t *testing.T, f *fixture, p *kubeletsim.Pod, id string, deadline time.Time, what string) time.Time {
	t.Helper()
	for {
		st, err := p.Status(f.ctx, id)
		if err == nil && st.GetState().String() == "CONTAINER_EXITED" {
			return kubeletsim.FinishedAt(st)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still runs at the deadline %v", what, deadline.Format(time.RFC3339Nano))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitFencedEvent waits for the Fenced Event on the Node n, which must be the only one.
func waitFencedEvent(t *testing.T, f *fixture, n *corev1.Node) corev1.Event {
	t.Helper()
	var ev corev1.Event
	waitFor(t, "the Fenced Event", func() bool {
		evs, err := f.client.CoreV1().Events(metav1.NamespaceDefault).List(f.ctx, metav1.ListOptions{FieldSelector: fields.Set{
			"involvedObject.kind": "Node", "involvedObject.name": n.Name, "involvedObject.uid": string(n.UID),
			"reason": conditions.EventReasonFenced,
		}.String()})
		if err != nil || len(evs.Items) == 0 {
			return false
		}
		if len(evs.Items) > 1 || evs.Items[0].Count > 1 {
			t.Fatalf("%d Fenced Events (count %d), want one: %+v", len(evs.Items), evs.Items[0].Count, evs.Items)
		}
		ev = evs.Items[0]
		return true
	})
	return ev
}

// agentLease is node's agent Lease in the fixture's namespace, nil while there is none.
// (A typed client's Get answers NotFound with an empty object, not nil: checking for nil
// on its result passed before the agent had written anything.)
func (f *fixture) agentLease(t *testing.T, node string) *coordinationv1.Lease {
	t.Helper()
	l, err := f.client.CoordinationV1().Leases(f.ns).Get(f.ctx, conditions.AgentLeaseName(node), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return l
}
