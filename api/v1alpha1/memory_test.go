package v1alpha1

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func TestParseMemoryRetry(t *testing.T) {
	for _, tc := range []struct {
		in, want, wantErr string
	}{
		{in: "factor=2,max=128Mi", want: "factor=2,max=128Mi"},
		{in: " max=4Gi , factor=1.5 ", want: "factor=1.5,max=4Gi"},
		{in: "factor=1.1,max=1G", want: "factor=1.1,max=1G"},
		{in: "factor=2", wantErr: "both factor and max are required"},
		{in: "max=1Gi", wantErr: "both factor and max are required"},
		{in: "factor=1.05,max=1Gi", wantErr: "factor \"1.05\": want a number from 1.1 to 10"},
		{in: "factor=11,max=1Gi", wantErr: "from 1.1 to 10"},
		{in: "factor=NaN,max=1Gi", wantErr: "from 1.1 to 10"},
		{in: "factor=2,max=lots", wantErr: "max \"lots\": want a positive memory quantity"},
		{in: "factor=2,max=0", wantErr: "positive memory quantity"},
		{in: "factor=2,max=1Gi,retries=3", wantErr: "unknown key \"retries\""},
		{in: "2x", wantErr: "\"2x\" is not key=value"},
	} {
		s, err := ParseMemoryRetry(tc.in)
		switch {
		case tc.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), AnnotationOOMMemoryRetry) {
				t.Errorf("ParseMemoryRetry(%q) = %v, %v; want an error naming the annotation and %q", tc.in, s, err, tc.wantErr)
			}
		case err != nil || s.String() != tc.want:
			t.Errorf("ParseMemoryRetry(%q) = %v, %v; want %s", tc.in, s, err, tc.want)
		}
	}
}

func TestMemoryRetryOf(t *testing.T) {
	if s, err := MemoryRetryOf(map[string]string{"other": "x"}); s != nil || err != nil {
		t.Errorf("without the annotation: %v, %v; want nil, nil", s, err)
	}
	if s, err := MemoryRetryOf(map[string]string{AnnotationOOMMemoryRetry: "2x"}); s != nil || err == nil {
		t.Errorf("invalid: %v, %v; want an error", s, err)
	}
	if s, err := MemoryRetryOf(map[string]string{AnnotationOOMMemoryRetry: "factor=2,max=1Gi"}); err != nil || s.String() != "factor=2,max=1Gi" {
		t.Errorf("valid: %v, %v", s, err)
	}
}

// TestMemory: the limits of a pod as the memory-given annotation and explain's ladder
// write them.
func TestMemory(t *testing.T) {
	p := &corev1.Pod{Spec: corev1.PodSpec{
		Containers: []corev1.Container{
			{Name: "side"},
			{Name: "main", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("24Mi")}}},
		},
		Resources: &corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("40Mi")}},
	}}
	m := MemoryOf(p)
	if got := m.String(); got != "main=24Mi,pod=40Mi" {
		t.Errorf("MemoryOf = %s", got)
	}
	g := []Growth{{Container: "main", From: resource.MustParse("24Mi"), To: resource.MustParse("48Mi")}, {From: resource.MustParse("40Mi"), To: resource.MustParse("48Mi")}}
	if got := g[0].String() + "; " + g[1].String(); got != "container main 24Mi -> 48Mi; the pod-level limit 40Mi -> 48Mi" {
		t.Errorf("Growth.String = %s", got)
	}
	if got := MemoryGiven(m.With(g), "as x-0-a had"); got != "main=48Mi,pod=48Mi: as x-0-a had" {
		t.Errorf("MemoryGiven = %q", got)
	}
	if got := m.String(); got != "main=24Mi,pod=40Mi" {
		t.Errorf("With changed m: %s", got)
	}
	a := Memory{"main": resource.MustParse("48Mi"), "": resource.MustParse("32Mi")}
	b := Memory{"main": resource.MustParse("24Mi"), "": resource.MustParse("64Mi"), "x": resource.MustParse("1Mi")}
	if got := a.Max(b).String(); got != "main=48Mi,x=1Mi,pod=64Mi" {
		t.Errorf("Max = %s", got)
	}
}
