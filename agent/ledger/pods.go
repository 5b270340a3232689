package ledger

// The runtime's word on pods: the states of their containers, by the UID the runtime
// knows the pod by, for the pod-level decision (classify.StampsForPod's observed).

import (
	"k8s.io/apimachinery/pkg/types"

	"github.com/coroner-dev/coroner/agent/classify"
)

// Observed returns the runtime's states of the containers of the pods with uids (a
// static pod's: by its config hash and by its mirror pod's UID), the latest attempt of
// each container name.
func (l *Ledger) Observed(uids ...types.UID) []classify.ContainerState {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []classify.ContainerState
	for _, uid := range uids {
		for _, s := range l.observed[uid] {
			out = append(out, s.state)
		}
	}
	return out
}

// Forget forgets the runtime's states and the device evidence of deleted pods.
func (l *Ledger) Forget(uids ...types.UID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, uid := range uids {
		delete(l.observed, uid)
		l.forgetDevicesLocked(uid)
	}
}
