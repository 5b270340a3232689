// Package agent is coroner's node side (requirements A1-A8): it watches the container
// runtime for exits and OOM kills on its own node, and its node's pods, and stamps the
// pods with why they died before they are deleted. With --fencing (A6, off by default) it
// also renews a Lease of its node and, after --fence-after without a renewal, stops the
// containers of its node's opted-in pods until it reaches the API server again
// (agent/fence).
//
// # The pieces
//
//   - Options (flags) and Run, what cmd/coroner-agent calls: it checks the API server
//     (ServerCheckTimeout; unreachable at start is an error, except with --fencing, see
//     Fencing below), starts the runtime watcher
//     (cri.Watcher), the kernel log reader (agent/kmsg) and /metrics, /healthz and /readyz, and
//     runs an Agent.
//   - Agent, usable in tests with an injected cri.Source (cri/crifake), clientset, pod
//     patcher, kernel feed, cgroup root and clock (see Config):
//   - a pod informer limited to spec.nodeName=<node> (A7), indexed by UID; a pod of
//     another node is never looked up, even if one reached the cache;
//   - the runtime's events: Started (the container's and its pod's cgroup counters and
//     PIDs are read), OOM (containerd's /tasks/oom: counters read again) and Exited;
//   - the kernel's OOM kills, kept for 10 minutes, matched to containers by cgroup
//     and PID by classify.ClassifyOOM; and the NVIDIA driver's Xid reports from the same
//     log, kept as faults of the GPU whose UUID the driver's GPU list gives (gpus.go);
//   - the device health the kubelet reports in device-holding pods' statuses
//     (allocatedResourcesStatus), kept per pod, container and device with when each
//     health was first seen (devices.go);
//   - a mirror pod index: a static pod's containers name their pod by the kubelet's
//     config hash (the CRI label io.kubernetes.pod.uid, the cgroup's pod<hash>), which
//     the mirror pod carries in kubernetes.io/config.mirror; the mirror pod is the one
//     stamped;
//   - the ledger (agent/ledger): what the agent knows of each container, the runtime's
//     states of its pods' containers, and the evidence of other sources (the kernel's
//     kills, with what they taught: the host prefix, the PID facts) with their
//     time-to-live, under a lock of its own and changed only by its named transitions,
//     each one locking once. It is plain bookkeeping, fed plain values (events, cgroup
//     readings, kills, the time), and knows nothing of the Agent. The agent's own lock
//     guards only the pods known gone and when a pod's status.reason was first seen; the
//     two are never held together;
//   - a work queue (client-go's delaying queue, on the agent's clock) of exits, OOM
//     kills and pod decisions, handled by Workers goroutines: each exit or OOM item is
//     looked up in the ledger, its pod found, a snapshot of its container taken and
//     classified with no lock held, and the item claimed by one transition before its
//     stamps are requested;
//   - the stamper (agent/stamper), which batches, deduplicates and writes the stamps
//     and records the metrics (agent/metrics);
//   - with Config.Fencing, the fencer (agent/fence): the Lease, the fence, the Fenced
//     Event on the Node.
//
// # An exit
//
// For each Exited event the agent finds the pod by UID in its cache. A pod not in the
// cache yet is waited for, with short retries, for PodCacheWait (2s); then the agent asks
// the API server once: a pod that is gone (404, or re-created with another UID) or bound
// to another node has its events dropped and counted
// (coroner_agent_dropped_events_total); a pod that exists on this node is waited for up
// to PodWaitMax. A pod deleted while its events wait (the informer's delete) drops them
// at once. Then the agent gathers the OOM facts (the runtime's reason, containerd's OOM
// events, the container cgroup's counters at its last OOM event or exit, the pod
// cgroup's counters since the container started, peak usage and limit, the kernel's
// kills), classifies them (classify.ClassifyOOM) and computes the stamps
// (classify.StampsForExit: coroner.dev/OOMKilled, DisruptionTarget NodeOOMKill, the exit
// history of restarting pods). When the facts show an OOM kill but the kernel's report
// of it has not been read yet, the classification waits KernelWait (250ms) once for it.
// Then the pod-level decision runs (below), since the exit may have stopped the pod's
// last container.
//
// For a pod holding devices, a non-zero exit also gets a device verdict
// (classify.DecideDevice, devices.go): DisruptionTarget and coroner.dev/DeviceFailed,
// reason DeviceFailure, in one write when a device it held was Unhealthy or had a hardware
// fault, else, once the --device-window after the death is over, DeviceFailed=False
// (NoDeviceFailure); judged again as soon as new evidence for the container comes.
//
// An OOM event of a container that keeps running (the kernel killed a child, not PID 1)
// is classified the same way and stamps coroner.dev/OOMKilled when the verdict is the
// pod's own limit; a node OOM is stamped at the exit, if the container exits, since a
// DisruptionTarget on a pod that goes on running would claim a disruption that is not
// happening.
//
// # Restarts and gaps
//
// Nothing that died while the agent was not looking (stopped, OOM-killed itself,
// rolled to a new image; or its runtime watch cut) is missed, and nothing is stamped
// twice:
//
//   - the runtime's exits: the watcher's first relist (and the relist after every
//     reconnect) emits every exited container the runtime still has, with its CRI
//     status (exit code, reason, finishedAt), and they are classified like any other;
//   - the kernel's kills: /dev/kmsg is read from its oldest record
//     (kmsg.OpenFromOldest), the record times turned into wall-clock times with the
//     boot time; until the backlog has been read (Config.KernelCaughtUp, at most
//     KernelBacklogWait after the start) exits and OOM kills wait, so that the kill
//     line of an exit from before the start places it (the container's cgroup is gone
//     by then);
//   - the memory cgroups' counters: a container first seen running whose own cgroup
//     has already counted an OOM kill (its counters start at 0 with it) had a process
//     OOM-killed unseen, and is classified as an OOM event;
//   - once only: a condition already True is not stamped again, a terminal phase is
//     never written over, and the exit history identifies an exit by its container,
//     restart count and finish time, so an exit recorded before the restart gets no
//     second entry. Exits from before the start are not counted as unknown OOMs (an
//     earlier run may have counted them).
//
// What is gone is gone: a container the kubelet removed while the agent was down (it
// keeps the last exited instance of each container), or a kill line overwritten in the
// ring buffer.
//
// # Nested nodes and shared kernels
//
// On kind and other nested nodes the kernel prints every cgroup path with the node
// container's cgroup in front (agent/cgroup explains the shapes), every node on the
// kernel sees every node's OOM kills in /dev/kmsg, and the runtime numbers PIDs in its
// own namespace. A kernel kill is the agent's only when the cgroup it names holds one of
// its containers' IDs (or, for a layout without IDs, its runtime path, with the host
// prefix once known), and never when its oom_memcg cannot be above that container; the
// pod comes from the agent's own cache of its node's pods. The host prefix is learned
// from the first kill that names one of the node's containers (the ledger's learnKillLocked). Kill lines
// that name only a PID (a rate-limited report) are matched by the PIDs
// classify.TrustedPIDs allows: the runtime's init PID of the container unless the node
// is evidently nested (a non-empty host prefix, or a kill of a single-process container
// under another PID than the runtime's), and the PIDs of cgroup.procs only when the
// agent runs in the init PID namespace; on a nested node none, and the cgroup counters
// decide.
//
// # Pod decisions
//
// classify.StampsForPod (A3 kubelet terminations, A4 terminal phase of deleted pods)
// runs for every pod update of a pod being deleted or with a status.reason, after every
// exit of one of its containers, and again at the RecheckAt it returns (the end of
// --phase-grace). The runtime's word on the pod's containers (the agent's observed
// states) takes precedence over the pod's status, so a pod whose kubelet is slow or
// gone still gets its phase; and the phase carries the runtime's exits (exit code,
// reason, startedAt, finishedAt, containerID) into the container statuses that still
// say running or waiting, or lack the container, never over a terminated state the
// kubelet wrote, so that an onExitCodes rule matches (classify.TerminatedStatuses).
//
// # Writes
//
// The agent never deletes a pod and writes only pods of its node. Every write goes
// through the stamper and the conditions package's writers: at most one write per pod
// per --stamp-batch-period (an exit history change is a second patch, also through
// pods/status; coroner_agent_pod_writes_total counts them), no write that changes
// nothing, resourceVersion preconditions, re-reads on conflict, retries with backoff on
// errors.
//
// # Fencing
//
// With --fencing the agent fences on a heartbeat (--fence-signal; conditions/fencing.go is
// the contract with the shim). With node-lease, the default, the heartbeat is its kubelet's
// Lease in kube-node-lease, which it watches (agent/fence/heartbeat.go), writing its own
// Lease coroner-agent-<node> in --lease-namespace ($POD_NAMESPACE, else coroner-system)
// only at the start and after a fence, with the annotations coroner.dev/fence-on-node-lease
// and coroner.dev/agent-pod ($POD_NAME). With agent-lease it renews that Lease every
// --fence-after/4 (between 1s and 10s; each attempt bounded by min(that, 5s)), with
// holderIdentity the node, renewTime, leaseDurationSeconds and the annotation
// coroner.dev/fence-after. When the heartbeat has been silent for --fence-after (or,
// before the first renewal seen or made, since the start), the agent is fenced
// (coroner_agent_fenced 1):
// every second it lists the runtime's running containers and pod sandboxes
// (cri.RuntimeClient) and stops those of its node's pods that are opted in to forceful
// deletion (fence.ToStop): the pods in its cache that are bound to its node, opted in and
// not terminal, and the pods the cache does not know whose sandbox's annotations (the
// kubelet's copy of the pod's) opt in; with the pod's grace period capped at 10s,
// counting them in coroner_agent_fence_stopped_containers_total. It never touches a pod
// that is not opted in. The pod cache outlives the connection to the API server, so the
// agent knows its pods while partitioned; the sandboxes cover an agent that (re)started
// while partitioned, whose cache is empty. The heartbeat heard again ends the fence (with
// agent-lease, its first successful renewal, which also writes coroner.dev/fenced-at; with
// node-lease, a renewal of the kubelet's Lease seen, then the agent writes fenced-at on its
// own Lease); then the agent emits
// one Warning Event Fenced on the Node naming the pods it stopped. Without --fencing
// there is no Lease and nothing is ever stopped.
//
// With --fencing, an API server that does not answer at start does not stop the agent
// (an agent that exited would never fence, while the shim takes its node for fenced from
// the stale Lease): it logs it and starts; its start counts as its last renewal, so it
// fences --fence-after after it unless a renewal succeeds first. It cannot read when the
// Lease was last renewed, which is before its start: it fences later than the shim
// expects by about the time it took to restart (agent/fence explains this residual
// window; with node-lease the window closes as soon as the agent reads its kubelet's
// Lease, whose renewTime replaces the start).
//
// # Health
//
// /readyz answers 503 with the reason while the container runtime does not answer (a
// missing socket: "... does not exist: is the container runtime running?", or with
// --runtime-endpoint=auto every socket tried); the agent keeps running and reconnecting
// meanwhile, and logs why (a repeated error once per 5 minutes). /healthz (liveness)
// answers ok whatever the runtime does: restarting the agent would not bring the runtime
// back, and a crash loop would bury the reason.
package agent
