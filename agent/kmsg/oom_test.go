package kmsg

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

const (
	labRoot = "/coroner-oomtest" // the captured samples' stand-in for the kubelet's --cgroup-root
	uid1    = "0f4d5a5e-7c2b-4a8e-9d3a-2b1c9f6e8a11"
	cid1    = "3e5e5eab87df615f4777e6f7f261a7fb62f4a7ee5bc3e25e3a5b5223ccd368fe"
	uid2    = "7d1c7b1e-2a64-4c3e-8f0e-5b9a3c2d1e0f"
	cid2    = "9b1f0c2a7d3e4f5a6b7c8d9e0f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c"
	uid3    = "a3b2c1d0-1111-4222-8333-944455556666"
	cid3    = "c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00"

	sysdCtr = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod968a06fb_9ab9_4819_8caf_0392ddff3d9b.slice/cri-containerd-0f32894de86edf3d3832702af794874ef8d400b4969acdea4976b12040756e0d.scope"
	oldPod  = "/kubepods/burstable/pod2b7e1f0a-5c4d-11ea-8e2d-0a58ac1f0a2b"
	oldCtr  = oldPod + "/8a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9"
	glbCtr  = "/kubepods/besteffort/pod5d9f6c1e-8b7a-4c3d-9e2f-1a0b9c8d7e6f/4b8d2f7a9c1e3b5d7f9a1c3e5b7d9f1a3c5e7b9d1f3a5c7e9b1d3f5a7c9e1b3d"
)

func TestParseSummary(t *testing.T) {
	cases := map[string]struct {
		in     string
		want   OOMKill
		wantOK bool
	}{
		"cgroup v1, pod over its own limit (captured)": {
			in: "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=" + labRoot + "/kubepods/burstable/pod" + uid2 +
				",task_memcg=" + labRoot + "/kubepods/burstable/pod" + uid2 + "/" + cid2 + ",task=busybox,pid=32183,uid=0",
			wantOK: true,
			want: OOMKill{Scope: ScopeMemcg, Constraint: ConstraintMemcg, OOMMemcg: labRoot + "/kubepods/burstable/pod" + uid2,
				TaskMemcg: labRoot + "/kubepods/burstable/pod" + uid2 + "/" + cid2, Task: "busybox", PID: 32183, UID: 0, Summary: true},
		},
		"cgroup v2 systemd with a cpuset name and a NUMA range": {
			in:     "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=cri-containerd-x.scope,mems_allowed=0-1,oom_memcg=" + sysdCtr + ",task_memcg=" + sysdCtr + ",task=python3,pid=91234,uid=1000",
			wantOK: true,
			want:   OOMKill{Scope: ScopeMemcg, Constraint: ConstraintMemcg, OOMMemcg: sysdCtr, TaskMemcg: sysdCtr, Task: "python3", PID: 91234, UID: 1000, Summary: true},
		},
		"global OOM": {
			in:     "oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,task_memcg=" + glbCtr + ",task=stress-ng,pid=22101,uid=0",
			wantOK: true,
			want:   OOMKill{Scope: ScopeGlobal, Constraint: ConstraintNone, TaskMemcg: glbCtr, Task: "stress-ng", PID: 22101, UID: 0, Summary: true},
		},
		"cpuset constrained OOM is the node's": {
			in:     "oom-kill:constraint=CONSTRAINT_CPUSET,nodemask=(null),cpuset=pinned,mems_allowed=1,global_oom,task_memcg=/kubepods/x,task=a,pid=1,uid=0",
			wantOK: true,
			want:   OOMKill{Scope: ScopeGlobal, Constraint: ConstraintCpuset, TaskMemcg: "/kubepods/x", Task: "a", PID: 1, UID: 0, Summary: true},
		},
		"memory policy constrained OOM is the node's": {
			in:     "oom-kill:constraint=CONSTRAINT_MEMORY_POLICY,nodemask=0-2,4,cpuset=/,mems_allowed=0-4,global_oom,task_memcg=/,task=a,pid=1,uid=0",
			wantOK: true,
			want:   OOMKill{Scope: ScopeGlobal, Constraint: ConstraintMemoryPolicy, TaskMemcg: "/", Task: "a", PID: 1, UID: 0, Summary: true},
		},
		"commas inside nodemask, mems_allowed and the task name": {
			in:     "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=0-2,4,cpuset=/jobs,mems_allowed=0,2-4,oom_memcg=/jobs/test,task_memcg=/jobs/test/worker,task=a,b=c,pid=10,uid=1000",
			wantOK: true,
			want:   OOMKill{Scope: ScopeMemcg, Constraint: ConstraintMemcg, OOMMemcg: "/jobs/test", TaskMemcg: "/jobs/test/worker", Task: "a,b=c", PID: 10, UID: 1000, Summary: true},
		},
		"kernel without memcg or cpuset support": {
			in:     "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),task=bun,pid=109324,uid=1000",
			wantOK: true,
			want:   OOMKill{Scope: ScopeMemcg, Constraint: ConstraintMemcg, Task: "bun", PID: 109324, UID: 1000, Summary: true},
		},
		"unknown constraint with an oom_memcg is a memcg OOM": {
			in:     "oom-kill:constraint=CONSTRAINT_BPF,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/a,task_memcg=/a/b,task=x,pid=2,uid=0",
			wantOK: true,
			want:   OOMKill{Scope: ScopeMemcg, Constraint: "CONSTRAINT_BPF", OOMMemcg: "/a", TaskMemcg: "/a/b", Task: "x", PID: 2, UID: 0, Summary: true},
		},
		"a journal prefix before the summary": {
			in:     "Feb 03 19:57:08 n kernel: oom-kill:constraint=CONSTRAINT_MEMCG,oom_memcg=/a,task_memcg=/a,task=x,pid=3,uid=0",
			wantOK: true,
			want:   OOMKill{Scope: ScopeMemcg, Constraint: ConstraintMemcg, OOMMemcg: "/a", TaskMemcg: "/a", Task: "x", PID: 3, UID: 0, Summary: true},
		},
		"bad pid and uid are left unknown": {
			in:     "oom-kill:constraint=CONSTRAINT_MEMCG,oom_memcg=/a,task=x,pid=?,uid=?",
			wantOK: true,
			want:   OOMKill{Scope: ScopeMemcg, Constraint: ConstraintMemcg, OOMMemcg: "/a", Task: "x", UID: -1, Summary: true},
		},
		"not a summary": {in: "Memory cgroup out of memory: Killed process 1 (x)"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, ok := ParseSummary(tc.in)
			if ok != tc.wantOK {
				t.Fatalf("ParseSummary() ok = %v, want %v", ok, tc.wantOK)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("ParseSummary() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// assemble reads the OOM kills of a kmsg test data file.
func assemble(t *testing.T, name string) []OOMKill {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	kills, err := ParseText(f)
	if err != nil {
		t.Fatal(err)
	}
	return kills
}

func us(n int64) time.Duration { return time.Duration(n) * time.Microsecond }

// capturedV1 are the kills in the captured Linux 6.18 samples.
func capturedV1(withSeq bool) []OOMKill {
	kills := []OOMKill{
		{
			Seq: 446, Monotonic: us(2300873980), HasTime: true,
			Scope: ScopeMemcg, Constraint: ConstraintMemcg,
			OOMMemcg:  labRoot + "/kubepods/burstable/pod" + uid1 + "/" + cid1,
			TaskMemcg: labRoot + "/kubepods/burstable/pod" + uid1 + "/" + cid1,
			Task:      "busybox", PID: 31837, UID: 0, AnonRSSKB: 19968, FileRSSKB: 1168,
			MemcgUsageKB: 20480, MemcgLimitKB: 20480, Summary: true,
		},
		{
			Seq: 543, Monotonic: us(2311118133), HasTime: true,
			Scope: ScopeMemcg, Constraint: ConstraintMemcg,
			OOMMemcg:  labRoot + "/kubepods/burstable/pod" + uid2,
			TaskMemcg: labRoot + "/kubepods/burstable/pod" + uid2 + "/" + cid2,
			Task:      "busybox", PID: 32183, UID: 0, AnonRSSKB: 20224, FileRSSKB: 1168,
			MemcgUsageKB: 20480, MemcgLimitKB: 20480, Summary: true,
		},
		{
			Seq: 641, Monotonic: us(2311170604), HasTime: true,
			Scope: ScopeMemcg, Constraint: ConstraintMemcg,
			OOMMemcg:  labRoot + "/kubepods/besteffort",
			TaskMemcg: labRoot + "/kubepods/besteffort/pod" + uid3 + "/" + cid3,
			Task:      "busybox", PID: 32185, UID: 0, AnonRSSKB: 24448, FileRSSKB: 1168,
			MemcgUsageKB: 24576, MemcgLimitKB: 24576, Summary: true,
		},
	}
	if !withSeq {
		for i := range kills {
			kills[i].Seq = 0
		}
	}
	return kills
}

func TestAssembler(t *testing.T) {
	cases := map[string]struct {
		file string
		want []OOMKill
	}{
		"captured kmsg records, v1: container limit, pod limit, QoS class limit": {
			file: "kmsg-v1-cgroupfs-linux-6.18.txt",
			want: capturedV1(true),
		},
		"captured dmesg, v1: the same three": {
			file: "dmesg-v1-cgroupfs-linux-6.18.txt",
			want: capturedV1(false),
		},
		"v2 systemd with memory.oom.group: each task once, group kills inherit the report": {
			file: "dmesg-v2-systemd-oomgroup.txt",
			want: []OOMKill{
				{
					Monotonic: us(8123456520), HasTime: true, Scope: ScopeMemcg, Constraint: ConstraintMemcg,
					OOMMemcg: sysdCtr, TaskMemcg: sysdCtr, Task: "python3", PID: 91234, UID: 1000,
					AnonRSSKB: 1043456, FileRSSKB: 4548, MemcgUsageKB: 1048576, MemcgLimitKB: 1048576, Summary: true,
				},
				{
					Monotonic: us(8123456610), HasTime: true, Scope: ScopeMemcg, Constraint: ConstraintMemcg,
					OOMMemcg: sysdCtr, GroupMemcg: sysdCtr, Task: "sh", PID: 91200, UID: 1000,
					AnonRSSKB: 96, FileRSSKB: 800, MemcgUsageKB: 1048576, MemcgLimitKB: 1048576,
				},
			},
		},
		"global OOM": {
			file: "dmesg-global-oom.txt",
			want: []OOMKill{{
				Monotonic: us(712345100420), HasTime: true, Scope: ScopeGlobal, Constraint: ConstraintNone,
				TaskMemcg: glbCtr, Task: "stress-ng", PID: 22101, UID: 0, AnonRSSKB: 4093952, Summary: true,
			}},
		},
		"Linux 4.14: Task in, Kill process, unprefixed Killed process": {
			file: "dmesg-linux-4.14-memcg.txt",
			want: []OOMKill{{
				Monotonic: us(5012101600), HasTime: true, Scope: ScopeMemcg, Constraint: ConstraintMemcg,
				OOMMemcg: oldCtr, TaskMemcg: oldCtr, Task: "python", PID: 2345, UID: -1,
				AnonRSSKB: 259800, FileRSSKB: 248, MemcgUsageKB: 262144, MemcgLimitKB: 262144, Summary: true,
			}},
		},
		"rate limited: kill lines alone say memcg or global, not which cgroup": {
			file: "dmesg-ratelimited-burst.txt",
			want: []OOMKill{
				{Monotonic: us(9001000100), HasTime: true, Scope: ScopeMemcg, Task: "worker", PID: 5101, UID: 0, AnonRSSKB: 262144, FileRSSKB: 1024},
				{Monotonic: us(9001000300), HasTime: true, Scope: ScopeMemcg, Task: "worker", PID: 5102, UID: 0, AnonRSSKB: 262144, FileRSSKB: 1024},
				{Monotonic: us(9002500000), HasTime: true, Scope: ScopeGlobal, Task: "java", PID: 5201, UID: 1000, AnonRSSKB: 8123456},
			},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, assemble(t, tc.file)); diff != "" {
				t.Errorf("kills mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestAssemblerEdges(t *testing.T) {
	rec := func(sec float64, msg string) Record {
		return Record{Level: -1, Facility: -1, Monotonic: time.Duration(sec * float64(time.Second)), HasTime: true, Message: msg}
	}
	summary := func(pid string) string {
		return "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/kubepods/burstable/pod" + uid1 +
			",task_memcg=/kubepods/burstable/pod" + uid1 + "/" + cid1 + ",task=x,pid=" + pid + ",uid=0"
	}
	cases := map[string]struct {
		records []Record
		want    []OOMKill
	}{
		"a summary whose kill line was lost is flushed alone": {
			records: []Record{rec(1, summary("7"))},
			want: []OOMKill{{Scope: ScopeMemcg, Constraint: ConstraintMemcg, OOMMemcg: "/kubepods/burstable/pod" + uid1,
				TaskMemcg: "/kubepods/burstable/pod" + uid1 + "/" + cid1, Task: "x", PID: 7, UID: 0, Summary: true}},
		},
		"a second summary flushes the first": {
			records: []Record{rec(1, summary("7")), rec(2, summary("8")), rec(2.1, "Memory cgroup out of memory: Killed process 8 (x)")},
			want: []OOMKill{
				{Scope: ScopeMemcg, Constraint: ConstraintMemcg, OOMMemcg: "/kubepods/burstable/pod" + uid1,
					TaskMemcg: "/kubepods/burstable/pod" + uid1 + "/" + cid1, Task: "x", PID: 7, UID: 0, Summary: true},
				{Monotonic: 2100 * time.Millisecond, HasTime: true, Scope: ScopeMemcg, Constraint: ConstraintMemcg, OOMMemcg: "/kubepods/burstable/pod" + uid1,
					TaskMemcg: "/kubepods/burstable/pod" + uid1 + "/" + cid1, Task: "x", PID: 8, UID: 0, Summary: true},
			},
		},
		"a stale memory.oom.group context does not stick to a later lone kill": {
			records: []Record{
				rec(1, summary("7")),
				rec(1, "Memory cgroup out of memory: Killed process 7 (x)"),
				rec(1, "Tasks in /kubepods/burstable/pod"+uid1+"/"+cid1+" are going to be killed due to memory.oom.group set"),
				rec(5, "Memory cgroup out of memory: Killed process 9 (y)"),
			},
			want: []OOMKill{
				{Monotonic: time.Second, HasTime: true, Scope: ScopeMemcg, Constraint: ConstraintMemcg, OOMMemcg: "/kubepods/burstable/pod" + uid1,
					TaskMemcg: "/kubepods/burstable/pod" + uid1 + "/" + cid1, Task: "x", PID: 7, UID: 0, Summary: true},
				{Monotonic: 5 * time.Second, HasTime: true, Scope: ScopeMemcg, Task: "y", PID: 9, UID: -1},
			},
		},
		"a lone 'Task in' line without its kill line is flushed": {
			records: []Record{rec(1, "Task in /kubepods/pod"+uid1+"/"+cid1+" killed as a result of limit of /kubepods/pod"+uid1)},
			want: []OOMKill{{Scope: ScopeMemcg, Constraint: ConstraintMemcg, OOMMemcg: "/kubepods/pod" + uid1,
				TaskMemcg: "/kubepods/pod" + uid1 + "/" + cid1, UID: -1, Summary: true}},
		},
		"old global OOM: Kill process then Killed process of a sacrificed child": {
			records: []Record{
				rec(1, "java invoked oom-killer: gfp_mask=0x24201ca, order=0, oom_score_adj=0"),
				rec(1, "Out of memory: Kill process 100 (bash) score 900 or sacrifice child"),
				rec(1, "Killed process 101 (java) total-vm:100kB, anon-rss:50kB, file-rss:0kB"),
			},
			want: []OOMKill{{Monotonic: time.Second, HasTime: true, Scope: ScopeGlobal, Task: "java", PID: 101, UID: -1, AnonRSSKB: 50}},
		},
		"oom_reaper and unrelated lines make nothing": {
			records: []Record{rec(1, "oom_reaper: reaped process 7 (x), now anon-rss:0kB"), rec(2, "eth0: link up")},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var a Assembler
			var got []OOMKill
			for _, r := range tc.records {
				got = append(got, a.Add(r)...)
			}
			got = append(got, a.Flush()...)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("kills mismatch (-want +got):\n%s", diff)
			}
		})
	}
}
