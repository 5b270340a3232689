// Package conditions is coroner's shared vocabulary and its pod writer.
//
// # Vocabulary
//
// Every pod condition type, condition reason, annotation, label, finalizer,
// Job condition reason and Event reason that coroner reads or writes is a
// named constant in this package (constants.go), so that the shim, the agent,
// coronerctl and the tests spell them one way. Where Kubernetes or Kueue
// already owns a name, the constant has the upstream value (and refers to the
// k8s.io/api constant where one exists); coroner's own names live under the
// coroner.dev prefix.
//
// The pod conditions coroner writes:
//
//   - DisruptionTarget (the upstream type, KEP-3329). Upstream components set
//     it with reasons PreemptionByScheduler, DeletionByTaintManager,
//     EvictionByEvictionAPI, DeletionByPodGC and TerminationByKubelet. The
//     agent adds TerminationByKubelet where the kubelet does not (A3) and
//     coroner's own reason NodeOOMKill for a container killed by the node's
//     OOM killer (A2), so that a podFailurePolicy rule
//     "Ignore on DisruptionTarget" covers node OOM kills too. The shim sets
//     DeletionByPodGC on orphans (Z3) and clears stale ones (Z4).
//   - coroner.dev/OOMKilled, reason MemoryLimitExceeded: a container was
//     killed because the pod went over its own memory limit (A2), which is
//     most likely a bug in the workload, not an infrastructure failure.
//   - coroner.dev/ForcefullyTerminated, reasons NodeUnreachable and
//     NodeFenced: the shim moved a zombie pod to phase Failed without the
//     kubelet's word (Z1, Z2); the analogue of Kueue's KueueFailureRecovery.
//
// # Write discipline
//
// The writers (EnsurePodCondition, EnsurePodPhase, EnsurePodAnnotation) talk
// to the API server through the narrow PodPatcher interface and follow four
// rules:
//
//  1. No write when nothing changes. The change is computed in memory first
//     (Set); when the pod already says what the caller wants, no API call is
//     made at all.
//  2. Small patches with a precondition. A status write is a strategic merge
//     patch to the pods/status subresource carrying only the conditions that
//     change (pod conditions merge by type, so conditions owned by the
//     kubelet, the scheduler or other controllers are never clobbered) and,
//     when setting it, status.phase. Every patch carries metadata.uid and
//     metadata.resourceVersion of the pod it was computed from; the API
//     server treats a resourceVersion inside a merge or strategic merge patch
//     as an optimistic-concurrency precondition and answers 409 Conflict when
//     the pod has changed since.
//  3. Retry on conflict, recomputing. On 409 the writer reads the pod again
//     with a GET and recomputes from the fresh copy (which may now need no
//     write at all), a bounded number of times (retry.DefaultRetry).
//  4. The kubelet's word wins. EnsurePodPhase never overwrites a phase that is
//     already Failed or Succeeded; thanks to the precondition this holds even
//     when the kubelet writes between coroner's read and coroner's write.
//
// A pod that no longer exists (404, or replaced by a pod with the same name
// and a different UID) is reported as an error wrapping ErrPodGone, which
// callers test with errors.Is and usually log and forget.
//
// The writers never modify the pod they are given; it may come from an
// informer cache.
package conditions
