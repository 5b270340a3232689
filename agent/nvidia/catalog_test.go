package nvidia

import (
	"slices"
	"testing"
)

func TestClassify(t *testing.T) {
	cases := map[string]struct {
		code int
		want Blame
	}{
		// The device plugin's ignore list (internal/rm/health.go).
		"13 graphics engine exception": {13, BlameApplication},
		"31 page fault":                {31, BlameApplication},
		"43 stopped processing":        {43, BlameApplication},
		"45 preemptive cleanup":        {45, BlameApplication},
		"68 video processor":           {68, BlameApplication},
		"109 context switch timeout":   {109, BlameApplication},
		// Hardware Xids.
		"48 double-bit ECC":   {48, BlameDevice},
		"62 PMU halt":         {62, BlameDevice},
		"63 row remapping":    {63, BlameDevice},
		"64 remap failure":    {64, BlameDevice},
		"74 NVLink":           {74, BlameDevice},
		"79 off the bus":      {79, BlameDevice},
		"92 SBE rate":         {92, BlameDevice},
		"94 contained ECC":    {94, BlameDevice},
		"95 uncontained ECC":  {95, BlameDevice},
		"119 GSP RPC timeout": {119, BlameDevice},
		"120 GSP error":       {120, BlameDevice},
		"154 recovery action": {154, BlameDevice},
		// Not in the catalog: the device plugin's rule, every Xid not ignored.
		"8, not in the table":         {8, BlameDevice},
		"999, newer than the table":   {999, BlameDevice},
		"0, which no driver reports":  {0, BlameDevice},
		"32, application-ish but not": {32, BlameDevice},
	}
	for name, tc := range cases {
		if got := Classify(tc.code); got != tc.want {
			t.Errorf("%s: Classify(%d) = %s, want %s", name, tc.code, got, tc.want)
		}
		if got := (Xid{Code: tc.code}).DeviceFault(); got != (tc.want == BlameDevice) {
			t.Errorf("%s: DeviceFault = %v", name, got)
		}
	}
}

// TestClassifyRealLines classifies the real reports of xid_test.go.
func TestClassifyRealLines(t *testing.T) {
	device := map[int]bool{48: true, 62: true, 63: true, 79: true, 94: true, 95: true, 119: true, 32: true}
	for _, tc := range realXids {
		x, ok, err := ParseXid(tc.line)
		if !ok || err != nil {
			t.Fatalf("%s: ParseXid: %v", tc.name, err)
		}
		if x.DeviceFault() != device[x.Code] {
			t.Errorf("%s: DeviceFault = %v, want %v", tc.name, x.DeviceFault(), device[x.Code])
		}
	}
}

func TestCatalog(t *testing.T) {
	c := Catalog()
	if !slices.IsSortedFunc(c, func(a, b CatalogEntry) int { return a.Code - b.Code }) {
		t.Fatal("catalog not sorted by code")
	}
	for i, e := range c {
		if i > 0 && c[i-1].Code == e.Code {
			t.Errorf("Xid %d twice", e.Code)
		}
		if e.Blame != Classify(e.Code) {
			t.Errorf("Xid %d: catalog says %s, Classify %s", e.Code, e.Blame, Classify(e.Code))
		}
		if e.Mnemonic == "" || e.Description == "" || e.ImmediateAction == "" {
			t.Errorf("Xid %d: incomplete entry %+v", e.Code, e)
		}
		if got, ok := Lookup(e.Code); !ok || got != e {
			t.Errorf("Lookup(%d) = %+v, %v", e.Code, got, ok)
		}
	}
	for _, code := range applicationXids {
		if _, ok := Lookup(code); !ok {
			t.Errorf("application Xid %d has no catalog entry", code)
		}
	}
	if _, ok := Lookup(8); ok {
		t.Error("Lookup(8) found an entry")
	}
	c[0].Code = -1
	if Catalog()[0].Code == -1 {
		t.Error("Catalog returned the table itself")
	}
}
