package nvidia

import (
	"strings"
	"testing"
)

// FuzzParseXid: ParseXid never panics, and what it returns holds together.
// The seed corpus is the real reports of xid_test.go.
func FuzzParseXid(f *testing.F) {
	for _, tc := range realXids {
		f.Add(tc.line)
	}
	f.Add("NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:02): 13, pid=9, name=a, Graphics Exception")
	f.Add("NVRM: GPU at PCI:0000:a1:00: GPU-979426f2-893a-7cbb-c4cf-81472f89a462")
	f.Fuzz(func(t *testing.T, line string) {
		x, ok, err := ParseXid(line)
		if ok && err != nil {
			t.Fatalf("ok with error %v", err)
		}
		if !strings.Contains(line, xidMarker) {
			if ok || err != nil {
				t.Fatalf("no marker, yet ok %v, err %v", ok, err)
			}
			return
		}
		if !ok {
			if err == nil {
				t.Fatal("a marker, neither an Xid nor an error")
			}
			return
		}
		if x.Code < 0 || x.PID < 0 || x.GPUInstance < -1 || x.ComputeInstance < -1 {
			t.Fatalf("negative field in %+v", x)
		}
		again, err := ParseAddress(x.Address.String())
		if err != nil || again != x.Address {
			t.Fatalf("address %s does not parse back: %v, %v", x.Address, again, err)
		}
		if !strings.Contains(line, x.Message) || !strings.Contains(line, x.Process) {
			t.Fatalf("message %q or process %q not in the line", x.Message, x.Process)
		}
	})
}

// FuzzParseInformation: ParseInformation never panics, and an address it
// returns is normalized.
func FuzzParseInformation(f *testing.F) {
	for _, name := range []string{"information-h100-535.txt", "information-gtx650-2017.txt", "information-constructed-tabs.txt", "information-constructed-excluded-old.txt"} {
		f.Add(readTestdata(f, name))
	}
	f.Fuzz(func(t *testing.T, text string) {
		info, err := ParseInformation(text)
		if err != nil {
			return
		}
		if again, err := ParseAddress(info.Address.String()); err != nil || again != info.Address {
			t.Fatalf("address %s does not parse back: %v, %v", info.Address, again, err)
		}
		if info.UUID != "" && !strings.HasPrefix(info.UUID, "GPU-") {
			t.Fatalf("UUID %q", info.UUID)
		}
	})
}
