package agent

// Following the runtime: its connection and metrics, and facts about the runtime and the
// PID namespace the agent runs in.

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

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
