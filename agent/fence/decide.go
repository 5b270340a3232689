package fence

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/cri"
)

// Timings derived from --fence-after.
const (
	// MinRenewPeriod and MaxRenewPeriod bound RenewPeriod.
	MinRenewPeriod = time.Second
	MaxRenewPeriod = 10 * time.Second
	// MaxRequestTimeout bounds each renewal's requests (RequestTimeout).
	MaxRequestTimeout = 5 * time.Second
	// FencedPeriod is how often, while fenced, the agent stops the opted-in containers
	// that run (again) and tries to renew its Lease. The fence deadline is checked this
	// often too.
	FencedPeriod = time.Second
	// DefaultMaxStopTimeout caps the grace a fenced container gets between SIGTERM and
	// SIGKILL (StopTimeout): it bounds the time from fencing to stopped containers, which
	// the shim's margin must cover.
	DefaultMaxStopTimeout = 10 * time.Second
)

// RenewPeriod is how often the agent renews its Lease: a quarter of fenceAfter, so that
// three renewals may fail before it fences, between MinRenewPeriod and MaxRenewPeriod.
func RenewPeriod(fenceAfter time.Duration) time.Duration {
	return min(max(fenceAfter/4, MinRenewPeriod), MaxRenewPeriod)
}

// RequestTimeout bounds one renewal (its Get, Create or Update), so that a partition,
// where requests hang rather than fail, is noticed within a renew period:
// min(renewPeriod, MaxRequestTimeout).
func RequestTimeout(renewPeriod time.Duration) time.Duration {
	return min(renewPeriod, MaxRequestTimeout)
}

// ShouldFence reports whether an agent whose last successful Lease renewal (or, before
// the first, its start) was at lastRenewal must be fenced at now: it has gone more than
// fenceAfter without one. This is the agent's side of conditions.NodeFenced, which
// concludes the same from the Lease's renewTime, plus a margin.
//
// Counting the start as a renewal is what an agent that (re)starts cut off from the API
// server can do: it cannot read the Lease, and the previous agent may have renewed it
// just before the start, in which case the shim does not take the node for fenced before
// start + fenceAfter + its margin; fencing earlier could stop pods for a blip at start.
// The Lease's real renewTime is older than the start, so the shim's deadline is earlier
// than that: the agent fences late by up to the time from that renewTime to its start
// (the package comment says more).
func ShouldFence(lastRenewal, now time.Time, fenceAfter time.Duration) bool {
	return now.Sub(lastRenewal) > fenceAfter
}

// Where a Target's opt-in was read (Target.OptedInBy).
const (
	// OptedInByPod: the agent's cached Pod object.
	OptedInByPod = "pod"
	// OptedInBySandbox: the annotations of the container's pod sandbox, the kubelet's copy
	// of the pod's annotations (the pod cache does not know the pod).
	OptedInBySandbox = "sandbox"
)

// Target is a container to stop, and its pod.
type Target struct {
	Container cri.Container
	Pod       types.NamespacedName
	// Timeout is the grace between SIGTERM and SIGKILL (StopTimeout).
	Timeout time.Duration
	// OptedInBy says where the pod's opt-in was read: OptedInByPod or OptedInBySandbox.
	OptedInBy string
}

// ToStop returns the containers a fenced agent stops: the running containers of its
// node's pods that are opted in to forceful deletion (conditions.OptedInToForcefulDeletion),
// as known by either of two sources:
//
//   - pods, the agent's cached pods (not modified): a pod bound to node, opted in and not
//     terminal (Succeeded or Failed); its containers match by the kubelet's label
//     io.kubernetes.pod.uid, and get StopTimeout(pod, maxTimeout).
//   - sandboxes, the runtime's pod sandboxes (not modified), which carry the kubelet's copy
//     of their pod's annotations: for a pod the cache does not know (an agent that
//     started cut off from the API server has an empty cache), a container whose own
//     sandbox (Container.SandboxID, for the same pod UID) opts in. Such a pod has no
//     phase: its running containers are stopped, with maxTimeout (its grace period is
//     not known).
//
// A pod the cache knows is decided by the cache alone, whatever its sandbox says: the
// Pod object is the later word (an opt-in withdrawn after the sandbox was made), and a
// pod it knows as terminal is left alone. Containers of any other pod (not opted in,
// unknown to both, of another node) are never returned, nor containers that do not run.
// The result is sorted by pod, then container name and id.
func ToStop(node string, pods []*corev1.Pod, sandboxes []cri.Sandbox, containers []cri.Container, maxTimeout time.Duration) []Target {
	known := make(map[types.UID]bool, len(pods))
	optedIn := make(map[types.UID]*corev1.Pod, len(pods))
	for _, p := range pods {
		if p == nil {
			continue
		}
		known[p.UID] = true
		if p.Spec.NodeName != node || !conditions.OptedInToForcefulDeletion(p.Annotations) {
			continue
		}
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		optedIn[p.UID] = p
	}
	optedInSandboxes := make(map[string]cri.Sandbox, len(sandboxes))
	for _, s := range sandboxes {
		if s.ID == "" || s.PodUID == "" || known[types.UID(s.PodUID)] || !conditions.OptedInToForcefulDeletion(s.Annotations) {
			continue
		}
		optedInSandboxes[s.ID] = s
	}
	var out []Target
	for _, c := range containers {
		if !c.Running || c.ID == "" {
			continue
		}
		if p, ok := optedIn[types.UID(c.PodUID)]; ok {
			out = append(out, Target{
				Container: c,
				Pod:       types.NamespacedName{Namespace: p.Namespace, Name: p.Name},
				Timeout:   StopTimeout(p, maxTimeout),
				OptedInBy: OptedInByPod,
			})
			continue
		}
		if s, ok := optedInSandboxes[c.SandboxID]; ok && s.PodUID == c.PodUID {
			out = append(out, Target{
				Container: c,
				Pod:       types.NamespacedName{Namespace: s.PodNamespace, Name: s.PodName},
				Timeout:   maxTimeout,
				OptedInBy: OptedInBySandbox,
			})
		}
	}
	slices.SortFunc(out, func(a, b Target) int {
		return cmp.Or(
			cmp.Compare(a.Pod.String(), b.Pod.String()),
			cmp.Compare(a.Container.Name, b.Container.Name),
			cmp.Compare(a.Container.ID, b.Container.ID))
	})
	return out
}

// StopTimeout is the grace a container of pod gets between SIGTERM and SIGKILL: the pod's
// terminationGracePeriodSeconds (30s when unset, as the API server defaults it), at most
// maxTimeout.
func StopTimeout(pod *corev1.Pod, maxTimeout time.Duration) time.Duration {
	grace := 30 * time.Second
	if s := pod.Spec.TerminationGracePeriodSeconds; s != nil {
		grace = time.Duration(max(*s, 0)) * time.Second
	}
	return min(grace, maxTimeout)
}

// maxPodsNamed is how many pods the Fenced Event's message names.
const maxPodsNamed = 10

// Message is the Fenced Event's message: how long the agent went without a renewal (from
// its last renewal to the one that succeeded again; with fromStart, there was none since
// the agent started, and the time counts from its start), its --fence-after, and what it
// stopped (container id -> pod), for example "Lost the API server for 1m12s (over
// --fence-after 45s): stopped 3 containers of 2 opted-in pods: ns/a, ns/b".
func Message(outage, fenceAfter time.Duration, fromStart bool, stopped map[string]types.NamespacedName) string {
	head := fmt.Sprintf("Lost the API server for %v (over --fence-after %v)", outage.Round(time.Second), fenceAfter)
	if fromStart {
		head = fmt.Sprintf("Could not reach the API server for %v since the agent started (over --fence-after %v)", outage.Round(time.Second), fenceAfter)
	}
	return head + stoppedMessage(stopped)
}

// NodeLeaseMessage is Message for an agent that fences on its kubelet's node Lease:
// outage is from the last renewal of that Lease seen (or the agent's start, with
// fromStart) to the first seen again, for example "The kubelet's node Lease went
// unrenewed for 1m12s (over --fence-after 45s): stopped 3 containers of 2 opted-in pods:
// ns/a, ns/b".
func NodeLeaseMessage(outage, fenceAfter time.Duration, fromStart bool, stopped map[string]types.NamespacedName) string {
	head := fmt.Sprintf("The kubelet's node Lease went unrenewed for %v (over --fence-after %v)", outage.Round(time.Second), fenceAfter)
	if fromStart {
		head = fmt.Sprintf("No renewal of the kubelet's node Lease seen for %v since the agent started (over --fence-after %v)", outage.Round(time.Second), fenceAfter)
	}
	return head + stoppedMessage(stopped)
}

// stoppedMessage is the tail of the Fenced Event's message: what the fence stopped.
func stoppedMessage(stopped map[string]types.NamespacedName) string {
	if len(stopped) == 0 {
		return ": no container of an opted-in pod was running"
	}
	seen := map[types.NamespacedName]bool{}
	var pods []string
	for _, p := range stopped {
		if !seen[p] {
			seen[p] = true
			pods = append(pods, p.String())
		}
	}
	slices.Sort(pods)
	named := strings.Join(pods[:min(len(pods), maxPodsNamed)], ", ")
	if len(pods) > maxPodsNamed {
		named += fmt.Sprintf(" and %d more", len(pods)-maxPodsNamed)
	}
	return fmt.Sprintf(": stopped %s of %s: %s",
		plural(len(stopped), "container", "containers"), plural(len(pods), "opted-in pod", "opted-in pods"), named)
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}
