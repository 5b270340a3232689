package nodeblame

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/coroner-dev/coroner/api/v1alpha1"
)

func TestAvoid(t *testing.T) {
	notIn := corev1.NodeSelectorRequirement{Key: "metadata.name", Operator: corev1.NodeSelectorOpNotIn, Values: []string{"n1", "n2"}}
	gpu := corev1.NodeSelectorRequirement{Key: "gpu", Operator: corev1.NodeSelectorOpExists}
	// Kueue's flavor assignment as it reaches a pod: a nodeSelector, and for a
	// ResourceFlavor with nodeAffinity-like terms, its own required term.
	zone := corev1.NodeSelectorRequirement{Key: "topology.kubernetes.io/zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}
	required := func(terms ...corev1.NodeSelectorTerm) *corev1.Affinity {
		return &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: terms}}}
	}
	podAnti := &corev1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{TopologyKey: "kubernetes.io/hostname"}}}
	cases := []struct {
		name string
		mode v1alpha1.Avoidance
		in   *corev1.Affinity
		want *corev1.Affinity
	}{
		{"required, no affinity", v1alpha1.AvoidRequired, nil, required(corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{notIn}})},
		{"required, every term narrowed, the template's kept", v1alpha1.AvoidRequired,
			required(corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{gpu}}, corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{zone}}),
			required(corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{gpu}, MatchFields: []corev1.NodeSelectorRequirement{notIn}},
				corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{zone}, MatchFields: []corev1.NodeSelectorRequirement{notIn}})},
		{"required, pod anti-affinity untouched", v1alpha1.AvoidRequired, &corev1.Affinity{PodAntiAffinity: podAnti},
			&corev1.Affinity{PodAntiAffinity: podAnti, NodeAffinity: required(corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{notIn}}).NodeAffinity}},
		{"preferred, beside the template's preferences", v1alpha1.AvoidPreferred,
			&corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{Weight: 10, Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{zone}}}}}},
			&corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{
				{Weight: 10, Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{zone}}},
				{Weight: 100, Preference: corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{notIn}}},
			}}}},
		{"preferred leaves required terms alone", v1alpha1.AvoidPreferred, required(corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{gpu}}),
			&corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
				RequiredDuringSchedulingIgnoredDuringExecution:  &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{gpu}}}},
				PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{Weight: 100, Preference: corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{notIn}}}},
			}}},
		{"none", v1alpha1.AvoidNone, nil, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := &corev1.Pod{Spec: corev1.PodSpec{Affinity: c.in.DeepCopy(), NodeSelector: map[string]string{"kueue": "flavor"}}}
			Avoid(p, []string{"n1", "n2"}, c.mode)
			if d := cmp.Diff(c.want, p.Spec.Affinity); d != "" {
				t.Errorf("affinity (-want +got):\n%s", d)
			}
			if p.Spec.NodeSelector["kueue"] != "flavor" || len(p.Spec.NodeSelector) != 1 {
				t.Errorf("nodeSelector changed: %v", p.Spec.NodeSelector)
			}
		})
	}
	p := &corev1.Pod{}
	Avoid(p, nil, v1alpha1.AvoidRequired)
	if p.Spec.Affinity != nil {
		t.Error("no nodes: affinity set")
	}
}
