package nvidia

import (
	"fmt"
	"strconv"
	"strings"
)

// Address is a PCI address, domain:bus:device.function.
//
// Its String form is the one the Linux kernel uses in sysfs and the NVIDIA
// driver uses for /proc/driver/nvidia/gpus/<address>: at least four
// lower-case hex digits of domain, two of bus, two of device, one of
// function ("0000:3b:00.0"). ParseAddress accepts the other spellings in use
// and normalizes them to that form:
//
//   - upper-case hex ("0000:3B:00.0");
//   - nvidia-smi's eight-digit domain ("00000000:3b:00.0");
//   - no function, as in the driver's Xid reports ("0000:3b:00"): function 0,
//     the GPU's own function (a GPU board's other functions, audio and USB,
//     are not driven by the nvidia module);
//   - a dot between bus and device ("0000:3b.00.0"), which older drivers
//     printed in the information file's "Bus Location".
type Address struct {
	Domain   uint32
	Bus      uint8
	Device   uint8
	Function uint8
}

// String is the normalized form, "0000:3b:00.0".
func (a Address) String() string {
	return fmt.Sprintf("%04x:%02x:%02x.%x", a.Domain, a.Bus, a.Device, a.Function)
}

// ParseAddress parses and normalizes a PCI address (see Address).
func ParseAddress(s string) (Address, error) {
	bad := func(why string) (Address, error) {
		return Address{}, fmt.Errorf("PCI address %q: %s", truncate(s), why)
	}
	domain, rest, ok := strings.Cut(s, ":")
	if !ok {
		return bad("want domain:bus:device[.function]")
	}
	// The bus and device are separated by ':' (or '.' in old information
	// files), the device and function by '.'.
	var bus, device, function string
	if b, d, ok := strings.Cut(rest, ":"); ok {
		var hasFunction bool
		bus = b
		device, function, hasFunction = strings.Cut(d, ".")
		if hasFunction && function == "" {
			return bad("empty function")
		}
	} else {
		parts := strings.Split(rest, ".")
		if len(parts) != 3 {
			return bad("want domain:bus:device[.function]")
		}
		bus, device, function = parts[0], parts[1], parts[2]
	}
	var a Address
	d, err := parseHex(domain, 4, 8, 32)
	if err != nil {
		return bad("domain: " + err.Error())
	}
	a.Domain = uint32(d)
	b, err := parseHex(bus, 2, 2, 8)
	if err != nil {
		return bad("bus: " + err.Error())
	}
	a.Bus = uint8(b)
	dev, err := parseHex(device, 2, 2, 5)
	if err != nil {
		return bad("device: " + err.Error())
	}
	a.Device = uint8(dev)
	if function != "" {
		f, err := parseHex(function, 1, 1, 3)
		if err != nil {
			return bad("function: " + err.Error())
		}
		a.Function = uint8(f)
	}
	return a, nil
}

// parseHex parses minLen to maxLen hex digits into a value of bits bits
// (a PCI device number has 5 bits, a function 3).
func parseHex(s string, minLen, maxLen, bits int) (uint64, error) {
	if len(s) < minLen || len(s) > maxLen {
		return 0, fmt.Errorf("%q is not %d to %d hex digits", s, minLen, maxLen)
	}
	for i := 0; i < len(s); i++ {
		if !isHex(s[i]) {
			return 0, fmt.Errorf("%q is not hex", s)
		}
	}
	v, err := strconv.ParseUint(s, 16, bits)
	if err != nil {
		return 0, fmt.Errorf("%q is out of range", s)
	}
	return v, nil
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func truncate(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}
