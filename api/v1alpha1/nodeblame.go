package v1alpha1

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/coroner-dev/coroner/conditions"
)

// Node blame (docs/choices.md, "When a node keeps killing pods"): a Job opts in to moving
// the replacement of a pod off the node that killed it (AnnotationAvoidFailedNodes) and
// to bounding the failures its podFailurePolicy Ignores (AnnotationDisruptionBudget).
// coroner-shim carries what it must remember from one pod of an index (of a NonIndexed
// Job) to the next on the pods it creates (AnnotationAvoidedNodes,
// AnnotationDisruptionsCharged), as the built-in controller carries the per-index failure
// counts, and marks a failed pod with what its budget did (AnnotationBudgetVerdict) in
// the patch that removes its tracking finalizer. The classes are
// conditions.DisruptionClass.

const (
	// AnnotationAvoidFailedNodes on a Job: "preferred", "required" or "none" (coroner-shim's
	// --avoid-failed-nodes gives the default of Jobs without it).
	AnnotationAvoidFailedNodes = conditions.Prefix + "avoid-failed-nodes"
	// AnnotationDisruptionBudget on a Job: "class=N,..." (DisruptionBudget).
	AnnotationDisruptionBudget = conditions.Prefix + "disruption-budget"
	// AnnotationAvoidedNodes on a pod coroner-shim made: the nodes that killed a
	// predecessor of its index (of its Job), oldest first, at most MaxAvoidedNodes, as
	// "node=class,node=class" (AvoidedNodes). Its affinity keeps it off them (unless
	// the avoidance is "none").
	AnnotationAvoidedNodes = conditions.Prefix + "avoided-nodes"
	// AnnotationDisruptionsCharged on a pod coroner-shim made: the failures of its index
	// (of its Job) that a disruption budget let an Ignore rule ignore before it was made,
	// as "class=id+id,class=id" (Charged; an id is the first 8 characters of the failed
	// pod's UID).
	AnnotationDisruptionsCharged = conditions.Prefix + "disruptions-charged"
	// AnnotationBudgetVerdict on a failed pod of a Job with a disruption budget, set with
	// the removal of its tracking finalizer: "charged <class>" when the budget let the
	// Ignore rule ignore it, "spent <class>" when the budget was spent and it counted.
	AnnotationBudgetVerdict = conditions.Prefix + "disruption-budget-verdict"

	// MaxAvoidedNodes bounds the nodes a pod avoids: the last ones.
	MaxAvoidedNodes = 8
	// MaxDisruptionBudget bounds a class's budget (the ids of its charged failures ride
	// on every pod of the index).
	MaxDisruptionBudget = 100
	// ChargedIDLength is the length of a charged failure's id.
	ChargedIDLength = 8
)

// Avoidance is a Job's AnnotationAvoidFailedNodes.
type Avoidance string

const (
	AvoidNone      Avoidance = "none"
	AvoidPreferred Avoidance = "preferred"
	AvoidRequired  Avoidance = "required"
)

// ParseAvoidance reads an avoidance; "" is an error too.
func ParseAvoidance(v string) (Avoidance, error) {
	switch a := Avoidance(strings.TrimSpace(v)); a {
	case AvoidNone, AvoidPreferred, AvoidRequired:
		return a, nil
	}
	return "", fmt.Errorf("%s %q: want preferred, required or none", AnnotationAvoidFailedNodes, v)
}

// AvoidanceOf is the avoidance of a Job with these annotations, def when it has none.
// A value that does not parse is an error, and the avoidance is then def.
func AvoidanceOf(annotations map[string]string, def Avoidance) (Avoidance, error) {
	v, ok := annotations[AnnotationAvoidFailedNodes]
	if !ok {
		return def, nil
	}
	a, err := ParseAvoidance(v)
	if err != nil {
		return def, err
	}
	return a, nil
}

// DisruptionBudget is a Job's AnnotationDisruptionBudget: how many failures of each class
// its podFailurePolicy's Ignore rules may ignore, per index for an Indexed Job, per Job
// otherwise. DisruptionDefault is the budget of the classes not named; a class neither
// named nor covered by a default is unbounded.
type DisruptionBudget map[conditions.DisruptionClass]int

// ParseDisruptionBudget reads "class=N,..." (spaces allowed around the parts): every
// class one of conditions.DisruptionClasses, named once, N from 0 to
// MaxDisruptionBudget. The error names each bad part.
func ParseDisruptionBudget(v string) (DisruptionBudget, error) {
	b := DisruptionBudget{}
	var errs []error
	if strings.TrimSpace(v) == "" {
		return nil, fmt.Errorf("%s is empty: want class=N,... as in device=3,node-oom=5,default=20", AnnotationDisruptionBudget)
	}
	for part := range strings.SplitSeq(v, ",") {
		key, val, ok := strings.Cut(strings.TrimSpace(part), "=")
		class := conditions.DisruptionClass(strings.TrimSpace(key))
		n, err := strconv.Atoi(strings.TrimSpace(val))
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("%q is not class=N", strings.TrimSpace(part)))
		case !class.Valid():
			errs = append(errs, fmt.Errorf("unknown class %q (want %s)", class, classList()))
		case err != nil || n < 0 || n > MaxDisruptionBudget:
			errs = append(errs, fmt.Errorf("%s=%q: want a whole number from 0 to %d", class, strings.TrimSpace(val), MaxDisruptionBudget))
		default:
			if _, dup := b[class]; dup {
				errs = append(errs, fmt.Errorf("class %s is named twice", class))
				continue
			}
			b[class] = n
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("%s %q: %w", AnnotationDisruptionBudget, v, err)
	}
	return b, nil
}

func classList() string {
	var s []string
	for _, c := range conditions.DisruptionClasses {
		s = append(s, string(c))
	}
	return strings.Join(s, ", ")
}

// DisruptionBudgetOf is the budget of a Job with these annotations: nil without one, nil
// and an error when it does not parse.
func DisruptionBudgetOf(annotations map[string]string) (DisruptionBudget, error) {
	v, ok := annotations[AnnotationDisruptionBudget]
	if !ok {
		return nil, nil
	}
	return ParseDisruptionBudget(v)
}

// Limit is the budget of class c and the class whose budget it is (c, or
// DisruptionDefault); ok is false when c is unbounded.
func (b DisruptionBudget) Limit(c conditions.DisruptionClass) (n int, of conditions.DisruptionClass, ok bool) {
	if n, ok := b[c]; ok {
		return n, c, true
	}
	if n, ok := b[conditions.DisruptionDefault]; ok {
		return n, conditions.DisruptionDefault, true
	}
	return 0, "", false
}

// String is the budget in the annotation's form, classes in conditions.DisruptionClasses
// order.
func (b DisruptionBudget) String() string {
	var parts []string
	for _, c := range conditions.DisruptionClasses {
		if n, ok := b[c]; ok {
			parts = append(parts, fmt.Sprintf("%s=%d", c, n))
		}
	}
	return strings.Join(parts, ",")
}

// AvoidedNode is a node a pod avoids and the class of the death that blamed it.
type AvoidedNode struct {
	Node  string
	Class conditions.DisruptionClass
}

// AvoidedNodes is the value of AnnotationAvoidedNodes, oldest first.
type AvoidedNodes []AvoidedNode

// ParseAvoidedNodes reads "node=class,...". Malformed parts are an error; the parts that
// parse are returned with it, so that a damaged annotation loses only what is damaged.
func ParseAvoidedNodes(v string) (AvoidedNodes, error) {
	var out AvoidedNodes
	var errs []error
	if strings.TrimSpace(v) == "" {
		return nil, nil
	}
	for part := range strings.SplitSeq(v, ",") {
		node, class, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || node == "" || !conditions.DisruptionClass(class).BlamesNode() {
			errs = append(errs, fmt.Errorf("%q is not node=class with a class that blames a node", part))
			continue
		}
		out = out.Add(node, conditions.DisruptionClass(class))
	}
	if err := errors.Join(errs...); err != nil {
		return out, fmt.Errorf("%s %q: %w", AnnotationAvoidedNodes, v, err)
	}
	return out, nil
}

// Add is a with node blamed last (moved to the end if it was there), the oldest dropped
// past MaxAvoidedNodes. a is not modified.
func (a AvoidedNodes) Add(node string, class conditions.DisruptionClass) AvoidedNodes {
	out := slices.DeleteFunc(slices.Clone(a), func(x AvoidedNode) bool { return x.Node == node })
	out = append(out, AvoidedNode{Node: node, Class: class})
	if len(out) > MaxAvoidedNodes {
		out = out[len(out)-MaxAvoidedNodes:]
	}
	return out
}

// Nodes are the node names, oldest first.
func (a AvoidedNodes) Nodes() []string {
	out := make([]string, len(a))
	for i, x := range a {
		out[i] = x.Node
	}
	return out
}

// String is the annotation's value.
func (a AvoidedNodes) String() string {
	parts := make([]string, len(a))
	for i, x := range a {
		parts[i] = x.Node + "=" + string(x.Class)
	}
	return strings.Join(parts, ",")
}

// Charged is the value of AnnotationDisruptionsCharged: per class (the class whose budget
// paid, so DisruptionDefault for the classes it covers), the ids of the failures charged.
type Charged map[conditions.DisruptionClass][]string

// ChargedID is the id of a failed pod in Charged: its UID's first ChargedIDLength
// characters.
func ChargedID(uid string) string {
	if len(uid) > ChargedIDLength {
		return uid[:ChargedIDLength]
	}
	return uid
}

// ParseCharged reads "class=id+id,...". As ParseAvoidedNodes, the parts that parse come
// with the error.
func ParseCharged(v string) (Charged, error) {
	out := Charged{}
	var errs []error
	if strings.TrimSpace(v) == "" {
		return out, nil
	}
	for part := range strings.SplitSeq(v, ",") {
		key, ids, ok := strings.Cut(strings.TrimSpace(part), "=")
		class := conditions.DisruptionClass(key)
		if !ok || !class.Valid() || ids == "" {
			errs = append(errs, fmt.Errorf("%q is not class=id+id", part))
			continue
		}
		for id := range strings.SplitSeq(ids, "+") {
			out.Add(class, id)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return out, fmt.Errorf("%s %q: %w", AnnotationDisruptionsCharged, v, err)
	}
	return out, nil
}

// Add charges the failure id to class (once).
func (c Charged) Add(class conditions.DisruptionClass, id string) {
	if id == "" || slices.Contains(c[class], id) {
		return
	}
	c[class] = append(c[class], id)
}

// Has reports whether id is charged to any class.
func (c Charged) Has(id string) bool {
	for _, ids := range c {
		if slices.Contains(ids, id) {
			return true
		}
	}
	return false
}

// Merge charges everything o charges.
func (c Charged) Merge(o Charged) {
	for class, ids := range o {
		for _, id := range ids {
			c.Add(class, id)
		}
	}
}

// String is the annotation's value, classes in conditions.DisruptionClasses order, ids
// sorted; "" when nothing is charged.
func (c Charged) String() string {
	var parts []string
	for _, class := range conditions.DisruptionClasses {
		if ids := c[class]; len(ids) > 0 {
			s := slices.Clone(ids)
			slices.Sort(s)
			parts = append(parts, string(class)+"="+strings.Join(s, "+"))
		}
	}
	return strings.Join(parts, ",")
}

// BudgetVerdict is the value of AnnotationBudgetVerdict.
type BudgetVerdict struct {
	// Charged is true when the budget let the failure be ignored, false when it was spent
	// and the failure counted.
	Charged bool
	// Class is the class whose budget decided.
	Class conditions.DisruptionClass
}

func (v BudgetVerdict) String() string {
	if v.Charged {
		return "charged " + string(v.Class)
	}
	return "spent " + string(v.Class)
}

// ParseBudgetVerdict reads the annotation's value.
func ParseBudgetVerdict(s string) (BudgetVerdict, error) {
	word, class, _ := strings.Cut(strings.TrimSpace(s), " ")
	v := BudgetVerdict{Class: conditions.DisruptionClass(class)}
	switch {
	case !v.Class.Valid():
	case word == "charged":
		v.Charged = true
		return v, nil
	case word == "spent":
		return v, nil
	}
	return BudgetVerdict{}, fmt.Errorf("%s %q: want \"charged CLASS\" or \"spent CLASS\"", AnnotationBudgetVerdict, s)
}
