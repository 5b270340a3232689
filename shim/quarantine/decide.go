package quarantine

import (
	"cmp"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/coroner-dev/coroner/conditions"
)

// Death is a pod death blamed on a node (conditions.NodeBlame).
type Death struct {
	// Pod is the pod's namespace/name, UID its UID.
	Pod string
	UID types.UID
	// Class is the cause, one that blames the node.
	Class conditions.DisruptionClass
	// At is when the pod died (deathTime).
	At time.Time
}

// History is what the controller remembers of one node, in memory only.
type History struct {
	// Deaths are the deaths blamed on the node within the window, oldest first (Prune).
	Deaths []Death
	// Last is the time of the latest death blamed on the node, even one pruned: the lift
	// clock of a quarantined node starts there.
	Last time.Time
	// SparedUntil is the time of the latest death a QuarantineSpared Event was emitted
	// for: the node is not reported spared again until a later death.
	SparedUntil time.Time
}

// Add records d unless the history holds its UID already; it reports whether it did.
func (h *History) Add(d Death) bool {
	if slices.ContainsFunc(h.Deaths, func(o Death) bool { return o.UID == d.UID }) {
		return false
	}
	// After the deaths of the same time: in the order observed.
	i := len(h.Deaths)
	for i > 0 && h.Deaths[i-1].At.After(d.At) {
		i--
	}
	h.Deaths = slices.Insert(h.Deaths, i, d)
	if d.At.After(h.Last) {
		h.Last = d.At
	}
	return true
}

// Prune drops the deaths that are out of the window at now (inWindow).
func (h *History) Prune(now time.Time, window time.Duration) {
	h.Deaths = slices.DeleteFunc(h.Deaths, func(d Death) bool { return !inWindow(d.At, now, window) })
}

// inWindow reports whether a death at t is within the window that ends at now: less
// than window ago. A death exactly window ago has aged out.
func inWindow(t, now time.Time, window time.Duration) bool {
	return t.After(now.Add(-window))
}

// Node is what Decide reads of a Node.
type Node struct {
	Name string
	// Taint is the node's coroner.dev/quarantined taint, nil when it has none.
	Taint *corev1.Taint
}

// NodeOf returns what Decide reads of n.
func NodeOf(n *corev1.Node) Node {
	return Node{Name: n.Name, Taint: TaintOf(n)}
}

// TaintOf returns n's coroner.dev/quarantined taint (whatever its effect), nil when it has
// none.
func TaintOf(n *corev1.Node) *corev1.Taint {
	for i := range n.Spec.Taints {
		if n.Spec.Taints[i].Key == conditions.QuarantineTaintKey {
			return &n.Spec.Taints[i]
		}
	}
	return nil
}

// Lifted reports whether the change from old to cur removed the quarantine taint: by
// the controller or by hand, the node's history is forgotten (Controller.forget), so that
// deaths that are already answered for do not quarantine it again at once.
func Lifted(old, cur *corev1.Node) bool {
	return TaintOf(old) != nil && TaintOf(cur) == nil
}

// Options are the quarantine's settings (coroner-shim's --quarantine-* flags).
type Options struct {
	// Deaths within Window quarantine a node.
	Deaths int
	Window time.Duration
	// For is how long a quarantined node must go without a new death before it is lifted.
	For time.Duration
	// Max bounds the nodes quarantined at once.
	Max Max
}

// Defaults (docs/choices.md, "Quarantine: defaults and why").
const (
	DefaultDeaths = 3
	DefaultWindow = 30 * time.Minute
	DefaultFor    = time.Hour
	DefaultMax    = "10%"
)

// Kind is what an Action does.
type Kind string

const (
	// Quarantine taints the node.
	Quarantine Kind = "Quarantine"
	// Spare reports that the node would be quarantined but --quarantine-max is reached.
	Spare Kind = "Spare"
	// Lift removes the taint.
	Lift Kind = "Lift"
)

// Action is one thing to do to one node.
type Action struct {
	Kind Kind
	Node string
	// Cause is the taint's value (Quarantine, Spare).
	Cause conditions.DisruptionClass
	// Deaths are the node's deaths within the window, oldest first (Quarantine, Spare).
	Deaths []Death
	// Holding are the nodes quarantined, and Max the most allowed, when the node was
	// spared (Spare).
	Holding []string
	Max     int
	// QuietSince is when the lift clock started (Lift): the latest death blamed on the
	// node, the taint's timeAdded or the controller's start, whichever is latest.
	QuietSince time.Time
}

// Decision is what Decide returns.
type Decision struct {
	Actions []Action
	// Next is when to decide again if nothing changes before (a lift is due); zero for
	// never.
	Next time.Time
}

// Decide is the quarantine, a pure function: given the time, the controller's start
// (started: the lift clock of a node tainted before it starts then, as the deaths that
// led to the taint were in a memory now lost), the histories by node and the nodes that
// exist, it returns what to do:
//
//   - a quarantined node (with the taint, whoever put it there) is lifted once opts.For
//     has passed since its quiet time: the latest of its latest death, the taint's
//     timeAdded and started;
//   - a node without the taint that has opts.Deaths deaths within opts.Window is
//     quarantined, unless opts.Max nodes (counting those tainted now and those lifted now
//     not) are quarantined: the candidates with the most deaths in the window go first,
//     then the one that reached the count first, then by name; the others are spared
//     (once per new death);
//   - histories of nodes that do not exist are ignored (the caller drops them when the
//     node is deleted).
//
// The cause of a quarantine is the class with the most deaths in the window, ties going
// to the class of the latest of them.
func Decide(now, started time.Time, history map[string]*History, nodes []Node, opts Options) Decision {
	var d Decision
	limit := opts.Max.Of(len(nodes))
	var holding []string
	type candidate struct {
		node    string
		deaths  []Death
		reached time.Time
	}
	var candidates []candidate
	for _, n := range nodes {
		h := history[n.Name]
		if n.Taint != nil {
			quiet := started
			if h != nil && h.Last.After(quiet) {
				quiet = h.Last
			}
			if t := n.Taint.TimeAdded; t != nil && t.After(quiet) {
				quiet = t.Time
			}
			due := quiet.Add(opts.For)
			if !now.Before(due) {
				d.Actions = append(d.Actions, Action{Kind: Lift, Node: n.Name, QuietSince: quiet})
				continue
			}
			holding = append(holding, n.Name)
			d.next(due)
			continue
		}
		if h == nil {
			continue
		}
		var recent []Death
		for _, x := range h.Deaths {
			if inWindow(x.At, now, opts.Window) && !x.At.After(now) {
				recent = append(recent, x)
			}
		}
		if len(recent) >= opts.Deaths {
			candidates = append(candidates, candidate{node: n.Name, deaths: recent, reached: recent[opts.Deaths-1].At})
		}
	}
	slices.SortFunc(candidates, func(a, b candidate) int {
		if c := cmp.Compare(len(b.deaths), len(a.deaths)); c != 0 {
			return c
		}
		if c := a.reached.Compare(b.reached); c != 0 {
			return c
		}
		return cmp.Compare(a.node, b.node)
	})
	for _, c := range candidates {
		a := Action{Node: c.node, Cause: Cause(c.deaths), Deaths: c.deaths}
		if len(holding) < limit {
			a.Kind = Quarantine
			holding = append(holding, c.node)
			d.Actions = append(d.Actions, a)
			continue
		}
		if last := c.deaths[len(c.deaths)-1].At; last.After(history[c.node].SparedUntil) {
			a.Kind, a.Holding, a.Max = Spare, slices.Clone(holding), limit
			d.Actions = append(d.Actions, a)
		}
	}
	return d
}

func (d *Decision) next(t time.Time) {
	if d.Next.IsZero() || t.Before(d.Next) {
		d.Next = t
	}
}

// Cause is the class with the most deaths, ties going to the class of the latest death
// among the tied; deaths are oldest first.
func Cause(deaths []Death) conditions.DisruptionClass {
	count := map[conditions.DisruptionClass]int{}
	latest := map[conditions.DisruptionClass]int{}
	for i, x := range deaths {
		count[x.Class]++
		latest[x.Class] = i
	}
	var best conditions.DisruptionClass
	for c, n := range count {
		if best == "" || n > count[best] || n == count[best] && latest[c] > latest[best] {
			best = c
		}
	}
	return best
}
