// Package classify is the node agent's judgement: pure functions from what
// the node knows about a container exit or a pod to what to stamp on the pod.
// Nothing here reads a file, a socket or the clock; the agent gathers the
// facts (from CRI and containerd events, the kernel log, the cgroup files)
// and writes the stamps (through the conditions package's writers).
//
//   - ClassifyOOM (requirement A2) decides whether a container exit was an OOM
//     kill and whose limit caused it: the pod's own (LimitOOM, most likely a
//     bug or an undersized limit: the workload's fault), the node's
//     (NodeOOM: memory pressure, infrastructure), or an OOM kill that cannot
//     be placed (UnknownOOM).
//   - StampsForExit turns a verdict and an exit into stamps: the
//     coroner.dev/OOMKilled or DisruptionTarget condition, and the exit
//     history annotation of pods that restart containers in place (A5).
//   - StampsForPod decides the pod-level stamps that do not hang on one exit:
//     DisruptionTarget for kubelet-initiated terminations on kubelets that do
//     not add it (A3), and a terminal phase for pods being deleted whose
//     containers have all exited (A4).
//
// Every stamp adds what is missing and never overwrites what the kubelet (or
// another component) wrote: a terminal phase is never changed, an existing
// DisruptionTarget=True is never replaced, and an OOMKilled condition already
// True is left as it is (the first cause of death stays; later ones are in
// the exit history).
package classify
