// Package quarantine is `coronerctl quarantine`: the nodes coroner-shim quarantined (the
// taint coroner.dev/quarantined, shim/quarantine), and lifting a quarantine by hand, with
// the user's own credentials.
package quarantine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/coroner-dev/coroner/conditions"
)

// Usage is the summary of `coronerctl quarantine --help`.
const Usage = `coronerctl quarantine list|lift: the nodes coroner-shim quarantined.

With coroner-shim --quarantine, a node on which too many pods of coroner's Jobs died of
causes that blame the node (a failed device, a node OOM, node pressure, a lost node) gets
the taint coroner.dev/quarantined=<cause>:NoSchedule: no new pod is scheduled there, running
pods stay. The shim lifts it after --quarantine-for without another such death.

  coronerctl quarantine list         every quarantined node: its cause, since when, whether it schedules
  coronerctl quarantine lift NODE    remove the taint now (only that taint), with your credentials;
                                     the shim forgets the deaths that led to it`

// ErrNotQuarantined is returned by Lift for a node without the taint.
var ErrNotQuarantined = errors.New("not quarantined")

// Row is one quarantined node of List.
type Row struct {
	Node  string
	Cause string
	// Since is when the node was quarantined: the taint's timeAdded, else the latest
	// NodeQuarantined Event on it; zero when neither says.
	Since time.Time
	// Schedules says whether new pods can be scheduled on the node: "no" (the taint is
	// NoSchedule or NoExecute: only pods that tolerate it), "discouraged"
	// (PreferNoSchedule), with ", cordoned" when the node is unschedulable too.
	Schedules string
}

// List returns the nodes with the quarantine taint, by name.
func List(ctx context.Context, cs kubernetes.Interface) ([]Row, error) {
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing the nodes: %w", err)
	}
	var rows []Row
	for i := range nodes.Items {
		n := &nodes.Items[i]
		t := taintOf(n)
		if t == nil {
			continue
		}
		r := Row{Node: n.Name, Cause: t.Value, Schedules: "no"}
		if t.Effect == corev1.TaintEffectPreferNoSchedule {
			r.Schedules = "discouraged"
		}
		if n.Spec.Unschedulable {
			r.Schedules += ", cordoned"
		}
		if t.TimeAdded != nil {
			r.Since = t.TimeAdded.Time
		} else {
			r.Since = lastQuarantinedEvent(ctx, cs, n.Name)
		}
		rows = append(rows, r)
	}
	slices.SortFunc(rows, func(a, b Row) int { return strings.Compare(a.Node, b.Node) })
	return rows, nil
}

// lastQuarantinedEvent is the time of the latest NodeQuarantined Event on the node; zero
// when there is none or the Events cannot be read (they are a lossy stream).
func lastQuarantinedEvent(ctx context.Context, cs kubernetes.Interface, node string) time.Time {
	sel := fields.Set{"involvedObject.kind": "Node", "involvedObject.name": node, "reason": conditions.ReasonNodeQuarantined}.AsSelector().String()
	list, err := cs.CoreV1().Events(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		return time.Time{}
	}
	var last time.Time
	for _, e := range list.Items {
		if e.InvolvedObject.Kind != "Node" || e.InvolvedObject.Name != node || e.Reason != conditions.ReasonNodeQuarantined {
			continue // the selector is the server's; checked again
		}
		for _, t := range []time.Time{e.LastTimestamp.Time, e.EventTime.Time, e.FirstTimestamp.Time} {
			if t.After(last) {
				last = t
			}
		}
	}
	return last
}

// Print writes rows as a table, ages relative to now; "No quarantined nodes." when there
// are none.
func Print(w io.Writer, rows []Row, now time.Time) error {
	if len(rows) == 0 {
		_, err := fmt.Fprintln(w, "No quarantined nodes.")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tCAUSE\tSINCE\tSCHEDULES")
	for _, r := range rows {
		since := "unknown"
		if !r.Since.IsZero() {
			since = fmt.Sprintf("%s (%s ago)", r.Since.UTC().Format(time.RFC3339), now.Sub(r.Since).Round(time.Second))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Node, r.Cause, since, r.Schedules)
	}
	return tw.Flush()
}

// liftAttempts bounds the retries of a lift whose patch found the node changed.
const liftAttempts = 5

// Lift removes the quarantine taint of node, and only it, with a JSON patch guarded by
// the node's resourceVersion (conditions.QuarantineTaintPatch), read again and retried
// when the node changed in between. It says what it did on w. An unknown node and a node
// without the taint are errors (the latter ErrNotQuarantined).
func Lift(ctx context.Context, cs kubernetes.Interface, w io.Writer, node string) error {
	nodes := cs.CoreV1().Nodes()
	var err error
	for range liftAttempts {
		var n *corev1.Node
		n, err = nodes.Get(ctx, node, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("node %q not found", node)
		}
		if err != nil {
			return fmt.Errorf("reading node %s: %w", node, err)
		}
		t := taintOf(n)
		if t == nil {
			return fmt.Errorf("node %s is %w: it has no taint %s", node, ErrNotQuarantined, conditions.QuarantineTaintKey)
		}
		var body []byte
		body, err = conditions.QuarantineTaintPatch(n, nil)
		if err != nil {
			return err
		}
		_, err = nodes.Patch(ctx, node, types.JSONPatchType, body, metav1.PatchOptions{FieldManager: "coronerctl"})
		if err == nil {
			_, err = fmt.Fprintf(w, "node %s: quarantine lifted (taint %s=%s:%s removed); coroner-shim forgets the deaths that led to it\n",
				node, conditions.QuarantineTaintKey, t.Value, t.Effect)
			return err
		}
		// The resourceVersion test failed (422) or the write conflicted (409): the node
		// changed since it was read; read it again.
		if !apierrors.IsInvalid(err) && !apierrors.IsConflict(err) {
			break
		}
	}
	return fmt.Errorf("removing the taint %s of node %s: %w", conditions.QuarantineTaintKey, node, err)
}

func taintOf(n *corev1.Node) *corev1.Taint {
	for i := range n.Spec.Taints {
		if n.Spec.Taints[i].Key == conditions.QuarantineTaintKey {
			return &n.Spec.Taints[i]
		}
	}
	return nil
}
