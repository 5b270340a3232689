package nvidia

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func readTestdata(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestParseInformation(t *testing.T) {
	cases := map[string]struct {
		file, text string
		want       Information
		wantErr    string
	}{
		"H100, driver 535 (real)": {
			file: "information-h100-535.txt",
			want: Information{Model: "NVIDIA H100 80GB HBM3", UUID: "GPU-9221d5d1-b60b-a624-bf14-0a1819cfda3b", Address: addr(0, 0x62, 0), Minor: 5},
		},
		"GTX 650, 2017 driver without Device Minor (real)": {
			file: "information-gtx650-2017.txt",
			want: Information{Model: "GeForce GTX 650", UUID: "GPU-e3f822b9-8c5f-95a5-b379-8dfdeefd7758", Address: addr(0, 4, 0), Minor: -1},
		},
		"the driver's tabs (constructed)": {
			file: "information-constructed-tabs.txt",
			want: Information{Model: "NVIDIA A100-SXM4-80GB", UUID: "GPU-66666666-7777-8888-9999-000000000000", Address: addr(0, 0x0b, 0), Minor: 1},
		},
		"excluded, no UUID, old Bus Location (constructed)": {
			file: "information-constructed-excluded-old.txt",
			want: Information{Model: "Tesla K80", Address: addr(0, 0x86, 0), Minor: 3, Excluded: true},
		},
		"GPU Excluded: Yes": {
			text: "Bus Location: \t 0000:01:00.0\nGPU Excluded:\t Yes\n",
			want: Information{Address: addr(0, 1, 0), Minor: -1, Excluded: true},
		},
		"CRLF and no final newline": {
			text: "GPU UUID: \t GPU-1\r\nBus Location: \t 0000:01:00.0",
			want: Information{UUID: "GPU-1", Address: addr(0, 1, 0), Minor: -1},
		},
		"empty":                       {text: "", wantErr: `no "Bus Location"`},
		"no Bus Location":             {text: "Model: \t\t Tesla T4\nGPU UUID: \t GPU-1\n", wantErr: `no "Bus Location"`},
		"Bus Location not an address": {text: "Bus Location: \t PCI:1:0:0\n", wantErr: "Bus Location"},
		"UUID not GPU-":               {text: "GPU UUID: \t 1234\nBus Location: \t 0000:01:00.0\n", wantErr: "GPU UUID"},
		"Device Minor not a number":   {text: "Bus Location: \t 0000:01:00.0\nDevice Minor: \t x\n", wantErr: "Device Minor"},
		"a line without a colon":      {text: "Bus Location: \t 0000:01:00.0\ngarbage\n", wantErr: "not \"Key: value\""},
		"binary":                      {text: "\x00\x01\x02", wantErr: "not \"Key: value\""},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			text := tc.text
			if tc.file != "" {
				text = readTestdata(t, tc.file)
			}
			got, err := ParseInformation(text)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParseInformation = %+v, %v; want an error with %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("ParseInformation (-want +got):\n%s", diff)
			}
		})
	}
}

// gpusDir writes a /proc/driver/nvidia/gpus stand-in: each key is a
// directory name, its value the information file's content.
func gpusDir(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, text := range files {
		if err := os.MkdirAll(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if text == "<none>" {
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, name, "information"), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestUUIDsByAddress(t *testing.T) {
	h100 := readTestdata(t, "information-h100-535.txt")
	gtx := readTestdata(t, "information-gtx650-2017.txt")
	a100 := readTestdata(t, "information-constructed-tabs.txt")
	excluded := readTestdata(t, "information-constructed-excluded-old.txt")

	t.Run("every GPU, keyed as ParseXid keys them", func(t *testing.T) {
		dir := gpusDir(t, map[string]string{"0000:62:00.0": h100, "0000:04:00.0": gtx, "0000:0b:00.0": a100, "0000:86:00.0": excluded})
		got, err := UUIDsByAddress(dir)
		if err != nil {
			t.Fatal(err)
		}
		want := map[Address]string{
			addr(0, 0x62, 0): "GPU-9221d5d1-b60b-a624-bf14-0a1819cfda3b",
			addr(0, 4, 0):    "GPU-e3f822b9-8c5f-95a5-b379-8dfdeefd7758",
			addr(0, 0x0b, 0): "GPU-66666666-7777-8888-9999-000000000000",
			// 0000:86:00.0 has no UUID: left out.
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("UUIDsByAddress (-want +got):\n%s", diff)
		}
		x, _, _ := ParseXid("NVRM: Xid (PCI:0000:62:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.")
		if got[x.Address] != "GPU-9221d5d1-b60b-a624-bf14-0a1819cfda3b" {
			t.Errorf("the Xid's address %s finds %q", x.Address, got[x.Address])
		}
	})

	t.Run("no driver: no directory, no error", func(t *testing.T) {
		got, err := UUIDsByAddress(filepath.Join(t.TempDir(), "proc", "driver", "nvidia", "gpus"))
		if err != nil || got == nil || len(got) != 0 {
			t.Errorf("UUIDsByAddress = %v, %v; want an empty map, no error", got, err)
		}
	})

	t.Run("driver with no GPU", func(t *testing.T) {
		got, err := UUIDsByAddress(t.TempDir())
		if err != nil || len(got) != 0 {
			t.Errorf("UUIDsByAddress = %v, %v", got, err)
		}
	})

	t.Run("bad entries are errors naming their file, the good ones still mapped", func(t *testing.T) {
		dir := gpusDir(t, map[string]string{
			"0000:62:00.0": h100,
			"0000:05:00.0": "<none>",                        // unreadable: no information file
			"0000:06:00.0": "Model: \t\t x\n",               // malformed: no Bus Location
			"0000:07:00.0": gtx,                             // Bus Location 0000:04:00.0
			"power":        "Bus Location: \t 0000:08:00.0", // not an address
		})
		if err := os.WriteFile(filepath.Join(dir, "README"), []byte("a file, not a GPU"), 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := UUIDsByAddress(dir)
		if diff := cmp.Diff(map[Address]string{addr(0, 0x62, 0): "GPU-9221d5d1-b60b-a624-bf14-0a1819cfda3b"}, got); diff != "" {
			t.Errorf("UUIDsByAddress (-want +got):\n%s", diff)
		}
		if err == nil {
			t.Fatal("no error")
		}
		for _, want := range []string{
			filepath.Join(dir, "0000:05:00.0", "information") + ": no such file",
			filepath.Join(dir, "0000:06:00.0", "information") + `: no "Bus Location"`,
			filepath.Join(dir, "0000:07:00.0", "information") + `: "Bus Location" 0000:04:00.0 is not its directory's`,
			filepath.Join(dir, "power", "information") + ": directory name",
		} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not say %q", err, want)
			}
		}
		if strings.Contains(err.Error(), "README") {
			t.Errorf("error %q names a plain file", err)
		}
	})

	t.Run("unreadable directory", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "gpus")
		if err := os.WriteFile(file, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := UUIDsByAddress(file)
		if err == nil || len(got) != 0 {
			t.Errorf("UUIDsByAddress(a file) = %v, %v; want an error", got, err)
		}
	})
}
