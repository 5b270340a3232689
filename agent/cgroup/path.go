// Package cgroup reads what a node knows about a container's memory from its
// cgroup: the OOM kill counters, the limit and the peak usage, on cgroup v1
// and v2 alike; and it takes cgroup paths apart into the Kubernetes levels
// they name (kubepods, QoS class, pod, container).
//
// The path functions are pure. The readers (Read, Detect) touch only the
// files of one cgroup directory under a root the caller names, so tests run
// them against fake trees in a temporary directory.
//
// # Path layouts
//
// The kubelet creates one cgroup per pod under a QoS class cgroup under the
// kubepods cgroup, and the runtime one cgroup per container under the pod's.
// With the cgroupfs driver (the lab's):
//
//	/<cgroupRoot>/kubepods/burstable/pod<uid>/<containerID>
//	/<cgroupRoot>/kubepods/besteffort/pod<uid>/<containerID>
//	/<cgroupRoot>/kubepods/pod<uid>/<containerID>              (Guaranteed)
//
// and with the systemd driver, where a "-" in a slice name means nesting so
// the pod UID's dashes become underscores:
//
//	/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_with_underscores>.slice/cri-containerd-<containerID>.scope
//	/kubepods.slice/kubepods-pod<uid_with_underscores>.slice/crio-<containerID>.scope (Guaranteed)
//
// <cgroupRoot> is the kubelet's --cgroup-root (empty by default; per node in
// the lab), so kubepods is found by name, not by position.
package cgroup

import (
	"errors"
	"fmt"
	"path"
	"regexp"
	"strings"
)

// Level is what a cgroup path stands for in the kubelet's hierarchy.
type Level int

const (
	// LevelOther is a cgroup outside kubepods, other than the root: the
	// kubelet's --cgroup-root, system.slice, a user slice, ...
	LevelOther Level = iota
	// LevelRoot is the root cgroup "/".
	LevelRoot
	// LevelKubepods is the kubepods cgroup itself, whose limit is the node's
	// allocatable memory for all pods.
	LevelKubepods
	// LevelQoS is a QoS class cgroup: burstable or besteffort (Guaranteed
	// pods sit directly under kubepods and have no QoS cgroup).
	LevelQoS
	// LevelPod is a pod's cgroup.
	LevelPod
	// LevelContainer is a container's cgroup (or a cgroup below one, for a
	// container that makes its own).
	LevelContainer
)

func (l Level) String() string {
	switch l {
	case LevelRoot:
		return "root"
	case LevelKubepods:
		return "kubepods"
	case LevelQoS:
		return "qos"
	case LevelPod:
		return "pod"
	case LevelContainer:
		return "container"
	default:
		return "other"
	}
}

// Path is a cgroup path taken apart. Every path field is a prefix of Path
// (the same spelling, with the same root prefix), or empty when the level is
// not in the path.
type Path struct {
	// Path is the cleaned path, always starting with "/".
	Path  string
	Level Level
	// Kubepods is the path of the kubepods cgroup, e.g. "/node-a/kubepods"
	// or "/kubepods.slice".
	Kubepods string
	// QoS is the QoS class cgroup's class, "burstable" or "besteffort", and
	// QoSPath its path. Both are empty for a Guaranteed pod.
	QoS     string
	QoSPath string
	// Pod is the path of the pod's cgroup and PodUID the pod's UID with
	// dashes (as in metadata.uid), whatever the driver's spelling.
	Pod    string
	PodUID string
	// Container is the path of the container's cgroup, ContainerID the
	// runtime's container ID in it (the 64 hex digits without a
	// "cri-containerd-", "crio-" or "docker-" prefix and ".scope" suffix when
	// the element has that shape, else the element as is).
	Container   string
	ContainerID string
	// Systemd reports the systemd driver's spelling (".slice" elements).
	Systemd bool
}

var (
	// podCgroupfs is a pod element of the cgroupfs driver: "pod" and the
	// UID. Static pods have a 32-hex-digit hash for UID, other pods a UUID.
	podCgroupfs = regexp.MustCompile(`^pod([0-9a-fA-F][0-9a-fA-F-]{30,})$`)
	// podSystemd is a pod slice of the systemd driver, with the UID's dashes
	// escaped as underscores.
	podSystemd = regexp.MustCompile(`^kubepods(?:-[a-z]+)?-pod([0-9a-fA-F][0-9a-fA-F_]{30,})\.slice$`)
	// containerScope is a container element with a runtime prefix or suffix
	// around a 64-hex-digit ID: "<id>", "cri-containerd-<id>.scope",
	// "crio-<id>.scope", "docker-<id>.scope", "crio-conmon-<id>.scope".
	containerScope = regexp.MustCompile(`^(?:[a-z][a-z-]*-)?([0-9a-f]{64})(?:\.scope)?$`)
)

// ParsePath takes a cgroup path apart, either driver's spelling. It never
// fails: a path it does not recognise is LevelOther (or LevelRoot for "/").
// A path without a leading "/" is read as if it had one.
func ParsePath(p string) Path {
	clean := path.Clean("/" + p)
	out := Path{Path: clean}
	if clean == "/" {
		out.Level = LevelRoot
		return out
	}
	elems := strings.Split(clean[1:], "/")
	prefix := ""
	inKubepods, afterPod := false, false
	for _, e := range elems {
		prefix += "/" + e
		switch {
		case afterPod:
			if out.Container == "" {
				out.Container = prefix
				out.ContainerID = containerIDOf(e)
			}
		case isPodElement(e):
			uid, systemd := podUIDOf(e)
			out.Pod, out.PodUID = prefix, uid
			out.Systemd = out.Systemd || systemd
			afterPod = true
		case !inKubepods && (e == "kubepods" || e == "kubepods.slice"):
			out.Kubepods = prefix
			out.Systemd = e == "kubepods.slice"
			inKubepods = true
		case inKubepods && out.QoS == "":
			if q := qosOf(e); q != "" {
				out.QoS, out.QoSPath = q, prefix
			}
		}
	}
	switch {
	case out.Container != "":
		out.Level = LevelContainer
	case out.Pod != "":
		out.Level = LevelPod
	case out.QoSPath == clean:
		out.Level = LevelQoS
	case out.Kubepods == clean:
		out.Level = LevelKubepods
	default:
		out.Level = LevelOther
	}
	return out
}

func isPodElement(e string) bool {
	return podCgroupfs.MatchString(e) || podSystemd.MatchString(e)
}

func podUIDOf(e string) (uid string, systemd bool) {
	if m := podCgroupfs.FindStringSubmatch(e); m != nil {
		return m[1], false
	}
	m := podSystemd.FindStringSubmatch(e)
	return strings.ReplaceAll(m[1], "_", "-"), true
}

func qosOf(e string) string {
	switch e {
	case "burstable", "kubepods-burstable.slice":
		return "burstable"
	case "besteffort", "kubepods-besteffort.slice":
		return "besteffort"
	}
	return ""
}

func containerIDOf(e string) string {
	if m := containerScope.FindStringSubmatch(e); m != nil {
		return m[1]
	}
	return e
}

// PodUIDFromPath returns the UID of the pod whose cgroup p is, or is inside
// of, in metadata.uid spelling (dashes); ok is false when p names no pod.
func PodUIDFromPath(p string) (uid string, ok bool) {
	pp := ParsePath(p)
	return pp.PodUID, pp.PodUID != ""
}

// ContainerIDFromPath returns the container ID of the container cgroup p is,
// or is inside of; ok is false when p is not below a pod cgroup.
func ContainerIDFromPath(p string) (id string, ok bool) {
	pp := ParsePath(p)
	return pp.ContainerID, pp.ContainerID != ""
}

// Within reports whether cgroup p is ancestor or ancestor's descendant:
// equal to it or below it. Both are cleaned first; "/" contains everything.
func Within(p, ancestor string) bool {
	p, ancestor = path.Clean("/"+p), path.Clean("/"+ancestor)
	if ancestor == "/" || p == ancestor {
		return true
	}
	return strings.HasPrefix(p, ancestor+"/")
}

// SameUID compares two pod UIDs, ignoring case and the systemd driver's
// underscores.
func SameUID(a, b string) bool {
	norm := func(s string) string { return strings.ToLower(strings.ReplaceAll(s, "_", "-")) }
	return a != "" && norm(a) == norm(b)
}

// FromSystemd turns the "slice:prefix:name" form of a container's
// cgroupsPath in an OCI spec written for the systemd driver (as containerd and
// CRI-O write it: "kubepods-burstable-pod<uid>.slice:cri-containerd:<id>")
// into the cgroup path the kernel prints:
// "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope".
// A path that already starts with "/" is returned cleaned.
func FromSystemd(cgroupsPath string) (string, error) {
	if strings.HasPrefix(cgroupsPath, "/") {
		return path.Clean(cgroupsPath), nil
	}
	parts := strings.Split(cgroupsPath, ":")
	if len(parts) != 3 || parts[2] == "" {
		return "", fmt.Errorf("cgroup: %q is not a systemd cgroupsPath (slice:prefix:name)", cgroupsPath)
	}
	slice, prefix, name := parts[0], parts[1], parts[2]
	dir, err := expandSlice(slice)
	if err != nil {
		return "", err
	}
	unit := name
	if !strings.HasSuffix(name, ".slice") {
		if prefix != "" {
			unit = prefix + "-" + name
		}
		unit += ".scope"
	}
	return path.Join(dir, unit), nil
}

// expandSlice turns a systemd slice name into its path: "a-b-c.slice" is
// "/a.slice/a-b.slice/a-b-c.slice", "-.slice" and "" the root.
func expandSlice(slice string) (string, error) {
	if slice == "" || slice == "-.slice" {
		return "/", nil
	}
	name, ok := strings.CutSuffix(slice, ".slice")
	if !ok || name == "" || strings.Contains(name, "/") {
		return "", fmt.Errorf("cgroup: %q is not a systemd slice name", slice)
	}
	parts := strings.Split(name, "-")
	for _, p := range parts {
		if p == "" {
			return "", errors.New("cgroup: slice name " + slice + " has an empty component")
		}
	}
	var b strings.Builder
	for i := range parts {
		b.WriteString("/" + strings.Join(parts[:i+1], "-") + ".slice")
	}
	return b.String(), nil
}
