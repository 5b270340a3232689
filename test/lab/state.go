package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"
)

// State is what Up started and created, written to _output/lab/state.json after every
// change so that Down removes exactly that, even after an Up that failed half-way.
type State struct {
	// Owner is the repository root of the lab that wrote the state.
	Owner string `json:"owner"`
	// Phase is "starting" until Up has finished, then "ready".
	Phase     string    `json:"phase"`
	StartedAt time.Time `json:"startedAt"`
	// Processes in start order; Down stops them newest first.
	Processes []Proc `json:"processes"`
	// Netns are the names of the nodes' network namespaces (/run/netns/NAME).
	Netns []string `json:"netns"`
	// Links are host network interfaces (the bridge and the host ends of the veths).
	Links []string `json:"links"`
	// Cgroups are directories created in every cgroup hierarchy, relative to its root.
	Cgroups []string `json:"cgroups"`
	// HostDirs are directories outside the lab's own that did not exist before Up and that
	// the kubelets, containerd or the CNI plugins make in fixed places
	// (/var/lib/kubelet/device-plugins, /var/log/containers, ...); Down removes what is
	// left of them when it holds no regular file.
	HostDirs []string `json:"hostDirs,omitempty"`
	// Sysctls are the kernel tunables the kubelet sets at start-up (vm/overcommit_memory,
	// kernel/panic, ...) with their values before the first kubelet started; Down puts them
	// back.
	Sysctls map[string]string `json:"sysctls,omitempty"`
	// SharedMounts are mount points Up made rshared (they were private); Down makes them
	// private again.
	SharedMounts []string `json:"sharedMounts,omitempty"`
	// Workloads are coroner's DaemonSets and Deployments from the overlay.
	Workloads []workload `json:"workloads,omitempty"`
	// Timings of Up's steps, for the record.
	Timings []Timing `json:"timings,omitempty"`

	mu   sync.Mutex
	path string
}

// Proc is a process the lab started. Its start time (field 22 of /proc/PID/stat) tells it
// apart from a later process that got the same PID.
type Proc struct {
	Name      string `json:"name"`
	PID       int    `json:"pid"`
	StartTime string `json:"startTime"`
	Log       string `json:"log"`
	// Node is the node the process belongs to, empty for the control plane.
	Node string `json:"node,omitempty"`
}

// Timing is how long one step of Up took.
type Timing struct {
	Step    string  `json:"step"`
	Seconds float64 `json:"seconds"`
}

const (
	phaseStarting = "starting"
	phaseReady    = "ready"
)

// loadState reads the state file; (nil, nil) when there is none.
func loadState(path string) (*State, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	s := &State{path: path}
	if err := json.Unmarshal(b, s); err != nil {
		return nil, fmt.Errorf("%s: %w (remove it after checking nothing of the lab runs)", path, err)
	}
	return s, nil
}

func newState(path, owner string) *State {
	return &State{path: path, Owner: owner, Phase: phaseStarting, StartedAt: time.Now().UTC().Truncate(time.Second)}
}

// update changes the state under its lock and writes it.
func (s *State) update(f func(*State)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s)
	return s.saveLocked()
}

func (s *State) saveLocked() error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(s.path), 0o755); err != nil {
		return err
	}
	tmp := s.path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, s.path)
}

// addProc records a process the lab started; it replaces the record of an earlier
// process of the same name (a kubelet restarted by `coronerctl chaos start-kubelet`).
func (s *State) addProc(p Proc) error {
	return s.update(func(s *State) {
		if i := slices.IndexFunc(s.Processes, func(o Proc) bool { return o.Name == p.Name }); i >= 0 {
			s.Processes[i] = p
			return
		}
		s.Processes = append(s.Processes, p)
	})
}

func (s *State) addNetns(name string) error {
	return s.update(func(s *State) {
		if !slices.Contains(s.Netns, name) {
			s.Netns = append(s.Netns, name)
		}
	})
}

func (s *State) addLink(name string) error {
	return s.update(func(s *State) {
		if !slices.Contains(s.Links, name) {
			s.Links = append(s.Links, name)
		}
	})
}

func (s *State) addCgroup(name string) error {
	return s.update(func(s *State) {
		if !slices.Contains(s.Cgroups, name) {
			s.Cgroups = append(s.Cgroups, name)
		}
	})
}

// procs returns a copy of the process list.
func (s *State) procs() []Proc {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.Processes)
}

// IsUp reports whether the lab is up and finished (`make lab` ran to its end, perhaps
// without the demo), with all its processes running.
func (c Config) IsUp(ctx context.Context) (bool, error) {
	st, err := loadState(c.statePath())
	if err != nil || st == nil || st.Phase != phaseReady {
		return false, err
	}
	return c.health(ctx, st) == nil, nil
}
