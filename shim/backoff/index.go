package backoff

import (
	"fmt"
	"math"
	"strconv"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
)

// IndexFailureCount returns the value of the pod's
// batch.kubernetes.io/job-index-failure-count annotation: how many counted
// failures its index had before the pod was created. A missing annotation is
// 0. A value that is not a decimal integer in [0, 2^31-1] is an error, and
// the count is then 0, the value the built-in controller falls back to.
// Numbers are read as strconv.Atoi reads them, so "+3" and "03" are 3, as
// upstream reads them.
func IndexFailureCount(pod *corev1.Pod) (int32, error) {
	return annotationCount(pod, batchv1.JobIndexFailureCountAnnotation)
}

// IndexIgnoredFailureCount is IndexFailureCount for the
// batch.kubernetes.io/job-index-ignored-failure-count annotation: the
// failures of the index that a pod failure policy rule with action Ignore
// matched.
func IndexIgnoredFailureCount(pod *corev1.Pod) (int32, error) {
	return annotationCount(pod, batchv1.JobIndexIgnoredFailureCountAnnotation)
}

func annotationCount(pod *corev1.Pod, key string) (int32, error) {
	v, ok := pod.Annotations[key]
	if !ok {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > math.MaxInt32 {
		return 0, fmt.Errorf("pod %s/%s: annotation %s=%q is not an integer from 0 to %d",
			pod.Namespace, pod.Name, key, v, math.MaxInt32)
	}
	return int32(n), nil
}

// IndexConsecutiveFailures returns the number of consecutive failures of the
// index whose latest failed pod is lastFailedPod: the failures recorded in
// its annotations plus its own. It is 0 when lastFailedPod is nil.
//
// Like the built-in controller (getRemainingTimePerIndex in v1.36, and its
// test "one prev failure counted and one ignored"), this adds the ignored
// failures too, so failures that a pod failure policy Ignores still lengthen
// the index's backoff even though they do not count towards
// backoffLimitPerIndex. The KEP's text says the delay uses only
// job-index-failure-count; the shim follows the code. It also matches the
// global backoff, where upstream feeds every failed pod, Ignore-d or not,
// into the backoff record. A malformed annotation counts as 0.
func IndexConsecutiveFailures(lastFailedPod *corev1.Pod) int {
	if lastFailedPod == nil {
		return 0
	}
	counted, _ := IndexFailureCount(lastFailedPod)
	ignored, _ := IndexIgnoredFailureCount(lastFailedPod)
	// int64: the sum of two int32 values may not fit a 32-bit int.
	return int(min(int64(counted)+int64(ignored)+1, math.MaxInt))
}

// IndexRemaining returns how much longer, at now, an index waits before its
// next pod may be created (S5, KEP-3850 "Expotential backoff delay per
// index"), given the latest failed pod of the index, or nil when it has none:
// p's delay for IndexConsecutiveFailures(lastFailedPod), counted from
// FinishTime(lastFailedPod). An index whose latest pod was lost with its node
// (Delays is false) does not wait: see Delays.
func IndexRemaining(now time.Time, p Policy, lastFailedPod *corev1.Pod) time.Duration {
	if lastFailedPod == nil || !Delays(lastFailedPod) {
		return 0
	}
	return p.Remaining(now, FinishTime(lastFailedPod), IndexConsecutiveFailures(lastFailedPod))
}

// ReadyIndexes splits the pending indexes (those the controller wants to
// create pods for) by their per-index backoff. ready holds, in the order
// given, the indexes that may get a pod now: those with no entry in
// lastFailed (index to latest failed pod) and those whose backoff is over.
// wait is the shortest IndexRemaining among the others, the delay after which
// one of them may be created, or 0 when no index waits. Apply RequeueDelay
// before re-queueing with it.
//
// Upstream re-queues only when no index is ready, since creating pods causes
// another sync anyway; returning wait in both cases lets the controller
// choose.
func ReadyIndexes(now time.Time, p Policy, pending []int, lastFailed map[int]*corev1.Pod) (ready []int, wait time.Duration) {
	for _, ix := range pending {
		rem := IndexRemaining(now, p, lastFailed[ix])
		switch {
		case rem == 0:
			ready = append(ready, ix)
		case wait == 0 || rem < wait:
			wait = rem
		}
	}
	return ready, wait
}
