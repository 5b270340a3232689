package classify

// The words of an OOM verdict: the stamp's message and its helpers.

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/coroner-dev/coroner/agent/cgroup"
)

// Message is the condition message for a LimitOOM or NodeOOM verdict, naming
// the container and the limit or cgroup that killed it; empty for the other
// kinds.
func (v Verdict) Message() string {
	switch v.Kind {
	case LimitOOM:
		if v.KillerLevel == cgroup.LevelPod {
			s := fmt.Sprintf("container %s was OOM-killed at its pod's memory limit", v.Container)
			if v.KillerLimit > 0 {
				s += " of " + quantity(v.KillerLimit)
			}
			if v.Killer != "" {
				s += " (memory cgroup " + v.Killer + ")"
			}
			return s
		}
		s := fmt.Sprintf("container %s was OOM-killed at its memory limit", v.Container)
		if limit := firstPositive(v.Limit, v.KillerLimit); limit > 0 {
			s += " of " + quantity(limit)
		}
		if v.Peak > 0 {
			s += " (peak " + quantity(v.Peak) + ")"
		}
		return s
	case NodeOOM:
		switch {
		case v.Global:
			return fmt.Sprintf("container %s was killed by the node's OOM killer: the node ran out of memory (global OOM, %s)",
				v.Container, orUnknown(v.Constraint))
		case v.Killer != "":
			return fmt.Sprintf("container %s was killed by the node's OOM killer: memory cgroup %s (%s) ran out of memory",
				v.Container, v.Killer, levelText(v.Killer, v.KillerLevel))
		default:
			return fmt.Sprintf("container %s was killed by the node's OOM killer: neither the container nor its pod reached its memory limit", v.Container)
		}
	}
	return ""
}

func levelText(path string, l cgroup.Level) string {
	switch l {
	case cgroup.LevelKubepods:
		return "all pods of the node"
	case cgroup.LevelQoS:
		return "the " + cgroup.ParsePath(path).QoS + " QoS class"
	case cgroup.LevelRoot:
		return "the whole node"
	}
	return "above the pod"
}

// quantity formats bytes as Kubernetes does ("20Mi").
func quantity(n int64) string {
	return resource.NewQuantity(n, resource.BinarySI).String()
}

func firstNonEmpty(ss ...string) string {
	for _, s := range ss {
		if s != "" {
			return s
		}
	}
	return ""
}

func firstPositive(ns ...int64) int64 {
	for _, n := range ns {
		if n > 0 {
			return n
		}
	}
	return 0
}

func orUnknown(s string) string {
	if s == "" {
		return "constraint not logged"
	}
	return s
}
