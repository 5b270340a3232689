package agent_test

import (
	"net/url"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/test/containerd"
	"github.com/coroner-dev/coroner/test/containerd/containerdtest"
)

// TestFencingTurnedOff: an agent with --fencing writes its Lease and stops (an operator
// turns fencing off: the DaemonSet rolls); the agent that follows without --fencing takes
// fence-after off the Lease at its start, so that the shim reads "does not fence" rather
// than taking the stale Lease for a fence (which it did before the fix: bench-nodeloss's
// second partition saw coroner-shim recover a pod as NodeFenced with no fencing on). The
// fenced-at record stays.
func TestFencingTurnedOff(t *testing.T) { containerdtest.Each(t, testFencingTurnedOff) }

func testFencingTurnedOff(t *testing.T, env *containerd.Env) {
	const fenceAfter = 10 * time.Second
	node := "node-fence-off-" + strings.ReplaceAll(env.Containerd.Name, ".", "-")
	f := newFixture(t, env)
	ctx := f.ctx
	f.registerNode(node)
	u, err := url.Parse(f.api.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	leases := f.client.CoordinationV1().Leases(f.ns)
	name := conditions.AgentLeaseName(node)

	fencing := startLeaseAgent(t, f, node, u.Host, true, fenceAfter)
	var l *coordinationv1.Lease
	waitFor(t, "the fencing agent's Lease", func() bool {
		l, err = leases.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false
		}
		if err != nil {
			t.Fatal(err)
		}
		return l.Annotations[conditions.AnnotationFenceAfter] == fenceAfter.String()
	})
	fencing.stop()
	// An earlier fence's record, as a fenced agent back on the API server leaves it.
	l, err = leases.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	const fencedAt = "2026-11-27T12:00:00Z"
	l.Annotations[conditions.AnnotationFencedAt] = fencedAt
	if l, err = leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	later := l.Spec.RenewTime.Add(time.Hour)
	if st := conditions.NodeFenced(conditions.FenceEvidence{Node: node, Agent: l}, later, 0); !st.Fenced {
		t.Fatalf("the stale Lease of an agent that fenced, an hour on: %+v; want fenced (what the shim concludes)", st)
	}

	off := startLeaseAgent(t, f, node, u.Host, false, 0)
	waitFor(t, "fence-after taken off the Lease", func() bool {
		off.running(t)
		l, err = leases.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		_, ok := l.Annotations[conditions.AnnotationFenceAfter]
		return !ok
	})
	t.Logf("fence-after off the Lease %v after the agent's start without --fencing", time.Since(off.started).Round(time.Millisecond))
	if got := l.Annotations[conditions.AnnotationFencedAt]; got != fencedAt {
		t.Errorf("fenced-at %q after the agent without --fencing, want the record %q kept", got, fencedAt)
	}
	if st := conditions.NodeFenced(conditions.FenceEvidence{Node: node, Agent: l}, later, 0); st.Fenced || !strings.Contains(st.Why, "does not fence") {
		t.Errorf("the Lease after the agent without --fencing, an hour on: %+v; want not fenced, \"does not fence\"", st)
	}
	off.stop()
	// Started again without --fencing: nothing left to change, and no error.
	rv := l.ResourceVersion
	again := startLeaseAgent(t, f, node, u.Host, false, 0)
	again.running(t)
	again.stop()
	if l, err = leases.Get(ctx, name, metav1.GetOptions{}); err != nil || l.ResourceVersion != rv {
		t.Errorf("the Lease after a second agent without --fencing: %v, resourceVersion %s, want %s (unchanged)", err, l.ResourceVersion, rv)
	}
}
