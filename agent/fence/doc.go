// Package fence is the node agent's fencing (requirement A6, --fencing): the agent
// renews a Lease of its node, and when it has gone --fence-after without a successful
// renewal it stops, over CRI, the containers of its node's pods that are opted in to
// forceful deletion, and keeps them stopped until a renewal succeeds again; then it
// records that it fenced, on the Lease and in an Event on the Node. The shim reads the
// Lease (conditions.NodeFenced) and recovers the pods of a fenced node without waiting
// for the toleration (Z2): that is what makes forced recovery safe.
//
// Two heartbeats can tell the agent that its node reaches the API server
// (--fence-signal): its kubelet's node Lease, which it watches (Config.NodeLease, the
// agent's default; heartbeat.go describes it: no write at rest), or a Lease of its own
// that it renews (the first design, below). Everything else (what it stops, how, the
// record and the Event) is the same.
//
// # Timeline with its own Lease (conditions/fencing.go holds the contract with the shim)
//
//   - Every RenewPeriod (--fence-after/4, between 1s and 10s) the agent writes the Lease
//     coroner-agent-<node> in its namespace (DesiredLease): holderIdentity the node,
//     renewTime the time of the attempt, leaseDurationSeconds --fence-after rounded up
//     to seconds, the annotation coroner.dev/fence-after. Each attempt is bounded by
//     RequestTimeout (at most 5s), so that a partition, where requests hang, is noticed.
//     A successful write records its renewTime as the last renewal; the agent's start
//     (Config.Start) counts as one.
//   - Every FencedPeriod (1s) the agent checks ShouldFence: more than --fence-after since
//     the last renewal, whatever the reason the renewals failed (an unreachable API
//     server, or errors: the shim sees a stale Lease either way). From then on it is
//     fenced (coroner_agent_fenced 1): every second it lists the running containers and
//     stops those of opted-in pods of its node (ToStop, below); a container the kubelet
//     restarts is stopped again at the next pass. Each container gets StopTimeout (the
//     pod's grace period, at most 10s) between SIGTERM and SIGKILL. Pods that are not
//     opted in are never touched.
//   - While fenced, the agent tries to renew every FencedPeriod. The first renewal that
//     succeeds also writes coroner.dev/fenced-at (when the agent started fencing) and
//     ends the fence; then the agent emits one Warning Event Fenced on the Node (Message:
//     how long, and which pods it stopped).
//   - The shim takes the node for fenced once renewTime + --fence-after + its margin has
//     passed: by then the agent has fenced (at renewTime + --fence-after, plus at most
//     FencedPeriod), and its stops have ended (at most DefaultMaxStopTimeout later).
//
// # Which containers
//
// The fence must work without the API server, so the opted-in pods come from two sources
// the agent has without it (ToStop):
//
//   - the agent's pod cache (Config.Pods), which outlives the connection to the API
//     server: pods bound to the node, opted in (conditions.OptedInToForcefulDeletion) and
//     not terminal. A pod the cache knows is decided by the cache alone.
//   - the runtime's pod sandboxes, when Config.Runtime also lists them (SandboxLister;
//     cri.RuntimeClient does): the kubelet copies a pod's annotations onto its sandbox
//     (PodSandboxConfig.Annotations), so a running container whose sandbox's annotations
//     opt in is stopped even when the cache does not know its pod: an agent that started
//     while cut off has an empty cache. Such a pod has no phase (all its running
//     containers are stopped) and no known grace period (DefaultMaxStopTimeout).
//
// The containers are listed before the sandboxes, so that the sandbox of each running
// container is in the second list. If the sandboxes cannot be listed, that pass goes by
// the cache alone, and the next pass tries again.
//
// # An agent that (re)starts cut off from the API server
//
// With --fencing the agent starts even when it cannot reach the API server (agent.Run),
// since an agent that exited would never fence while the shim, which sees only a stale
// Lease, takes its node for fenced. It cannot read its Lease, so it does not know when
// it (its previous run) last renewed: it counts its start as the last renewal and fences
// --fence-after after it, unless a renewal succeeds first. That is the earliest moment it
// can fence without risking a fence that nothing called for: the previous run may have
// renewed just before this start (a plain restart while the API server is slow to
// answer), and then the shim does not take the node for fenced before start +
// --fence-after + its margin. But the Lease's renewTime is older than the start, so the
// shim's deadline (renewTime + --fence-after + margin) comes earlier than in that best
// case: the agent fences late by the time from renewTime to its start, less what the
// margin leaves over (the margin minus FencedPeriod and the stop grace). That is the
// residual window, in which the shim may already recover the opted-in pods while they
// still run here: about the restart time (the crash, the DaemonSet's back-off), plus any
// time the previous run spent cut off before it went down. If that run had fenced
// already, the kubelet may have restarted the stopped containers meanwhile, and they run
// until start + --fence-after. An agent that restarts more often than --fence-after
// never fences.
//
// Without --fencing there is no Fencer: no Lease, and nothing is ever stopped.
package fence
