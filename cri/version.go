package cri

import (
	"fmt"
	"strconv"
	"strings"
)

// streamVerdict says whether a runtime's CRI GetContainerEvents stream may be subscribed
// to, from the name and version CRI Version reports; why says why not.
//
// containerd before 2.0 is never subscribed to. Its CRI plugin (v1.7.x,
// pkg/cri/server/container_events.go and pkg/cri/sbserver/container_events.go, still so
// in v1.7.34) has one event channel of 1000 for every caller of GetContainerEvents, with a
// TODO to broadcast it (containerd issue 7318): a second subscriber takes events away
// from the kubelet's evented PLEG, and the channel, filled whether anyone listens or not,
// hands a new subscriber up to 1000 stale events from before it subscribed. 1.6 answers
// Unimplemented anyway. There the watcher relists, and containerd's own event service
// (per-subscriber queues) brings the exits quickly. A version that cannot be read (a
// build from a commit, a distribution's odd string) counts as before 2.0: relisting
// costs latency only, while subscribing to a 1.7 would harm the kubelet.
//
// Every other runtime (containerd 2.x: internal/eventq broadcasts to each subscriber;
// CRI-O) is subscribed to; one that ends the stream at once is handled by the watcher.
func streamVerdict(name, version string) (ok bool, why string) {
	if name != "containerd" {
		return true, ""
	}
	major, ok := majorVersion(version)
	switch {
	case !ok:
		return false, fmt.Sprintf("containerd version %q not understood, taken for one before 2.0 whose GetContainerEvents channel is shared with the kubelet", version)
	case major < 2:
		return false, fmt.Sprintf("containerd %s shares one GetContainerEvents channel between all subscribers (the kubelet's among them) before 2.0", version)
	}
	return true, ""
}

// majorVersion reads the major number of versions such as "v1.7.13", "1.6.20~ds1",
// "v2.4.2", "1.7.23-k3s2" or "2.0.0-rc.1": an optional v, digits, then a dot.
func majorVersion(v string) (int, bool) {
	v = strings.TrimPrefix(strings.TrimSpace(v), "v")
	num, rest, found := strings.Cut(v, ".")
	if !found || num == "" || rest == "" || rest[0] < '0' || rest[0] > '9' {
		return 0, false
	}
	major, err := strconv.Atoi(num)
	if err != nil || major < 0 {
		return 0, false
	}
	return major, true
}
