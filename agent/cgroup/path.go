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
// the lab), so kubepods is found by name, not by position. With the systemd
// driver a cgroup root is a slice whose name prefixes every slice below it:
// kind's cgroupRoot "/kubelet" gives
//
//	/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-pod<uid_with_underscores>.slice/cri-containerd-<containerID>.scope
//
// so a kubepods slice is "kubepods.slice" or "<anything>-kubepods.slice", and
// the QoS and pod slices below it carry its name as their prefix.
//
// # Nested nodes
//
// The kernel prints cgroup paths from the root of its cgroup hierarchy (the
// init cgroup namespace), whatever the namespace of the process that reads
// them. A node that runs in a container (kind under Docker, an LXC
// container) has its runtime in a cgroup namespace rooted at the node
// container's cgroup, so the kernel prints a host prefix before every path
// the runtime knows:
//
//	/system.slice/docker-<nodeID>.scope/kubelet.slice/kubelet-kubepods.slice/...   (Docker, systemd driver)
//	/docker/<nodeID>/kubelet.slice/kubelet-kubepods.slice/...                      (Docker, cgroupfs driver, cgroup v1)
//	/lxc.payload.<name>/kubepods.slice/kubepods-burstable.slice/...                (LXC)
//
// ParsePath reads the Kubernetes levels from the last kubepods element on,
// so the prefix does not matter to it (and a node nested in a pod of another
// cluster, kind in a CI pod, is read at its own kubepods). HostPrefix learns
// the prefix from a kernel path of a cgroup whose runtime path is known, and
// WithPrefix puts it back in front of a runtime path; paths are compared on
// element boundaries, never as strings.
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
	// escaped as underscores, and the name of the slices above it (a cgroup
	// root's, "kubelet-", and kubepods's) as its prefix.
	podSystemd = regexp.MustCompile(`^(?:[^/]*-)?kubepods(?:-[a-z]+)?-pod([0-9a-fA-F][0-9a-fA-F_]{30,})\.slice$`)
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
	// The levels are read from the last kubepods element on: what comes
	// before it is a cgroup root or a nested node's host prefix, which may
	// hold a kubepods of its own (a node in a pod of another cluster).
	start := 0
	for i, e := range elems {
		if kubepodsSlice(e) != "" {
			start = i
		}
	}
	prefix := "/" + strings.Join(elems[:start], "/")
	if start == 0 {
		prefix = ""
	}
	base := "" // the kubepods slice's name without ".slice": the QoS slices' prefix
	inKubepods, afterPod := false, false
	for _, e := range elems[start:] {
		prefix = strings.TrimSuffix(prefix, "/") + "/" + e
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
		case !inKubepods && kubepodsSlice(e) != "":
			out.Kubepods = prefix
			base = kubepodsSlice(e)
			out.Systemd = strings.HasSuffix(e, ".slice")
			inKubepods = true
		case inKubepods && out.QoS == "":
			if q := qosOf(e, base); q != "" {
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

// kubepodsSlice returns the name of a kubepods element without ".slice":
// "kubepods" for "kubepods" (cgroupfs) and "kubepods.slice", "kubelet-kubepods"
// for "kubelet-kubepods.slice" (systemd under a cgroup root); "" for any other
// element.
func kubepodsSlice(e string) string {
	if e == "kubepods" {
		return e
	}
	name, ok := strings.CutSuffix(e, ".slice")
	if ok && (name == "kubepods" || (strings.HasSuffix(name, "-kubepods") && len(name) > len("-kubepods"))) {
		return name
	}
	return ""
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

// qosOf returns the QoS class of a QoS element below the kubepods element
// named base (see kubepodsSlice): "burstable" or "<base>-burstable.slice".
func qosOf(e, base string) string {
	for _, q := range []string{"burstable", "besteffort"} {
		if e == q || e == base+"-"+q+".slice" {
			return q
		}
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

// HostPrefix returns the host prefix a kernel path carries before a runtime
// path: kernelPath with runtimePath cut off its end, on element boundaries.
// It is "" when the two are the same cgroup (an ordinary node), e.g.
// "/system.slice/docker-<nodeID>.scope" for kind's
// "/system.slice/docker-<nodeID>.scope/kubelet.slice/.../cri-containerd-<id>.scope"
// and "/kubelet.slice/.../cri-containerd-<id>.scope". ok is false when
// kernelPath does not end with runtimePath, or runtimePath is the root (which
// says nothing about a prefix).
func HostPrefix(kernelPath, runtimePath string) (prefix string, ok bool) {
	k, r := path.Clean("/"+kernelPath), path.Clean("/"+runtimePath)
	switch {
	case r == "/":
		return "", false
	case k == r:
		return "", true
	case strings.HasSuffix(k, r):
		// r starts with "/", so the cut is on an element boundary: "/ax/y"
		// does not end with "/x/y".
		return k[:len(k)-len(r)], true
	}
	return "", false
}

// WithPrefix puts a host prefix (see HostPrefix) in front of a runtime path:
// the path of the same cgroup as the kernel prints it.
func WithPrefix(prefix, runtimePath string) string {
	return path.Clean("/" + prefix + "/" + runtimePath)
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
