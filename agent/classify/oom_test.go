package classify

import (
	"bufio"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/coroner-dev/coroner/agent/cgroup"
	"github.com/coroner-dev/coroner/agent/kmsg"
)

const (
	mi = 1 << 20

	podUID   = "0f4d5a5e-7c2b-4a8e-9d3a-2b1c9f6e8a11"
	otherUID = "7d1c7b1e-2a64-4c3e-8f0e-5b9a3c2d1e0f"
	cid      = "3e5e5eab87df615f4777e6f7f261a7fb62f4a7ee5bc3e25e3a5b5223ccd368fe"
	siblingC = "9b1f0c2a7d3e4f5a6b7c8d9e0f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c"

	// The lab's layout: cgroupfs driver under a per-node cgroup root.
	kubepods  = "/node-a/kubepods"
	burstable = kubepods + "/burstable"
	podCg     = burstable + "/pod" + podUID
	ctrCg     = podCg + "/" + cid

	sysdPod = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f4d5a5e_7c2b_4a8e_9d3a_2b1c9f6e8a11.slice"
	sysdCtr = sysdPod + "/cri-containerd-" + cid + ".scope"

	mainPID  = 4242
	childPID = 4250
)

var (
	started  = time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)
	finished = started.Add(10 * time.Minute)
)

// facts is the exit of container main of a burstable pod with a 20Mi limit,
// killed with 137 and nothing else known; cases add evidence.
func facts(mod ...func(*OOMFacts)) OOMFacts {
	f := OOMFacts{
		Container: "main", ContainerID: cid, ExitCode: 137, Reason: "Error",
		StartedAt: started, FinishedAt: finished, PIDs: []int{mainPID},
		PodUID: podUID, PodCgroup: podCg, ContainerCgroup: ctrCg, MemoryLimit: 20 * mi,
	}
	for _, m := range mod {
		m(&f)
	}
	return f
}

// memcgKill is a kernel kill with a summary line.
func memcgKill(oomMemcg, taskMemcg string, pid int) kmsg.OOMKill {
	return kmsg.OOMKill{Scope: kmsg.ScopeMemcg, Constraint: kmsg.ConstraintMemcg, OOMMemcg: oomMemcg, TaskMemcg: taskMemcg,
		Task: "python3", PID: pid, UID: 0, Summary: true, Time: finished.Add(-time.Second), HasTime: true}
}

func globalKill(taskMemcg string, pid int, constraint string) kmsg.OOMKill {
	return kmsg.OOMKill{Scope: kmsg.ScopeGlobal, Constraint: constraint, TaskMemcg: taskMemcg,
		Task: "python3", PID: pid, UID: 0, Summary: taskMemcg != "", Time: finished.Add(-time.Second), HasTime: true}
}

func withKernel(ks ...kmsg.OOMKill) func(*OOMFacts) {
	return func(f *OOMFacts) { f.Kernel = append(f.Kernel, ks...) }
}

func withReason(r string) func(*OOMFacts) { return func(f *OOMFacts) { f.Reason = r } }

func withExit(code int32) func(*OOMFacts) { return func(f *OOMFacts) { f.ExitCode = code } }

func withPeak(n int64) func(*OOMFacts) { return func(f *OOMFacts) { f.PeakUsage = n } }

func withCounters(c, p *cgroup.Delta) func(*OOMFacts) {
	return func(f *OOMFacts) { f.Counters, f.PodCounters = c, p }
}

func withPod(m *cgroup.Memory) func(*OOMFacts) {
	return func(f *OOMFacts) { f.Pod = m }
}

func lv(l cgroup.Level) *cgroup.Level { return &l }

func TestClassifyOOM(t *testing.T) {
	cases := map[string]struct {
		facts       OOMFacts
		wantKind    OOMKind
		wantLevel   *cgroup.Level // checked when set
		wantKiller  string
		wantMessage string // checked when set
		wantBasis   string // substring, checked when set
	}{
		"exit 1 without OOM evidence is not an OOM kill": {
			facts:    facts(withExit(1)),
			wantKind: NotOOM,
		},
		"exit 137 alone is a SIGKILL from anyone, not an OOM kill": {
			facts:    facts(),
			wantKind: NotOOM,
		},
		"kernel: oom_memcg is the container's cgroup: its own limit": {
			facts:       facts(withReason(ReasonOOMKilled), withPeak(20*mi), withKernel(memcgKill(ctrCg, ctrCg, mainPID))),
			wantKind:    LimitOOM,
			wantLevel:   lv(cgroup.LevelContainer),
			wantKiller:  ctrCg,
			wantMessage: "container main was OOM-killed at its memory limit of 20Mi (peak 20Mi)",
			wantBasis:   "inside the pod's cgroup",
		},
		"kernel: oom_memcg is the pod's cgroup under the kubelet's cgroup root (the lab's line): the pod's limit": {
			facts: facts(withReason(ReasonOOMKilled), withKernel(func() kmsg.OOMKill {
				k := memcgKill(podCg, ctrCg, mainPID)
				k.MemcgLimitKB = 40 * 1024
				return k
			}())),
			wantKind:    LimitOOM,
			wantLevel:   lv(cgroup.LevelPod),
			wantKiller:  podCg,
			wantMessage: "container main was OOM-killed at its pod's memory limit of 40Mi (memory cgroup " + podCg + ")",
		},
		"kernel: exit 137 without reason OOMKilled is still a limit OOM": {
			facts:     facts(withReason("Error"), withKernel(memcgKill(ctrCg, ctrCg, mainPID))),
			wantKind:  LimitOOM,
			wantLevel: lv(cgroup.LevelContainer),
		},
		"kernel: exit 0 after a child was killed at the pod's limit and PID 1 carried on": {
			facts:     facts(withExit(0), withReason("Completed"), withKernel(memcgKill(podCg, ctrCg, childPID))),
			wantKind:  LimitOOM,
			wantLevel: lv(cgroup.LevelPod),
		},
		"kernel: exit 1 after a child was killed by the burstable QoS cgroup": {
			facts:       facts(withExit(1), withKernel(memcgKill(burstable, ctrCg, childPID))),
			wantKind:    NodeOOM,
			wantLevel:   lv(cgroup.LevelQoS),
			wantKiller:  burstable,
			wantMessage: "container main was killed by the node's OOM killer: memory cgroup " + burstable + " (the burstable QoS class) ran out of memory",
		},
		"kernel: oom_memcg is kubepods (node allocatable)": {
			facts:       facts(withReason(ReasonOOMKilled), withKernel(memcgKill(kubepods, ctrCg, mainPID))),
			wantKind:    NodeOOM,
			wantLevel:   lv(cgroup.LevelKubepods),
			wantKiller:  kubepods,
			wantMessage: "container main was killed by the node's OOM killer: memory cgroup " + kubepods + " (all pods of the node) ran out of memory",
		},
		"kernel: oom_memcg is the kubelet's cgroup root, above kubepods": {
			facts:      facts(withReason(ReasonOOMKilled), withKernel(memcgKill("/node-a", ctrCg, mainPID))),
			wantKind:   NodeOOM,
			wantLevel:  lv(cgroup.LevelOther),
			wantKiller: "/node-a",
		},
		"kernel: global OOM killer, CONSTRAINT_NONE": {
			facts:       facts(withKernel(globalKill(ctrCg, mainPID, kmsg.ConstraintNone))),
			wantKind:    NodeOOM,
			wantLevel:   lv(cgroup.LevelRoot),
			wantMessage: "container main was killed by the node's OOM killer: the node ran out of memory (global OOM, CONSTRAINT_NONE)",
			wantBasis:   "global OOM",
		},
		"kernel: a cpuset-constrained OOM is the node's": {
			facts:     facts(withKernel(globalKill(ctrCg, mainPID, kmsg.ConstraintCpuset))),
			wantKind:  NodeOOM,
			wantLevel: lv(cgroup.LevelRoot),
		},
		"kernel: a rate-limited global kill line, matched by PID": {
			facts:       facts(withKernel(globalKill("", mainPID, ""))),
			wantKind:    NodeOOM,
			wantMessage: "container main was killed by the node's OOM killer: the node ran out of memory (global OOM, constraint not logged)",
		},
		"kernel: systemd driver, container matched by ID alone": {
			facts: facts(func(f *OOMFacts) { f.ContainerCgroup, f.PodCgroup = "", "" },
				withKernel(memcgKill(sysdCtr, sysdCtr, mainPID))),
			wantKind:   LimitOOM,
			wantLevel:  lv(cgroup.LevelContainer),
			wantKiller: sysdCtr,
		},
		"kernel: systemd driver, the pod slice's limit, pod UID spelled with underscores": {
			facts:      facts(withKernel(memcgKill(sysdPod, sysdCtr, mainPID))),
			wantKind:   LimitOOM,
			wantLevel:  lv(cgroup.LevelPod),
			wantKiller: sysdPod,
		},
		"kernel: a memory.oom.group kill of the container's cgroup": {
			facts: facts(withKernel(kmsg.OOMKill{Scope: kmsg.ScopeMemcg, Constraint: kmsg.ConstraintMemcg, OOMMemcg: ctrCg,
				GroupMemcg: ctrCg, PID: childPID})),
			wantKind:  LimitOOM,
			wantLevel: lv(cgroup.LevelContainer),
		},
		"kernel: a kill in a sibling container of the same pod is not this exit's": {
			facts:    facts(withKernel(memcgKill(podCg, podCg+"/"+siblingC, 999))),
			wantKind: NotOOM,
		},
		"kernel: a kill matched by PID long after the container ended is ignored": {
			facts: facts(withKernel(func() kmsg.OOMKill {
				k := globalKill("", mainPID, "")
				k.Time = finished.Add(time.Hour)
				return k
			}())),
			wantKind: NotOOM,
		},
		"kernel: the pod's UID is read from its cgroup when not given": {
			facts:     facts(func(f *OOMFacts) { f.PodUID = "" }, withKernel(memcgKill(podCg, ctrCg, mainPID))),
			wantKind:  LimitOOM,
			wantLevel: lv(cgroup.LevelPod),
		},
		"kernel: an oom_memcg naming another pod contradicts the task's cgroup and is not used": {
			facts:     facts(withReason(ReasonOOMKilled), withKernel(memcgKill(burstable+"/pod"+otherUID, ctrCg, mainPID))),
			wantKind:  UnknownOOM,
			wantBasis: "without evidence",
		},
		"kernel: kills that disagree, the main process's decides": {
			facts: facts(withKernel(
				memcgKill(podCg, ctrCg, mainPID),
				memcgKill(kubepods, ctrCg, childPID),
			)),
			wantKind:  LimitOOM,
			wantLevel: lv(cgroup.LevelPod),
		},
		"kernel: kills that disagree, none of the main process, the last decides": {
			facts: facts(withKernel(
				memcgKill(podCg, ctrCg, childPID),
				memcgKill(kubepods, ctrCg, childPID+1),
			)),
			wantKind:  NodeOOM,
			wantLevel: lv(cgroup.LevelKubepods),
		},
		"kernel: a layout without pod elements is placed by the pod's cgroup": {
			facts: facts(func(f *OOMFacts) {
				f.PodUID, f.PodCgroup, f.ContainerCgroup = "", "/jobs/job-1", "/jobs/job-1/main"
			}, withKernel(memcgKill("/jobs/job-1", "/jobs/job-1/main", mainPID))),
			wantKind:  LimitOOM,
			wantLevel: lv(cgroup.LevelPod),
		},
		"kernel's word beats the counters": {
			facts: facts(withCounters(&cgroup.Delta{Version: cgroup.V2, OOMKill: 1, OOM: 1}, nil),
				withKernel(globalKill(ctrCg, mainPID, kmsg.ConstraintNone))),
			wantKind: NodeOOM,
		},
		"cgroup v2: the container's own oom counter moved": {
			facts:      facts(withCounters(&cgroup.Delta{Version: cgroup.V2, OOMKill: 1, HasOOMKill: true, OOM: 1}, nil)),
			wantKind:   LimitOOM,
			wantLevel:  lv(cgroup.LevelContainer),
			wantKiller: ctrCg,
			wantBasis:  "container's own memory.events",
		},
		"cgroup v2: the pod's oom counter moved": {
			facts: facts(withCounters(&cgroup.Delta{Version: cgroup.V2, OOMKill: 1, HasOOMKill: true},
				&cgroup.Delta{Version: cgroup.V2, OOMKill: 1, HasOOMKill: true, OOM: 1})),
			wantKind:   LimitOOM,
			wantLevel:  lv(cgroup.LevelPod),
			wantKiller: podCg,
		},
		"cgroup v2: oom_kill with neither the container's nor the pod's oom counter moved": {
			facts: facts(withCounters(&cgroup.Delta{Version: cgroup.V2, OOMKill: 1, HasOOMKill: true},
				&cgroup.Delta{Version: cgroup.V2, OOMKill: 1, HasOOMKill: true}),
				withPod(&cgroup.Memory{Version: cgroup.V2, OOMKill: 1, HasOOMKill: true})),
			wantKind:    NodeOOM,
			wantMessage: "container main was killed by the node's OOM killer: neither the container nor its pod reached its memory limit",
		},
		"cgroup v2: the container's counters alone do not rule out the pod's limit": {
			facts:    facts(withCounters(&cgroup.Delta{Version: cgroup.V2, OOMKill: 1, HasOOMKill: true}, nil)),
			wantKind: UnknownOOM,
		},
		"cgroup v1: failcnt 0 in the container and the pod: neither limit was reached": {
			facts: facts(withCounters(&cgroup.Delta{Version: cgroup.V1, OOMKill: 1, HasOOMKill: true},
				&cgroup.Delta{Version: cgroup.V1}), withPod(&cgroup.Memory{Version: cgroup.V1})),
			wantKind:  NodeOOM,
			wantBasis: "memory.failcnt",
		},
		// bench-beside on the lab (cgroup v1, containerd 1.6 and 1.7, the agent relisting):
		// the pod's first reading came a second after the container started, after the
		// kill at the pod's limit (the pause container's memory counts there too, so the
		// pod's limit is reached before the container's); the pod's failcnt "did not move"
		// since then, and the limit OOM was stamped NodeOOMKill.
		"cgroup v1: the pod's failcnt did not move since a late first reading, but had before": {
			facts: facts(withCounters(&cgroup.Delta{Version: cgroup.V1, OOMKill: 1, HasOOMKill: true},
				&cgroup.Delta{Version: cgroup.V1}), withPod(&cgroup.Memory{Version: cgroup.V1, FailCnt: 41})),
			wantKind: UnknownOOM,
		},
		"cgroup v2: the pod's oom counter did not move since a late first reading, but had before": {
			facts: facts(withCounters(&cgroup.Delta{Version: cgroup.V2, OOMKill: 1, HasOOMKill: true},
				&cgroup.Delta{Version: cgroup.V2}), withPod(&cgroup.Memory{Version: cgroup.V2, OOM: 1, OOMKill: 1, HasOOMKill: true})),
			wantKind: UnknownOOM,
		},
		"cgroup v1: the pod's failcnt moved, which is no proof; peak below the limit": {
			facts: facts(withPeak(12*mi), withCounters(&cgroup.Delta{Version: cgroup.V1, OOMKill: 1, HasOOMKill: true},
				&cgroup.Delta{Version: cgroup.V1, FailCnt: 92})),
			wantKind: UnknownOOM,
		},
		"peak usage at the limit with a rate-limited memcg kill line": {
			facts:       facts(withPeak(20*mi-8192), withKernel(kmsg.OOMKill{Scope: kmsg.ScopeMemcg, PID: mainPID, Task: "python3"})),
			wantKind:    LimitOOM,
			wantLevel:   lv(cgroup.LevelContainer),
			wantMessage: "container main was OOM-killed at its memory limit of 20Mi (peak 20472Ki)",
			wantBasis:   "peak usage",
		},
		"peak usage well below the limit with a rate-limited memcg kill line: unknown": {
			facts:    facts(withPeak(10*mi), withKernel(kmsg.OOMKill{Scope: kmsg.ScopeMemcg, PID: mainPID, Task: "python3"})),
			wantKind: UnknownOOM,
		},
		// Constructed from bench-beside's unplaced kills on the lab (cgroup v1, 6 limit-OOM
		// Jobs at a time per node): the kernel's summary lines rate limited and no reading
		// of the container's cgroup; the pod's cgroup (24Mi, the sum of its one
		// container's limit), which lives until the pod is terminal, says its peak reached
		// its limit.
		"rate-limited memcg kill line, container cgroup gone, the pod's peak at the pod's limit": {
			facts: facts(withReason(ReasonOOMKilled), withKernel(kmsg.OOMKill{Scope: kmsg.ScopeMemcg, PID: mainPID, Task: "memhog"}),
				withPod(&cgroup.Memory{Version: cgroup.V1, Limit: 20 * mi, Peak: 20 * mi, FailCnt: 12})),
			wantKind:    LimitOOM,
			wantLevel:   lv(cgroup.LevelPod),
			wantKiller:  podCg,
			wantMessage: "container main was OOM-killed at its pod's memory limit of 20Mi (memory cgroup " + podCg + ")",
			wantBasis:   "the pod's peak usage",
		},
		"the pod's peak well below the pod's limit: unknown": {
			facts: facts(withReason(ReasonOOMKilled), withKernel(kmsg.OOMKill{Scope: kmsg.ScopeMemcg, PID: mainPID, Task: "memhog"}),
				withPod(&cgroup.Memory{Version: cgroup.V1, Limit: 20 * mi, Peak: 9 * mi, FailCnt: 12})),
			wantKind: UnknownOOM,
		},
		"a pod without a limit of its own: its peak says nothing": {
			facts:    facts(withReason(ReasonOOMKilled), withPod(&cgroup.Memory{Version: cgroup.V1, Peak: 300 * mi}), func(f *OOMFacts) { f.MemoryLimit = 0 }),
			wantKind: UnknownOOM,
		},
		"containerd TaskOOM alone, container without a limit: unknown": {
			facts:    facts(func(f *OOMFacts) { f.TaskOOM, f.MemoryLimit = true, 0 }),
			wantKind: UnknownOOM,
		},
		"runtime reason OOMKilled with usage at the limit": {
			facts:       facts(withReason(ReasonOOMKilled), withPeak(20*mi)),
			wantKind:    LimitOOM,
			wantMessage: "container main was OOM-killed at its memory limit of 20Mi (peak 20Mi)",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			v := ClassifyOOM(tc.facts)
			if v.Kind != tc.wantKind {
				t.Fatalf("Kind = %q, want %q (basis %q, evidence %q)", v.Kind, tc.wantKind, v.Basis, v.Evidence)
			}
			if tc.wantKind == NotOOM {
				return
			}
			if tc.wantLevel != nil && v.KillerLevel != *tc.wantLevel {
				t.Errorf("KillerLevel = %v, want %v", v.KillerLevel, *tc.wantLevel)
			}
			if tc.wantKiller != "" && v.Killer != tc.wantKiller {
				t.Errorf("Killer = %q, want %q", v.Killer, tc.wantKiller)
			}
			if tc.wantMessage != "" && v.Message() != tc.wantMessage {
				t.Errorf("Message() = %q\nwant        %q", v.Message(), tc.wantMessage)
			}
			if !strings.Contains(v.Basis, tc.wantBasis) {
				t.Errorf("Basis = %q, want it to contain %q", v.Basis, tc.wantBasis)
			}
			if len(v.Evidence) == 0 {
				t.Errorf("Evidence is empty")
			}
		})
	}
}

func TestClassifyOOMNotOOMSaysWhyFor137(t *testing.T) {
	v := ClassifyOOM(facts())
	if len(v.Evidence) != 1 || !strings.Contains(v.Evidence[0], "137") {
		t.Errorf("Evidence = %q, want a note on exit 137", v.Evidence)
	}
	if v.Message() != "" {
		t.Errorf("Message() = %q for NotOOM, want empty", v.Message())
	}
}

// TestClassifyCapturedKernelLines runs the kernel lines captured in the lab
// (Linux 6.18, cgroup v1, cgroupfs layout under the cgroup root
// /coroner-oomtest) through the kmsg assembler and classifies each of the
// three exits with only what the agent would know of it: its container and
// pod cgroups and its exit code.
func TestClassifyCapturedKernelLines(t *testing.T) {
	f, err := os.Open("../kmsg/testdata/dmesg-v1-cgroupfs-linux-6.18.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var a kmsg.Assembler
	var kills []kmsg.OOMKill
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if r, ok := kmsg.ParseLine(sc.Text()); ok {
			kills = append(kills, a.Add(r)...)
		}
	}
	kills = append(kills, a.Flush()...)

	const root = "/coroner-oomtest/kubepods"
	cases := map[string]struct {
		pod, container string
		exit           int32
		want           OOMKind
		wantLevel      *cgroup.Level
		wantMessage    string
	}{
		"at the container's 20Mi limit": {
			pod:         root + "/burstable/pod0f4d5a5e-7c2b-4a8e-9d3a-2b1c9f6e8a11",
			container:   "3e5e5eab87df615f4777e6f7f261a7fb62f4a7ee5bc3e25e3a5b5223ccd368fe",
			exit:        137,
			want:        LimitOOM,
			wantLevel:   lv(cgroup.LevelContainer),
			wantMessage: "container main was OOM-killed at its memory limit of 20Mi (peak 20Mi)",
		},
		"at the pod's 20Mi limit, PID 1 survived and exited 0": {
			pod:       root + "/burstable/pod7d1c7b1e-2a64-4c3e-8f0e-5b9a3c2d1e0f",
			container: "9b1f0c2a7d3e4f5a6b7c8d9e0f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c",
			exit:      0,
			want:      LimitOOM,
			wantLevel: lv(cgroup.LevelPod),
			wantMessage: "container main was OOM-killed at its pod's memory limit of 20Mi (memory cgroup " +
				root + "/burstable/pod7d1c7b1e-2a64-4c3e-8f0e-5b9a3c2d1e0f)",
		},
		"at the besteffort QoS cgroup's limit": {
			pod:         root + "/besteffort/poda3b2c1d0-1111-4222-8333-944455556666",
			container:   "c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00",
			exit:        137,
			want:        NodeOOM,
			wantLevel:   lv(cgroup.LevelQoS),
			wantMessage: "container main was killed by the node's OOM killer: memory cgroup " + root + "/besteffort (the besteffort QoS class) ran out of memory",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			v := ClassifyOOM(OOMFacts{
				Container: "main", ContainerID: tc.container, ExitCode: tc.exit,
				PodCgroup: tc.pod, ContainerCgroup: tc.pod + "/" + tc.container, Kernel: kills,
			})
			if v.Kind != tc.want || v.KillerLevel != *tc.wantLevel {
				t.Fatalf("verdict = %s at %v (%s), want %s at %v", v.Kind, v.KillerLevel, v.Basis, tc.want, *tc.wantLevel)
			}
			if v.Message() != tc.wantMessage {
				t.Errorf("Message() = %q\nwant        %q", v.Message(), tc.wantMessage)
			}
		})
	}
}
