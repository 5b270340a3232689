package agent

// Following the runtime: its metrics, the garbage collection of what is kept about
// containers that are gone, and facts about the runtime and the PID namespace the agent
// runs in.

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/coroner-dev/coroner/cri"
)

// watchRuntime keeps the runtime metrics current, once a second.
func (a *Agent) watchRuntime(ctx context.Context) {
	type statser interface{ Stats() cri.Stats }
	var lastIgnored uint64
	// The first look is not reported when disconnected: the watcher has barely started.
	wasConnected, first := true, true
	tick := a.clock.NewTicker(time.Second)
	defer tick.Stop()
	for {
		connected := a.cfg.Source.Connected()
		a.metrics.SetRuntimeConnected(connected)
		if s, ok := a.cfg.Source.(statser); ok {
			st := s.Stats()
			if st.IgnoredContainers > lastIgnored {
				a.metrics.AddIgnored(st.IgnoredContainers - lastIgnored)
			}
			lastIgnored = st.IgnoredContainers
		}
		if connected != wasConnected && (!first || connected) {
			if connected {
				a.logger.Info("The container runtime answers")
			} else {
				a.logger.Info("The container runtime is not reachable; /readyz fails until it is", "reason", RuntimeHealth(a.cfg.Source))
			}
			wasConnected = connected
		}
		first = false
		select {
		case <-ctx.Done():
			return
		case <-tick.C():
		}
	}
}

// collectGarbage forgets finished containers and old tombstones, once a minute.
func (a *Agent) collectGarbage(ctx context.Context) {
	tick := a.clock.NewTicker(time.Minute)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C():
		}
		a.gc(a.clock.Now())
	}
}

// How long finished containers and tombstones are remembered: long enough for a late OOM
// event, a relist after a runtime restart, and a watch far behind.
const (
	containerTTL = 5 * time.Minute
	goneTTL      = 10 * time.Minute
)

// gc forgets what is kept about containers that are gone (containerTable.gc) and old
// tombstones.
func (a *Agent) gc(now time.Time) {
	a.table.gc(now, func(uid types.UID) bool { return a.podByUID(uid) != nil })
	a.mu.Lock()
	defer a.mu.Unlock()
	for uid, g := range a.gone {
		if now.Sub(g.at) > goneTTL {
			delete(a.gone, uid)
		}
	}
}

// runtimeScheme is the scheme of the runtime's container IDs as the kubelet writes them
// (the CRI runtime name: "containerd", "cri-o"), from the Source's Stats when it has
// them; "" when not known.
func runtimeScheme(src cri.Source) string {
	s, ok := src.(interface{ Stats() cri.Stats })
	if !ok {
		return ""
	}
	name, _, _ := strings.Cut(s.Stats().Runtime, " ")
	return strings.ToLower(strings.TrimSpace(name))
}

// initPIDNamespace reports whether this process is in the init PID namespace: the
// inode of /proc/self/ns/pid ("pid:[4026531836]") is PROC_PID_INIT_INO.
func initPIDNamespace() (bool, error) {
	link, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return false, err
	}
	return link == fmt.Sprintf("pid:[%d]", uint32(0xEFFFFFFC)), nil
}
