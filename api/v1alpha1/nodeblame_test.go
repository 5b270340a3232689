package v1alpha1

import (
	"strings"
	"testing"

	"github.com/coroner-dev/coroner/conditions"
)

func TestParseDisruptionBudget(t *testing.T) {
	b, err := ParseDisruptionBudget(" device=3, node-oom=5,node-lost=5,default=20")
	if err != nil {
		t.Fatal(err)
	}
	if got := b.String(); got != "device=3,node-oom=5,node-lost=5,default=20" {
		t.Errorf("String = %q", got)
	}
	for _, c := range []struct {
		class conditions.DisruptionClass
		n     int
		of    conditions.DisruptionClass
	}{{conditions.DisruptionDevice, 3, conditions.DisruptionDevice}, {conditions.DisruptionPreemption, 20, conditions.DisruptionDefault}} {
		if n, of, ok := b.Limit(c.class); !ok || n != c.n || of != c.of {
			t.Errorf("Limit(%s) = %d, %s, %v; want %d, %s", c.class, n, of, ok, c.n, c.of)
		}
	}
	if _, _, ok := (DisruptionBudget{conditions.DisruptionDevice: 1}).Limit(conditions.DisruptionEviction); ok {
		t.Error("a class neither named nor defaulted is bounded")
	}
	for v, want := range map[string]string{
		"":                   "is empty",
		"gpu=3":              `unknown class "gpu"`,
		"device=-1":          "from 0 to 100",
		"device=101":         "from 0 to 100",
		"device=x":           "from 0 to 100",
		"device":             `"device" is not class=N`,
		"device=1,device=2":  "named twice",
		"device=1,gpu=2,cpu": `unknown class "gpu"`,
	} {
		if _, err := ParseDisruptionBudget(v); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseDisruptionBudget(%q) = %v, want an error with %q", v, err, want)
		}
	}
}

func TestAvoidance(t *testing.T) {
	if a, err := AvoidanceOf(nil, AvoidPreferred); a != AvoidPreferred || err != nil {
		t.Errorf("no annotation: %q, %v", a, err)
	}
	if a, err := AvoidanceOf(map[string]string{AnnotationAvoidFailedNodes: "required"}, AvoidNone); a != AvoidRequired || err != nil {
		t.Errorf("required: %q, %v", a, err)
	}
	if a, err := AvoidanceOf(map[string]string{AnnotationAvoidFailedNodes: "always"}, AvoidNone); a != AvoidNone || err == nil {
		t.Errorf("always: %q, %v; want none and an error", a, err)
	}
}

func TestAvoidedNodes(t *testing.T) {
	var a AvoidedNodes
	for i := range 10 {
		a = a.Add("n"+string(rune('0'+i)), conditions.DisruptionNodeOOM)
	}
	a = a.Add("n5", conditions.DisruptionDevice)
	if got, want := a.String(), "n2=node-oom,n3=node-oom,n4=node-oom,n6=node-oom,n7=node-oom,n8=node-oom,n9=node-oom,n5=device"; got != want {
		t.Errorf("a = %s, want %s (n5 moved to the end, the oldest two gone)", got, want)
	}
	if len(a) != MaxAvoidedNodes || a[len(a)-1] != (AvoidedNode{"n5", conditions.DisruptionDevice}) {
		t.Errorf("a = %s, want 8 nodes ending with n5=device", a)
	}
	back, err := ParseAvoidedNodes(a.String())
	if err != nil || back.String() != a.String() {
		t.Errorf("round trip: %s, %v", back, err)
	}
	part, err := ParseAvoidedNodes("n1=device,n2=exit,n3")
	if err == nil || part.String() != "n1=device" {
		t.Errorf("damaged: %s, %v; want n1=device and an error", part, err)
	}
}

func TestCharged(t *testing.T) {
	c, err := ParseCharged("device=bbbb2222+aaaa1111,default=cccc3333")
	if err != nil {
		t.Fatal(err)
	}
	c.Merge(Charged{conditions.DisruptionDevice: {"aaaa1111", "dddd4444"}})
	if got, want := c.String(), "device=aaaa1111+bbbb2222+dddd4444,default=cccc3333"; got != want {
		t.Errorf("String = %q, want %q", got, want)
	}
	if !c.Has("cccc3333") || c.Has("eeee5555") {
		t.Error("Has is wrong")
	}
	if got := ChargedID("0123456789abcdef"); got != "01234567" {
		t.Errorf("ChargedID = %q", got)
	}
	if _, err := ParseCharged("gpu=1,device="); err == nil {
		t.Error("no error for gpu= and device=")
	}
	for _, v := range []BudgetVerdict{{true, conditions.DisruptionDevice}, {false, conditions.DisruptionDefault}} {
		back, err := ParseBudgetVerdict(v.String())
		if err != nil || back != v {
			t.Errorf("verdict round trip %v: %v, %v", v, back, err)
		}
	}
	if _, err := ParseBudgetVerdict("charged gpu"); err == nil {
		t.Error("no error for charged gpu")
	}
}
