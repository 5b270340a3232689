package nvidia

import (
	"fmt"
	"strconv"
	"strings"
)

// Xid is one Xid report of the NVIDIA driver: an error it saw on a GPU,
// numbered in NVIDIA's Xid catalog.
//
// The driver prints it to the kernel log (open-gpu-kernel-modules,
// src/nvidia/src/kernel/gpu/rc/kernel_rc.c, krcReportXid) as
//
//	NVRM: Xid (PCI:%04x:%02x:%02x): %d, pid=%s, name=%s, <message>
//
// with pid '<unknown>' and name <unknown> when no process is attributed, and
// on a MIG-partitioned GPU " GPU-I:%02u" (and " GPU-CI:%02u") inside the
// parenthesis. Older drivers print no "name=", or neither "pid=" nor
// "name=", and the oldest no "PCI:" either: "NVRM: Xid (0000:01:00): 13, ...".
type Xid struct {
	// Address is the GPU's PCI address, normalized (see Address). The driver
	// prints no function; it is 0, the GPU's own.
	Address Address
	// GPUInstance and ComputeInstance are the MIG GPU instance and compute
	// instance the driver attributed the error to, -1 when it named none.
	GPUInstance     int
	ComputeInstance int
	// Code is the Xid number.
	Code int
	// PID is the process the driver attributed the error to, 0 when the
	// line names none or says '<unknown>'.
	PID int
	// Process is that process's name, "" when the line names none or says
	// <unknown>.
	Process string
	// Message is the rest of the line, the driver's description of the
	// error (with its channel, "Ch 00000008", when it has one).
	Message string
}

// xidMarker starts every Xid report.
const xidMarker = "NVRM: Xid ("

// unknown is the driver's word for a process it cannot name.
const unknown = "<unknown>"

// ParseXid reads an Xid report from a kernel log message (kmsg.Record's
// Message). The report may follow a prefix, so that syslog and journal lines
// ("... kernel: NVRM: Xid (...") are understood too.
//
// A message without "NVRM: Xid (" is not an Xid report: ok is false and err
// nil; that includes the driver's other NVRM lines. A message with it whose
// address, Xid number or pid cannot be read is a malformed report: err says
// what is wrong.
func ParseXid(message string) (x Xid, ok bool, err error) {
	i := strings.Index(message, xidMarker)
	if i < 0 {
		return Xid{}, false, nil
	}
	line := message[i:]
	bad := func(format string, args ...any) (Xid, bool, error) {
		return Xid{}, false, fmt.Errorf("nvidia: malformed Xid report %q: %s", truncate(line), fmt.Sprintf(format, args...))
	}
	rest := line[len(xidMarker):]

	// The parenthesis: the address, then the MIG attribution if any.
	inner, rest, found := strings.Cut(rest, ")")
	if !found {
		return bad("no ')' after the address")
	}
	x.GPUInstance, x.ComputeInstance = -1, -1
	fields := strings.Fields(inner)
	if len(fields) == 0 {
		return bad("no address")
	}
	x.Address, err = ParseAddress(strings.TrimPrefix(fields[0], "PCI:"))
	if err != nil {
		return bad("%v", err)
	}
	for _, f := range fields[1:] {
		key, val, _ := strings.Cut(f, ":")
		n, err := strconv.ParseUint(val, 10, 16)
		if err != nil {
			return bad("MIG attribution %q is not KEY:number", f)
		}
		switch key {
		case "GPU-I":
			x.GPUInstance = int(n)
		case "GPU-CI":
			x.ComputeInstance = int(n)
		default:
			return bad("unknown attribution %q", f)
		}
	}

	// ": <code>," then the rest.
	rest, found = strings.CutPrefix(rest, ":")
	if !found {
		return bad("no ':' after the parenthesis")
	}
	rest = strings.TrimLeft(rest, " ")
	digits := 0
	for digits < len(rest) && '0' <= rest[digits] && rest[digits] <= '9' {
		digits++
	}
	if digits == 0 {
		return bad("no Xid number")
	}
	code, err := strconv.ParseUint(rest[:digits], 10, 31)
	if err != nil {
		return bad("Xid number %q is out of range", rest[:digits])
	}
	x.Code = int(code)
	rest = rest[digits:]
	if rest != "" {
		if rest, found = strings.CutPrefix(rest, ","); !found {
			return bad("no ',' after the Xid number")
		}
		rest = strings.TrimLeft(rest, " ")
	}

	// "pid=<n>|'<unknown>', " and "name=<name>, ", each optional.
	if after, found := strings.CutPrefix(rest, "pid="); found {
		val, tail, _ := strings.Cut(after, ",")
		val = strings.TrimSpace(val)
		switch val {
		case "'" + unknown + "'", unknown:
		default:
			pid, err := strconv.ParseUint(val, 10, 31)
			if err != nil {
				return bad("pid %q is neither a number nor '<unknown>'", val)
			}
			x.PID = int(pid)
		}
		rest = strings.TrimLeft(tail, " ")
	}
	if after, found := strings.CutPrefix(rest, "name="); found {
		// The name ends at the first ", ": a process name with ", " in it
		// is cut there, the rest going to Message.
		name, tail, found := strings.Cut(after, ", ")
		if !found {
			name = strings.TrimSuffix(strings.TrimSpace(name), ",")
		}
		if name != unknown {
			x.Process = name
		}
		rest = tail
	}
	x.Message = strings.TrimRight(rest, " \t\r\n")
	return x, true, nil
}
