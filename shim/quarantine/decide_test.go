package quarantine

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/coroner-dev/coroner/conditions"
)

var t0 = time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)

const (
	device   = conditions.DisruptionDevice
	nodeOOM  = conditions.DisruptionNodeOOM
	nodeLost = conditions.DisruptionNodeLost
)

// deaths builds a history: one death per (class, age) pair, named p0, p1... on node.
func hist(node string, ds ...any) *History {
	h := &History{}
	for i := 0; i < len(ds); i += 2 {
		n := i / 2
		h.Add(Death{Pod: fmt.Sprintf("ns/%s-p%d", node, n), UID: types.UID(fmt.Sprintf("%s-%d", node, n)), Class: ds[i].(conditions.DisruptionClass), At: t0.Add(-ds[i+1].(time.Duration))})
	}
	return h
}

func node(name string) Node { return Node{Name: name} }

func tainted(name string, cause conditions.DisruptionClass, added time.Time) Node {
	t := Taint(cause, added)
	return Node{Name: name, Taint: &t}
}

func defaults(maxN string) Options {
	m, err := ParseMax(maxN)
	if err != nil {
		panic(err)
	}
	return Options{Deaths: 3, Window: 30 * time.Minute, For: time.Hour, Max: m}
}

// short is what a test compares of an Action.
type short struct {
	Kind    Kind
	Node    string
	Cause   conditions.DisruptionClass
	Deaths  int
	Holding []string
	Max     int
	Quiet   time.Time
}

func shorten(as []Action) []short {
	var out []short
	for _, a := range as {
		out = append(out, short{a.Kind, a.Node, a.Cause, len(a.Deaths), a.Holding, a.Max, a.QuietSince})
	}
	return out
}

func TestDecide(t *testing.T) {
	started := t0.Add(-24 * time.Hour)
	many := func(n int) []Node {
		var ns []Node
		for i := range n {
			ns = append(ns, node(fmt.Sprintf("n%02d", i)))
		}
		return ns
	}
	cases := []struct {
		name     string
		started  time.Time
		history  map[string]*History
		nodes    []Node
		opts     Options
		want     []short
		wantNext time.Time
	}{
		{
			name:    "two deaths are not enough",
			history: map[string]*History{"a": hist("a", device, time.Minute, device, 2*time.Minute)},
			nodes:   []Node{node("a"), node("b")},
			opts:    defaults("1"),
		},
		{
			name:    "three deaths within the window quarantine the node, the most frequent class is the cause",
			history: map[string]*History{"a": hist("a", device, 29*time.Minute, nodeOOM, 10*time.Minute, device, time.Minute)},
			nodes:   []Node{node("a"), node("b")},
			opts:    defaults("1"),
			want:    []short{{Kind: Quarantine, Node: "a", Cause: device, Deaths: 3}},
		},
		{
			name:    "a tie between classes goes to the class of the latest death",
			history: map[string]*History{"a": hist("a", device, 20*time.Minute, nodeOOM, 10*time.Minute, device, 9*time.Minute, nodeOOM, time.Minute)},
			nodes:   []Node{node("a")},
			opts:    defaults("1"),
			want:    []short{{Kind: Quarantine, Node: "a", Cause: nodeOOM, Deaths: 4}},
		},
		{
			name:    "window edge: a death exactly the window ago has aged out",
			history: map[string]*History{"a": hist("a", device, 30*time.Minute, device, 10*time.Minute, device, time.Minute)},
			nodes:   []Node{node("a")},
			opts:    defaults("1"),
		},
		{
			name:    "window edge: a death a second short of the window counts",
			history: map[string]*History{"a": hist("a", device, 30*time.Minute-time.Second, device, 10*time.Minute, device, time.Minute)},
			nodes:   []Node{node("a")},
			opts:    defaults("1"),
			want:    []short{{Kind: Quarantine, Node: "a", Cause: device, Deaths: 3}},
		},
		{
			name:    "a death in the future (clock skew beyond DeathTime's clamp) does not count",
			history: map[string]*History{"a": hist("a", device, 10*time.Minute, device, time.Minute, device, -time.Minute)},
			nodes:   []Node{node("a")},
			opts:    defaults("1"),
		},
		{
			name:     "max reached: the node is spared and told which nodes hold the quarantine",
			history:  map[string]*History{"b": hist("b", nodeOOM, 3*time.Minute, nodeOOM, 2*time.Minute, nodeOOM, time.Minute)},
			nodes:    []Node{tainted("a", device, t0.Add(-10*time.Minute)), node("b"), node("c")},
			opts:     defaults("1"),
			want:     []short{{Kind: Spare, Node: "b", Cause: nodeOOM, Deaths: 3, Holding: []string{"a"}, Max: 1}},
			wantNext: t0.Add(50 * time.Minute),
		},
		{
			name: "max reached and the node spared for its latest death already: no second Event",
			history: map[string]*History{"b": func() *History {
				h := hist("b", nodeOOM, 3*time.Minute, nodeOOM, 2*time.Minute, nodeOOM, time.Minute)
				h.SparedUntil = t0.Add(-time.Minute)
				return h
			}()},
			nodes:    []Node{tainted("a", device, t0.Add(-10*time.Minute)), node("b")},
			opts:     defaults("1"),
			wantNext: t0.Add(50 * time.Minute),
		},
		{
			name: "max reached, a new death after the last spare: spared again",
			history: map[string]*History{"b": func() *History {
				h := hist("b", nodeOOM, 3*time.Minute, nodeOOM, 2*time.Minute, nodeOOM, time.Minute, device, time.Duration(0))
				h.SparedUntil = t0.Add(-time.Minute)
				return h
			}()},
			nodes:    []Node{tainted("a", device, t0.Add(-10*time.Minute)), node("b")},
			opts:     defaults("1"),
			want:     []short{{Kind: Spare, Node: "b", Cause: nodeOOM, Deaths: 4, Holding: []string{"a"}, Max: 1}},
			wantNext: t0.Add(50 * time.Minute),
		},
		{
			name: "two candidates for one place: the one with more deaths goes first, the other is spared",
			history: map[string]*History{
				"a": hist("a", device, 5*time.Minute, device, 4*time.Minute, device, 3*time.Minute),
				"b": hist("b", nodeOOM, 20*time.Minute, nodeOOM, 2*time.Minute, nodeOOM, time.Minute, nodeOOM, time.Duration(0)),
			},
			nodes: []Node{node("a"), node("b")},
			opts:  defaults("1"),
			want: []short{
				{Kind: Quarantine, Node: "b", Cause: nodeOOM, Deaths: 4},
				{Kind: Spare, Node: "a", Cause: device, Deaths: 3, Holding: []string{"b"}, Max: 1},
			},
		},
		{
			name: "equal deaths: the node that reached the count first goes first",
			history: map[string]*History{
				"a": hist("a", device, 5*time.Minute, device, 4*time.Minute, device, time.Minute),
				"b": hist("b", nodeOOM, 6*time.Minute, nodeOOM, 5*time.Minute, nodeOOM, 2*time.Minute),
			},
			nodes: []Node{node("a"), node("b")},
			opts:  defaults("1"),
			want: []short{
				{Kind: Quarantine, Node: "b", Cause: nodeOOM, Deaths: 3},
				{Kind: Spare, Node: "a", Cause: device, Deaths: 3, Holding: []string{"b"}, Max: 1},
			},
		},
		{
			name: "10% of 30 nodes is 3: two tainted, one more is quarantined",
			history: map[string]*History{
				"n05": hist("n05", device, 3*time.Minute, device, 2*time.Minute, device, time.Minute),
			},
			nodes: append(many(28), tainted("t1", device, t0), tainted("t2", device, t0)),
			opts:  defaults("10%"),
			want:  []short{{Kind: Quarantine, Node: "n05", Cause: device, Deaths: 3}},
			// The taints added now are lifted an hour from now.
			wantNext: t0.Add(time.Hour),
		},
		{
			name:    "10% of 5 nodes rounds down to 0, and at least 1 is allowed",
			history: map[string]*History{"n01": hist("n01", device, 3*time.Minute, device, 2*time.Minute, device, time.Minute)},
			nodes:   many(5),
			opts:    defaults("10%"),
			want:    []short{{Kind: Quarantine, Node: "n01", Cause: device, Deaths: 3}},
		},
		{
			name:    "lift after --quarantine-for without a new death",
			history: map[string]*History{"a": hist("a", device, 70*time.Minute, device, 65*time.Minute, device, 60*time.Minute)},
			nodes:   []Node{tainted("a", device, t0.Add(-60*time.Minute))},
			opts:    defaults("1"),
			want:    []short{{Kind: Lift, Node: "a", Quiet: t0.Add(-60 * time.Minute)}},
		},
		{
			name:     "a new death on a quarantined node restarts the lift clock",
			history:  map[string]*History{"a": hist("a", device, 70*time.Minute, device, 65*time.Minute, device, 60*time.Minute, nodeLost, 10*time.Minute)},
			nodes:    []Node{tainted("a", device, t0.Add(-60*time.Minute))},
			opts:     defaults("1"),
			wantNext: t0.Add(50 * time.Minute),
		},
		{
			name:     "a second short of --quarantine-for: not yet, decide again then",
			history:  map[string]*History{"a": hist("a", device, 60*time.Minute-time.Second)},
			nodes:    []Node{tainted("a", device, t0.Add(-2*time.Hour))},
			opts:     defaults("1"),
			wantNext: t0.Add(time.Second),
		},
		{
			name:    "the lift frees a place for a candidate in the same pass",
			history: map[string]*History{"b": hist("b", nodeOOM, 3*time.Minute, nodeOOM, 2*time.Minute, nodeOOM, time.Minute)},
			nodes:   []Node{tainted("a", device, t0.Add(-2*time.Hour)), node("b")},
			opts:    defaults("1"),
			want: []short{
				{Kind: Lift, Node: "a", Quiet: t0.Add(-2 * time.Hour)},
				{Kind: Quarantine, Node: "b", Cause: nodeOOM, Deaths: 3},
			},
		},
		{
			name:     "restart: a node tainted before the start keeps its taint --quarantine-for from the start",
			started:  t0.Add(-10 * time.Minute),
			nodes:    []Node{tainted("a", device, t0.Add(-5*time.Hour))},
			opts:     defaults("1"),
			wantNext: t0.Add(50 * time.Minute),
		},
		{
			name:    "restart an hour ago: lifted now",
			started: t0.Add(-time.Hour),
			nodes:   []Node{tainted("a", device, t0.Add(-5*time.Hour))},
			opts:    defaults("1"),
			want:    []short{{Kind: Lift, Node: "a", Quiet: t0.Add(-time.Hour)}},
		},
		{
			name:     "a taint without timeAdded (put by hand) is held from the start",
			started:  t0.Add(-time.Minute),
			nodes:    []Node{{Name: "a", Taint: &corev1.Taint{Key: conditions.QuarantineTaintKey, Value: "x", Effect: corev1.TaintEffectNoSchedule}}},
			opts:     defaults("1"),
			wantNext: t0.Add(59 * time.Minute),
		},
		{
			name: "hand lift: the history was forgotten, the node is not tainted again by old deaths",
			// The controller drops the node's history when the taint goes (Lifted); the
			// deaths since count afresh.
			history: map[string]*History{"a": hist("a", device, time.Minute)},
			nodes:   []Node{node("a")},
			opts:    defaults("1"),
		},
		{
			name:    "a deleted node: its history is ignored and takes no place",
			history: map[string]*History{"gone": hist("gone", device, 3*time.Minute, device, 2*time.Minute, device, time.Minute), "b": hist("b", device, 3*time.Minute, device, 2*time.Minute, device, time.Minute)},
			nodes:   []Node{node("b")},
			opts:    defaults("1"),
			want:    []short{{Kind: Quarantine, Node: "b", Cause: device, Deaths: 3}},
		},
		{
			name:    "--quarantine-deaths=1",
			history: map[string]*History{"a": hist("a", nodeLost, time.Duration(0))},
			nodes:   []Node{node("a")},
			opts:    Options{Deaths: 1, Window: time.Minute, For: time.Minute, Max: Max{N: 1}},
			want:    []short{{Kind: Quarantine, Node: "a", Cause: nodeLost, Deaths: 1}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.started
			if s.IsZero() {
				s = started
			}
			got := Decide(t0, s, tc.history, tc.nodes, tc.opts)
			if diff := cmp.Diff(tc.want, shorten(got.Actions), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("actions (-want +got):\n%s", diff)
			}
			if !got.Next.Equal(tc.wantNext) {
				t.Errorf("next = %v, want %v", got.Next, tc.wantNext)
			}
		})
	}
}

func TestHistory(t *testing.T) {
	h := &History{}
	d := func(uid string, age time.Duration) Death {
		return Death{Pod: "ns/" + uid, UID: types.UID(uid), Class: device, At: t0.Add(-age)}
	}
	for _, x := range []Death{d("b", time.Minute), d("a", time.Hour), d("c", 0)} {
		if !h.Add(x) {
			t.Errorf("Add(%s) = false for a new UID", x.UID)
		}
	}
	if h.Add(d("b", 0)) {
		t.Error("Add of a UID it holds = true, want false (a pod counts once)")
	}
	var uids []types.UID
	for _, x := range h.Deaths {
		uids = append(uids, x.UID)
	}
	if want := []types.UID{"a", "b", "c"}; !slices.Equal(uids, want) {
		t.Errorf("deaths %v, want oldest first %v", uids, want)
	}
	h.Prune(t0, 30*time.Minute)
	if len(h.Deaths) != 2 || !h.Last.Equal(t0) {
		t.Errorf("after Prune: %d deaths, last %v; want 2 and %v", len(h.Deaths), h.Last, t0)
	}
}

func TestParseMax(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Max
		wantErr string
		nodes   int
		wantOf  int
	}{
		{in: "10%", want: Max{N: 10, Percent: true}, nodes: 100, wantOf: 10},
		{in: "10%", want: Max{N: 10, Percent: true}, nodes: 19, wantOf: 1},
		{in: "10%", want: Max{N: 10, Percent: true}, nodes: 0, wantOf: 1},
		{in: " 100% ", want: Max{N: 100, Percent: true}, nodes: 7, wantOf: 7},
		{in: "3", want: Max{N: 3}, nodes: 1, wantOf: 3},
		{in: "0", wantErr: "must be at least 1"},
		{in: "0%", wantErr: "between 1% and 100%"},
		{in: "101%", wantErr: "between 1% and 100%"},
		{in: "ten", wantErr: "want a number of nodes"},
		{in: "", wantErr: "want a number of nodes"},
		{in: "1.5%", wantErr: "want a number of nodes"},
	} {
		got, err := ParseMax(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseMax(%q) = %v, %v; want an error with %q", tc.in, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseMax(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
		if n := got.Of(tc.nodes); n != tc.wantOf {
			t.Errorf("%q.Of(%d) = %d, want %d", tc.in, tc.nodes, n, tc.wantOf)
		}
	}
}

func TestLifted(t *testing.T) {
	with := func(taints ...corev1.Taint) *corev1.Node {
		return &corev1.Node{Spec: corev1.NodeSpec{Taints: taints}}
	}
	q := Taint(device, t0)
	other := corev1.Taint{Key: "example.com/x", Effect: corev1.TaintEffectNoSchedule}
	for _, tc := range []struct {
		name     string
		old, cur *corev1.Node
		want     bool
	}{
		{"removed", with(other, q), with(other), true},
		{"added", with(other), with(other, q), false},
		{"cause changed", with(q), with(Taint(nodeOOM, t0)), false},
		{"neither", with(other), with(), false},
	} {
		if got := Lifted(tc.old, tc.cur); got != tc.want {
			t.Errorf("%s: Lifted = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestDeathOf(t *testing.T) {
	now := t0
	at := func(d time.Duration) metav1.Time { return metav1.NewTime(t0.Add(-d)) }
	nodeOOMPod := func() *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "u"},
			Spec:       corev1.PodSpec{NodeName: "a"},
			Status: corev1.PodStatus{
				Phase: corev1.PodFailed,
				Conditions: []corev1.PodCondition{{Type: conditions.DisruptionTarget, Status: corev1.ConditionTrue,
					Reason: conditions.ReasonNodeOOMKill, LastTransitionTime: at(2 * time.Minute)}},
				ContainerStatuses: []corev1.ContainerStatus{{Name: "main", State: corev1.ContainerState{
					Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "OOMKilled", FinishedAt: at(3 * time.Minute)}}}},
			},
		}
	}
	t.Run("a node OOM, at its latest time", func(t *testing.T) {
		node, d, ok := DeathOf(nodeOOMPod(), now)
		want := Death{Pod: "ns/p", UID: "u", Class: nodeOOM, At: t0.Add(-2 * time.Minute)}
		if !ok || node != "a" || d != want {
			t.Errorf("DeathOf = %q, %+v, %v; want a, %+v, true", node, d, ok, want)
		}
	})
	t.Run("times in the future are now", func(t *testing.T) {
		p := nodeOOMPod()
		p.Status.Conditions[0].LastTransitionTime = at(-time.Hour)
		if _, d, _ := DeathOf(p, now); !d.At.Equal(now) {
			t.Errorf("At = %v, want now %v", d.At, now)
		}
	})
	t.Run("no time in the status: now", func(t *testing.T) {
		p := nodeOOMPod()
		p.Status.Conditions[0].LastTransitionTime = metav1.Time{}
		p.Status.ContainerStatuses = nil
		if _, d, _ := DeathOf(p, now); !d.At.Equal(now) {
			t.Errorf("At = %v, want now %v", d.At, now)
		}
	})
	t.Run("a program's own exit blames no node", func(t *testing.T) {
		p := nodeOOMPod()
		p.Status.Conditions = nil
		p.Status.ContainerStatuses[0].State.Terminated = &corev1.ContainerStateTerminated{ExitCode: 1}
		if _, _, ok := DeathOf(p, now); ok {
			t.Error("DeathOf = ok for an exit code 1")
		}
	})
}

func TestMessages(t *testing.T) {
	o := defaults("1")
	var ds []Death
	for i := range 12 {
		ds = append(ds, Death{Pod: fmt.Sprintf("ns/p%d", i), Class: device, At: t0.Add(time.Duration(i) * time.Second)})
	}
	q := QuarantinedMessage(Action{Kind: Quarantine, Node: "a", Cause: device, Deaths: ds[:3]}, o)
	for _, want := range []string{"3 pod deaths blamed on this node within 30m0s", "ns/p0 (device, 2026-12-07T12:00:00Z)", "coroner.dev/quarantined=device:NoSchedule", "lifted after 1h0m0s", "coronerctl quarantine lift a"} {
		if !strings.Contains(q, want) {
			t.Errorf("NodeQuarantined message %q lacks %q", q, want)
		}
	}
	s := SparedMessage(Action{Kind: Spare, Node: "b", Cause: device, Deaths: ds, Holding: []string{"a"}, Max: 1}, o)
	for _, want := range []string{"Not quarantined though 12 pod deaths were blamed on node b", "2 earlier, ns/p2", "nodes quarantined already: 1 (a), the most --quarantine-max=1 allows"} {
		if !strings.Contains(s, want) {
			t.Errorf("QuarantineSpared message %q lacks %q", s, want)
		}
	}
	if strings.Contains(s, "ns/p1 ") {
		t.Errorf("QuarantineSpared message names more than %d deaths: %q", maxDeathsNamed, s)
	}
}
