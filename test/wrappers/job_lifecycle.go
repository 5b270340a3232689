package wrappers

import (
	batchv1 "k8s.io/api/batch/v1"
	"k8s.io/utils/ptr"
)

// Suspend sets spec.suspend.
func (w *JobWrapper) Suspend(b bool) *JobWrapper {
	w.Spec.Suspend = &b
	return w
}

// ActiveDeadlineSeconds sets spec.activeDeadlineSeconds.
func (w *JobWrapper) ActiveDeadlineSeconds(s int64) *JobWrapper {
	w.Spec.ActiveDeadlineSeconds = &s
	return w
}

// PodReplacementPolicy sets spec.podReplacementPolicy (KEP-3939).
func (w *JobWrapper) PodReplacementPolicy(p batchv1.PodReplacementPolicy) *JobWrapper {
	w.Spec.PodReplacementPolicy = &p
	return w
}

// SuccessPolicy sets spec.successPolicy to the given rules, in order. Build
// the rules with SucceededIndexes and SucceededCount.
func (w *JobWrapper) SuccessPolicy(rules ...batchv1.SuccessPolicyRule) *JobWrapper {
	w.Spec.SuccessPolicy = &batchv1.SuccessPolicy{Rules: rules}
	return w
}

// SucceededIndexes returns a successPolicy rule met once every index in the
// range list (for example "0,2-3") has succeeded.
func SucceededIndexes(indexes string) batchv1.SuccessPolicyRule {
	return batchv1.SuccessPolicyRule{SucceededIndexes: ptr.To(indexes)}
}

// SucceededCount returns a successPolicy rule met once n indexes have
// succeeded.
func SucceededCount(n int32) batchv1.SuccessPolicyRule {
	return batchv1.SuccessPolicyRule{SucceededCount: ptr.To(n)}
}

// TerminationGracePeriodSeconds sets the pod template's
// terminationGracePeriodSeconds.
func (w *JobWrapper) TerminationGracePeriodSeconds(s int64) *JobWrapper {
	w.Spec.Template.Spec.TerminationGracePeriodSeconds = &s
	return w
}
