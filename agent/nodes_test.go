package agent

// Tests of nested nodes and shared kernels: whose kernel kills are the node's, and which
// PIDs a kill line may be matched by.

import (
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/coroner-dev/coroner/agent/kmsg"
	"github.com/coroner-dev/coroner/agent/metrics"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/cri"
)

// kernelTestdata reads the OOM kills of a kmsg test data file.
func kernelTestdata(t *testing.T, name string) []kmsg.OOMKill {
	t.Helper()
	f, err := os.Open("kmsg/testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	kills, err := kmsg.ParseText(f)
	if err != nil {
		t.Fatal(err)
	}
	return kills
}

func notInit() (bool, error) { return false, nil }

// TestKindSharedKernel (N3): node A's agent on a kind host reads every kind node's OOM
// kills from the shared /dev/kmsg (constructed-kind-two-nodes.txt: node A's pod over its
// limit, node B's pod over its limit killing host PID 4242, node A's node OOM, a lone
// rate-limited kill line of PID 4243). It stamps its own pod over its limit, learns the
// host prefix from that kill, and attributes neither node B's kill to its container
// whose runtime PID happens to be 4242, nor the lone PID-only line to its container
// whose runtime PID is 4243: on a nested node PIDs are not the kernel's.
func TestKindSharedKernel(t *testing.T) {
	hog := newPod("hog", "68e0cbcc-0cf8-48fc-9a5c-bbb45350dd13", corev1.RestartPolicyNever, "main")
	probe := newPod("probed", "cccccccc-cccc-4ccc-8ccc-cccccccccccc", corev1.RestartPolicyNever, "main")
	lone := newPod("lone", "dddddddd-dddd-4ddd-8ddd-dddddddddddd", corev1.RestartPolicyNever, "main")
	e := newTestEnv(t, func(c *Config) { c.InitPIDNamespace = notInit }, hog, probe, lone)

	kindEvent := func(kind cri.Kind, p *corev1.Pod, id string, pid int) cri.ContainerEvent {
		ev := event(kind, p, "main", id)
		// The runtime's systemd cgroupsPath on a kind node (cgroupRoot /kubelet).
		ev.CgroupPath = "kubelet-kubepods-burstable-pod" + strings.ReplaceAll(string(p.UID), "-", "_") + ".slice:cri-containerd:" + id
		ev.PID = pid
		return ev
	}
	ids := map[*corev1.Pod]string{hog: strings.Repeat("1", 64), probe: strings.Repeat("3", 64), lone: strings.Repeat("4", 64)}
	pids := map[*corev1.Pod]int{hog: 17, probe: 4242, lone: 4243} // the runtime's numbering: the node container's
	for p, id := range ids {
		e.src.Send(kindEvent(cri.Started, p, id, pids[p]))
	}
	e.until("the containers known", func() bool {
		c, _ := e.a.ledger.Container(ids[lone])
		return e.a.ledger.Len() == 3 && c.RuntimePID == 4243
	})
	kills := kernelTestdata(t, "constructed-kind-two-nodes.txt")
	for _, k := range kills {
		e.kernel <- k
	}
	e.until("the kernel kills read and the prefix learned", func() bool {
		k := e.a.ledger.Kernel()
		return k.Kills == len(kills) && k.PIDs.PrefixKnown
	})
	prefix := e.a.ledger.Kernel().PIDs.HostPrefix
	if want := "/system.slice/docker-b2b75b11f95220f9267e53d48df2d654d585405c36b4c752302ab39da59d74e6.scope"; prefix != want {
		t.Fatalf("host prefix %q, want %q", prefix, want)
	}

	e.src.Send(kindEvent(cri.Exited, hog, ids[hog], 0))
	ex := exited(probe, "main", ids[probe], 137, "Error") // e.g. a liveness probe's kill
	ex.CgroupPath = ""
	e.src.Send(ex)
	ex = exited(lone, "main", ids[lone], 137, "Error")
	ex.CgroupPath = ""
	e.src.Send(ex)
	for _, id := range ids {
		// A 137 exit with no OOM evidence yet waits KernelWait on the agent's clock.
		e.stepUntil("the exit classified", 50*time.Millisecond, e.containerDone(id))
	}
	e.stepUntil("the stamp", 20*time.Millisecond, func() bool {
		return conditions.IsTrue(&e.pod("hog").Status, conditions.OOMKilled)
	})
	e.stepUntil("a few batch periods more", 50*time.Millisecond, func() bool { return e.clk.Since(t0) > 2*time.Second })
	e.settle()
	for _, name := range []string{"probed", "lone"} {
		if c := e.pod(name).Status.Conditions; len(c) != 0 {
			t.Errorf("pod %s stamped with %+v from another node's or an unattributable kill", name, c)
		}
	}
	if v := metrics.Value(e.m.ContainerExits.WithLabelValues(metrics.VerdictNotOOM)); v != 2 {
		t.Errorf("NotOOM exits = %v, want 2", v)
	}
}

// TestRateLimitedKillOrdinaryNode (A2, N3): on an ordinary node a kill line that names
// only a PID (the kernel rate limited the report) is matched by the runtime's PID of the
// container's init process, even though the agent is not in the init PID namespace (its
// cgroup.procs PIDs are not trusted); the cgroup readings then place the OOM.
func TestRateLimitedKillOrdinaryNode(t *testing.T) {
	uid := types.UID("eeeeeeee-eeee-4eee-8eee-eeeeeeeeeeee")
	p := newPod("burst", uid, corev1.RestartPolicyNever, "main")
	e := newTestEnv(t, func(c *Config) { c.InitPIDNamespace = notInit }, p)
	id := containerID(20)
	cg := podCgroup(uid) + "/" + id
	e.writeCgroup(podCgroup(uid), 0, 0, 0, 0)
	e.writeCgroup(cg, 0, 0, 20<<20, 1<<20, 1)
	start := event(cri.Started, p, "main", id)
	start.PID = 5101
	e.src.Send(start)
	e.until("the start reading", func() bool {
		c, ok := e.a.ledger.Container(id)
		return ok && c.StartRead
	})
	// dmesg-ratelimited-burst.txt's first line: "Memory cgroup out of memory: Killed
	// process 5101 (worker) ...", no summary.
	e.kernelReports(kernelTestdata(t, "dmesg-ratelimited-burst.txt")[0])
	e.writeCgroup(cg, 0, 9, 20<<20, 20<<20, 1)
	e.writeCgroup(podCgroup(uid), 0, 9, 0, 20<<20)
	e.src.Send(exited(p, "main", id, 137, "Error"))
	e.until("the exit classified", e.containerDone(id))
	e.stepUntil("the stamp", 20*time.Millisecond, func() bool {
		return conditions.IsTrue(&e.pod("burst").Status, conditions.OOMKilled)
	})
	if v := metrics.Value(e.m.ContainerExits.WithLabelValues("LimitOOM")); v != 1 {
		t.Errorf("LimitOOM exits = %v, want 1", v)
	}
}
