package cgroup

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// tree writes files (path relative to root -> content) under a new temporary
// root and returns the root.
func tree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for name, content := range files {
		p := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

const containerPath = "/node-a/kubepods/burstable/pod" + uid + "/" + cid

// v1Container is a v1 memory cgroup of a container OOM-killed at its 20Mi
// limit, as the lab shows it (cgroup v1 hybrid, per-node cgroup root).
var v1Container = map[string]string{
	"memory" + containerPath + "/memory.oom_control":        "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
	"memory" + containerPath + "/memory.failcnt":            "2315\n",
	"memory" + containerPath + "/memory.limit_in_bytes":     "20971520\n",
	"memory" + containerPath + "/memory.usage_in_bytes":     "20963328\n",
	"memory" + containerPath + "/memory.max_usage_in_bytes": "20971520\n",
	// The hybrid host's unified tree has the path but no memory files.
	"unified" + containerPath + "/cgroup.procs": "",
}

var v2Container = map[string]string{
	containerPath + "/memory.events":  "low 0\nhigh 0\nmax 118\noom 1\noom_kill 1\noom_group_kill 1\n",
	containerPath + "/memory.max":     "20971520\n",
	containerPath + "/memory.current": "0\n",
	containerPath + "/memory.peak":    "20971520\n",
}

func TestRead(t *testing.T) {
	cases := map[string]struct {
		files   map[string]string
		root    string // relative to the tree; default the tree itself
		path    string
		want    Memory
		wantDir string // relative to the tree
		wantErr error  // matched with errors.Is; nil: no error
		anyErr  bool
	}{
		"v1 container OOM-killed at its limit": {
			files:   v1Container,
			path:    containerPath,
			wantDir: "memory" + containerPath,
			want: Memory{Version: V1, Limit: 20971520, Usage: 20963328, Peak: 20971520,
				OOMKill: 1, HasOOMKill: true, FailCnt: 2315},
		},
		"v1 with the root at the memory hierarchy": {
			files:   v1Container,
			root:    "memory",
			path:    containerPath,
			wantDir: "memory" + containerPath,
			want: Memory{Version: V1, Limit: 20971520, Usage: 20963328, Peak: 20971520,
				OOMKill: 1, HasOOMKill: true, FailCnt: 2315},
		},
		"v1 unlimited, under OOM, old kernel without oom_kill": {
			files: map[string]string{
				"memory/kubepods/besteffort/memory.oom_control":        "oom_kill_disable 0\nunder_oom 1\n",
				"memory/kubepods/besteffort/memory.limit_in_bytes":     "9223372036854771712\n",
				"memory/kubepods/besteffort/memory.usage_in_bytes":     "1048576\n",
				"memory/kubepods/besteffort/memory.max_usage_in_bytes": "1048576\n",
				"memory/kubepods/besteffort/memory.failcnt":            "0\n",
			},
			path:    "/kubepods/besteffort",
			wantDir: "memory/kubepods/besteffort",
			want:    Memory{Version: V1, Usage: 1048576, Peak: 1048576, UnderOOM: true},
		},
		// The kernel's rmdir removes the controller's files before the directory: a read
		// in between finds oom_kill 1 and then no failcnt (constructed: the window is
		// short). It used to read as failcnt 0, peak 0: "the limit was never reached".
		"v1 being removed: failcnt and the rest gone, the directory still there": {
			files: map[string]string{
				"memory" + containerPath + "/memory.oom_control":    "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
				"memory" + containerPath + "/memory.limit_in_bytes": "20971520\n",
			},
			path:    containerPath,
			wantErr: fs.ErrNotExist,
		},
		"v2 being removed: memory.current gone": {
			files: map[string]string{
				containerPath + "/memory.events": "low 0\nhigh 0\nmax 118\noom 1\noom_kill 1\n",
				containerPath + "/memory.max":    "20971520\n",
			},
			path:    containerPath,
			wantErr: fs.ErrNotExist,
		},
		"v2 container with an oom.group kill": {
			files:   v2Container,
			path:    containerPath,
			wantDir: containerPath[1:],
			want: Memory{Version: V2, Limit: 20971520, Peak: 20971520,
				OOMKill: 1, HasOOMKill: true, OOM: 1, Max: 118, OOMGroupKill: 1},
		},
		"v2 unlimited pod killed from above, kernel without memory.peak": {
			files: map[string]string{
				"kubepods.slice/x.slice/memory.events":  "low 0\nhigh 0\nmax 0\noom 0\noom_kill 3\n",
				"kubepods.slice/x.slice/memory.max":     "max\n",
				"kubepods.slice/x.slice/memory.current": "4096\n",
			},
			path:    "/kubepods.slice/x.slice",
			wantDir: "kubepods.slice/x.slice",
			want:    Memory{Version: V2, Usage: 4096, OOMKill: 3, HasOOMKill: true},
		},
		"gone cgroup is ErrNotExist": {
			files:   v2Container,
			path:    "/kubepods/burstable/pod" + uid + "/other",
			wantErr: fs.ErrNotExist,
		},
		"v2 directory without the memory controller": {
			files:   map[string]string{"kubepods/cgroup.procs": ""},
			path:    "/kubepods",
			wantErr: ErrNoMemoryController,
		},
		"malformed memory.events is an error": {
			files:  map[string]string{"c/memory.events": "oom_kill one\n"},
			path:   "/c",
			anyErr: true,
		},
		"malformed line without a value is an error": {
			files:  map[string]string{"c/memory.events": "oom_kill\n"},
			path:   "/c",
			anyErr: true,
		},
		"malformed memory.max is an error": {
			files:  map[string]string{"c/memory.events": "oom 0\n", "c/memory.max": "lots\n"},
			path:   "/c",
			anyErr: true,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			base := tree(t, tc.files)
			root := filepath.Join(base, filepath.FromSlash(tc.root))
			got, err := Read(root, tc.path)
			switch {
			case tc.wantErr != nil:
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("Read() error = %v, want %v", err, tc.wantErr)
				}
				return
			case tc.anyErr:
				if err == nil {
					t.Fatalf("Read() = %+v, want an error", got)
				}
				return
			case err != nil:
				t.Fatalf("Read() error = %v", err)
			}
			if want := filepath.Join(base, filepath.FromSlash(tc.wantDir)); got.Dir != want {
				t.Errorf("Read().Dir = %q, want %q", got.Dir, want)
			}
			if diff := cmp.Diff(tc.want, got, cmpopts.IgnoreFields(Memory{}, "Dir")); diff != "" {
				t.Errorf("Read() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPageCache(t *testing.T) {
	// Shapes of memory.stat as Linux 6.x prints them (v1: cache and total_cache, the
	// latter hierarchical; v2: file), values made up.
	cases := map[string]struct {
		v       Version
		stat    string
		want    int64
		wantErr bool
	}{
		"v1 takes total_cache, not the cgroup's own cache": {
			v: V1, stat: "cache 4096\nrss 8192\ntotal_cache 1048576\ntotal_rss 2097152\n", want: 1048576},
		"v2 takes file":        {v: V2, stat: "anon 2097152\nfile 524288\nkernel 65536\n", want: 524288},
		"v2 without file is 0": {v: V2, stat: "anon 1\n", want: 0},
		"garbage is an error":  {v: V2, stat: "file lots\n", wantErr: true},
		"no memory.stat":       {v: V1, wantErr: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.stat != "" {
				if err := os.WriteFile(filepath.Join(dir, "memory.stat"), []byte(tc.stat), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, err := PageCache(tc.v, dir)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("PageCache = %d, %v; want %d, error %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestSub(t *testing.T) {
	cases := map[string]struct {
		before, after Memory
		want          Delta
	}{
		"since creation": {
			after: Memory{Version: V2, OOMKill: 2, HasOOMKill: true, OOM: 1, Max: 10},
			want:  Delta{Version: V2, OOMKill: 2, HasOOMKill: true, OOM: 1, Max: 10},
		},
		"between two readings": {
			before: Memory{Version: V1, OOMKill: 1, HasOOMKill: true, FailCnt: 100},
			after:  Memory{Version: V1, OOMKill: 3, HasOOMKill: true, FailCnt: 150},
			want:   Delta{Version: V1, OOMKill: 2, HasOOMKill: true, FailCnt: 50},
		},
		"counter went down: the cgroup was re-created": {
			before: Memory{Version: V2, OOMKill: 5, OOM: 5, HasOOMKill: true},
			after:  Memory{Version: V2, OOMKill: 1, OOM: 0, HasOOMKill: true},
			want:   Delta{Version: V2, OOMKill: 1, HasOOMKill: true},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, Sub(tc.before, tc.after)); diff != "" {
				t.Errorf("Sub() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}
