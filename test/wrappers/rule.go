package wrappers

import (
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
)

// RuleWrapper builds one podFailurePolicy rule.
type RuleWrapper struct {
	batchv1.PodFailurePolicyRule
}

// OnExitCodes returns a rule that takes action when a container's exit code
// satisfies op over codes.
func OnExitCodes(action batchv1.PodFailurePolicyAction, op batchv1.PodFailurePolicyOnExitCodesOperator, codes ...int32) *RuleWrapper {
	return &RuleWrapper{batchv1.PodFailurePolicyRule{
		Action: action,
		OnExitCodes: &batchv1.PodFailurePolicyOnExitCodesRequirement{
			Operator: op,
			Values:   codes,
		},
	}}
}

// OnPodCondition returns a rule that takes action when the pod has a
// condition of type t. The pattern's status is left empty, as in a manifest
// that omits it; the API server defaults it to True. Use Status to set it.
func OnPodCondition(action batchv1.PodFailurePolicyAction, t corev1.PodConditionType) *RuleWrapper {
	return &RuleWrapper{batchv1.PodFailurePolicyRule{
		Action:          action,
		OnPodConditions: []batchv1.PodFailurePolicyOnPodConditionsPattern{{Type: t}},
	}}
}

// InContainer restricts an onExitCodes rule to the container name. It panics
// on a rule without onExitCodes.
func (w *RuleWrapper) InContainer(name string) *RuleWrapper {
	if w.OnExitCodes == nil {
		panic("wrappers: InContainer on a rule without onExitCodes")
	}
	w.OnExitCodes.ContainerName = &name
	return w
}

// Status sets the status of every pattern of an onPodConditions rule. It
// panics on a rule without onPodConditions.
func (w *RuleWrapper) Status(s corev1.ConditionStatus) *RuleWrapper {
	if w.OnPodConditions == nil {
		panic("wrappers: Status on a rule without onPodConditions")
	}
	for i := range w.OnPodConditions {
		w.OnPodConditions[i].Status = s
	}
	return w
}

// Obj returns the built rule.
func (w *RuleWrapper) Obj() batchv1.PodFailurePolicyRule {
	return w.PodFailurePolicyRule
}

// Policy returns a podFailurePolicy with the given rules, in order.
func Policy(rules ...*RuleWrapper) *batchv1.PodFailurePolicy {
	p := &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{}}
	for _, r := range rules {
		p.Rules = append(p.Rules, r.Obj())
	}
	return p
}
