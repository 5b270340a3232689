package nvidia

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// realXids are Xid reports as printed by NVIDIA drivers, each with the public
// page it was copied from. The dmesg timestamp, syslog prefix or "kernel: "
// before "NVRM:" is left out (ParseXid tolerates it; see
// TestParseXidPrefixes); the rest is byte for byte what the page shows.
var realXids = []struct {
	name, line string
	want       Xid
}{
	{
		// https://github.com/akash-network/support/issues/209 (driver 535.161.07)
		name: "79 fallen off the bus, pid and name unknown",
		line: "NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
		want: Xid{Address: addr(0, 0xa1, 0), Code: 79, Message: "GPU has fallen off the bus."},
	},
	{
		// https://github.com/NVIDIA/open-gpu-kernel-modules/issues/1151 (RTX 5080, open modules)
		name: "79 without pid or name",
		line: "NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.",
		want: Xid{Address: addr(0, 0x2b, 0), Code: 79, Message: "GPU has fallen off the bus."},
	},
	{
		// https://pastebin.com/jJdbRLSr (driver 375.26, GeForce 840M)
		name: "79 from a 375 driver, stray parenthesis kept in the message",
		line: "NVRM: Xid (PCI:0000:03:00): 79, GPU has fallen off the bus.)",
		want: Xid{Address: addr(0, 3, 0), Code: 79, Message: "GPU has fallen off the bus.)"},
	},
	{
		// https://github.com/madMAx43v3r/chia-gigahorse/issues/301
		name: "31 MMU fault with pid, name and channel",
		line: "NVRM: Xid (PCI:0000:0a:00): 31, pid=13332, name=cuda_plot_k32_v, Ch 00000010, intr 00000000. MMU Fault: ENGINE CE2 HUBCLIENT_CE0 faulted @ 0x7f29_5b8c9000. Fault is of type FAULT_PRIV_VIOLATION ACCESS_TYPE_VIRT_READ",
		want: Xid{Address: addr(0, 0x0a, 0), Code: 31, PID: 13332, Process: "cuda_plot_k32_v",
			Message: "Ch 00000010, intr 00000000. MMU Fault: ENGINE CE2 HUBCLIENT_CE0 faulted @ 0x7f29_5b8c9000. Fault is of type FAULT_PRIV_VIOLATION ACCESS_TYPE_VIRT_READ"},
	},
	{
		// https://github.com/madMAx43v3r/chia-gigahorse/issues/301
		name: "62 micro-controller halt, hex words",
		line: "NVRM: Xid (PCI:0000:0a:00): 62, pid='<unknown>', name=<unknown>, 2023b230 20238a3a 2023e8b6 2023eac4 2023ec3c 2023ea86 00000000 00000000",
		want: Xid{Address: addr(0, 0x0a, 0), Code: 62, Message: "2023b230 20238a3a 2023e8b6 2023eac4 2023ec3c 2023ea86 00000000 00000000"},
	},
	{
		// https://github.com/madMAx43v3r/chia-gigahorse/issues/301
		name: "45 preemptive cleanup, channel only",
		line: "NVRM: Xid (PCI:0000:0a:00): 45, pid='<unknown>', name=<unknown>, Ch 00000008",
		want: Xid{Address: addr(0, 0x0a, 0), Code: 45, Message: "Ch 00000008"},
	},
	{
		// https://github.com/leptonai/gpud/pull/46
		name: "109 context switch timeout",
		line: "NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, name=pt_main_thread, Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005",
		want: Xid{Address: addr(0, 0xcb, 0), Code: 109, PID: 1797828, Process: "pt_main_thread",
			Message: "Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005"},
	},
	{
		// https://github.com/leptonai/gpud/pull/46
		name: "13 graphics exception, message with parentheses and colons",
		line: "NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter",
		want: Xid{Address: addr(0, 0xcb, 0), Code: 13, Message: "Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter"},
	},
	{
		// https://github.com/akash-network/support/issues/244 (driver 535.183.01)
		name: "94 contained ECC error",
		line: "NVRM: Xid (PCI:0000:00:08): 94, pid='<unknown>', name=<unknown>, Contained: SM (0x1). RST: No, D-RST: No",
		want: Xid{Address: addr(0, 0, 8), Code: 94, Message: "Contained: SM (0x1). RST: No, D-RST: No"},
	},
	{
		// https://github.com/akash-network/support/issues/244 (driver 535.183.01)
		name: "43 stopped processing",
		line: "NVRM: Xid (PCI:0000:00:05): 43, pid=1045242, name=pt_main_thread, Ch 00000008",
		want: Xid{Address: addr(0, 0, 5), Code: 43, PID: 1045242, Process: "pt_main_thread", Message: "Ch 00000008"},
	},
	{
		// https://github.com/NVIDIA/open-gpu-kernel-modules/issues/1150 (driver 590.48.01)
		name: "45 caused by an NVLink Xid",
		line: "NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149",
		want: Xid{Address: addr(0, 0xdc, 0), Code: 45, PID: 1818990, Process: "python3", Message: "Ch 00000001 caused by previous Xid 149"},
	},
	{
		// https://github.com/NVIDIA/open-gpu-kernel-modules/issues/1030 (open modules 595.71.05)
		name: "31 with the newer 'channel 0x' spelling",
		line: "NVRM: Xid (PCI:0000:01:00): 31, pid=13705, name=UnrealEditor, channel 0x0000000c, intr 00000000. MMU Fault: ENGINE GRAPHICS GPC2 GPCCLIENT_PROP_0 faulted @ 0x0_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
		want: Xid{Address: addr(0, 1, 0), Code: 31, PID: 13705, Process: "UnrealEditor",
			Message: "channel 0x0000000c, intr 00000000. MMU Fault: ENGINE GRAPHICS GPC2 GPCCLIENT_PROP_0 faulted @ 0x0_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ"},
	},
	{
		// https://github.com/xtknight/vdpau-va-driver-vp9/issues/2 (2019)
		name: "31 with pid but no name",
		line: "NVRM: Xid (PCI:0000:00:06): 31, pid=2708, Ch 0000003d, intr 10000000. MMU Fault: ENGINE NVDEC HUBCLIENT_NVDEV faulted @ 0x0_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_READ",
		want: Xid{Address: addr(0, 0, 6), Code: 31, PID: 2708,
			Message: "Ch 0000003d, intr 10000000. MMU Fault: ENGINE NVDEC HUBCLIENT_NVDEV faulted @ 0x0_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_READ"},
	},
	{
		// https://raw.githubusercontent.com/stas00/ml-engineering/7bc7c3054eb93c277a4755c597ae0864d77a63f1/compute/accelerator/nvidia/debug.md
		name: "63 row remapping, pid but no name, device 1c",
		line: "NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.",
		want: Xid{Address: addr(0, 0x10, 0x1c), Code: 63, PID: 1896, Message: "Row Remapper: New row marked for remapping, reset gpu to activate."},
	},
	{
		// https://github.com/doitsujin/dxvk/issues/1027 (driver 418)
		name: "31 from a 418 driver: channel, no pid",
		line: "NVRM: Xid (PCI:0000:01:00): 31, Ch 0000005a, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_1 faulted @ 0x0_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_READ",
		want: Xid{Address: addr(0, 1, 0), Code: 31,
			Message: "Ch 0000005a, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_1 faulted @ 0x0_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_READ"},
	},
	{
		// https://github.com/doitsujin/dxvk/issues/1027 (driver 418)
		name: "32 channel ID",
		line: "NVRM: Xid (PCI:0000:01:00): 32, Channel ID 00000052 intr 02000000",
		want: Xid{Address: addr(0, 1, 0), Code: 32, Message: "Channel ID 00000052 intr 02000000"},
	},
	{
		// https://pastebin.com/NGng33SB
		name: "oldest form: no PCI: prefix",
		line: "NVRM: Xid (0000:01:00): 31, Ch 0000000b, engmask 00000120, intr 10000000",
		want: Xid{Address: addr(0, 1, 0), Code: 31, Message: "Ch 0000000b, engmask 00000120, intr 10000000"},
	},
	{
		// https://pastebin.com/gn6mYmM4 (2012)
		name: "oldest form: 13 with hex words",
		line: "NVRM: Xid (0000:01:00): 13, 0005 00000000 0000502d 00000104 00000000 00000100",
		want: Xid{Address: addr(0, 1, 0), Code: 13, Message: "0005 00000000 0000502d 00000104 00000000 00000100"},
	},
	{
		// NVIDIA's example of a contained error on a MIG GPU instance, in the
		// driver's comment on _gpuGenerateErrorLog (open-gpu-kernel-modules,
		// beside gpuUpdateErrorContainmentState_GA100) and in NVIDIA's A100 GPU
		// memory error management guide,
		// https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/index.html
		name: "94 attributed to a MIG GPU instance",
		line: "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No",
		want: Xid{Address: addr(0, 1, 0), GPUInstance: 5, ComputeInstance: -1, Code: 94, PID: 7194,
			Message: "Contained: CE User Channel (0x9). RST: No, D-RST: No"},
	},
	{
		// the same comment as above
		name: "95 uncontained",
		line: "NVRM: Xid (PCI:0000:01:00): 95, pid=7062, Uncontained: LTC TAG (0x2, 0x1). RST: Yes, D-RST: No",
		want: Xid{Address: addr(0, 1, 0), Code: 95, PID: 7062, Message: "Uncontained: LTC TAG (0x2, 0x1). RST: Yes, D-RST: No"},
	},
	{
		// https://github.com/NVIDIA/gpu-operator/issues/1146; the stored copy of
		// the issue cuts the line after "partition", so the message ends there.
		name: "48 double-bit ECC error",
		line: "NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at physAddr 0x7fdd60000 partition",
		want: Xid{Address: addr(0, 7, 0), Code: 48,
			Message: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at physAddr 0x7fdd60000 partition"},
	},
	{
		// https://github.com/NVIDIA/NVSentinel/pull/1270, a line in the log of
		// NVIDIA's own test (it may be constructed: its GPU UUID is all 2s).
		name: "119 GSP timeout, domain 0002, a name with a colon and brackets",
		line: "NVRM: Xid (PCI:0002:00:00): 119, pid=1582259, name=nvc:[driver], Timeout after 6s of waiting for RPC response from GPU1 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20802a02 0x8).",
		want: Xid{Address: addr(2, 0, 0), Code: 119, PID: 1582259, Process: "nvc:[driver]",
			Message: "Timeout after 6s of waiting for RPC response from GPU1 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20802a02 0x8)."},
	},
}

func addr(domain uint32, bus, device uint8) Address {
	return Address{Domain: domain, Bus: bus, Device: device}
}

func TestParseXidRealLines(t *testing.T) {
	for _, tc := range realXids {
		t.Run(tc.name, func(t *testing.T) {
			want := tc.want
			if want.GPUInstance == 0 && want.ComputeInstance == 0 {
				want.GPUInstance, want.ComputeInstance = -1, -1
			}
			got, ok, err := ParseXid(tc.line)
			if err != nil || !ok {
				t.Fatalf("ParseXid = ok %v, err %v; want an Xid", ok, err)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("ParseXid (-want +got):\n%s", diff)
			}
		})
	}
}

// TestParseXidPrefixes: what comes before "NVRM: Xid" in the sources the
// agent may read (a /dev/kmsg record's message has none) does not matter.
func TestParseXidPrefixes(t *testing.T) {
	const report = "NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
	for name, prefix := range map[string]string{
		"kmsg message":     "",
		"dmesg -T":         "[Fri Apr  5 21:29:39 2024] ",
		"syslog":           "Dec  2 10:43:35 worker4 kernel: [240314.528856] ",
		"journalctl -k":    "kernel: ",
		"trailing newline": "",
	} {
		line := prefix + report
		if strings.HasPrefix(name, "trailing") {
			line += "\n"
		}
		got, ok, err := ParseXid(line)
		if err != nil || !ok || got.Code != 79 || got.Address.String() != "0000:a1:00.0" || got.Message != "GPU has fallen off the bus." {
			t.Errorf("%s: ParseXid(%q) = %+v, %v, %v", name, line, got, ok, err)
		}
	}
}

func TestParseXidShapes(t *testing.T) {
	cases := map[string]struct {
		line    string
		want    Xid
		wantErr string
	}{
		"MIG GPU and compute instance (driver format string, kernel_rc.c)": {
			line: "NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:02): 13, pid=9, name=a, Graphics Exception",
			want: Xid{Address: addr(0, 0x3b, 0), GPUInstance: 1, ComputeInstance: 2, Code: 13, PID: 9, Process: "a", Message: "Graphics Exception"},
		},
		"upper-case hex": {
			line: "NVRM: Xid (PCI:0000:3B:0A): 79, GPU has fallen off the bus.",
			want: Xid{Address: addr(0, 0x3b, 0x0a), GPUInstance: -1, ComputeInstance: -1, Code: 79, Message: "GPU has fallen off the bus."},
		},
		"address with a function": {
			line: "NVRM: Xid (PCI:0000:3b:00.0): 79, pid=1234, GPU has fallen off the bus.",
			want: Xid{Address: addr(0, 0x3b, 0), GPUInstance: -1, ComputeInstance: -1, Code: 79, PID: 1234, Message: "GPU has fallen off the bus."},
		},
		"five-digit domain (VMD)": {
			line: "NVRM: Xid (PCI:10000:e1:00): 79, GPU has fallen off the bus.",
			want: Xid{Address: addr(0x10000, 0xe1, 0), GPUInstance: -1, ComputeInstance: -1, Code: 79, Message: "GPU has fallen off the bus."},
		},
		"nothing after the number": {
			line: "NVRM: Xid (PCI:0000:01:00): 79",
			want: Xid{Address: addr(0, 1, 0), GPUInstance: -1, ComputeInstance: -1, Code: 79},
		},
		"nothing after the comma": {
			line: "NVRM: Xid (PCI:0000:01:00): 79, ",
			want: Xid{Address: addr(0, 1, 0), GPUInstance: -1, ComputeInstance: -1, Code: 79},
		},
		"pid at the end": {
			line: "NVRM: Xid (PCI:0000:3b:00): 48, pid=1234",
			want: Xid{Address: addr(0, 0x3b, 0), GPUInstance: -1, ComputeInstance: -1, Code: 48, PID: 1234},
		},
		"name at the end": {
			line: "NVRM: Xid (PCI:0000:3b:00): 48, pid=1234, name=python,",
			want: Xid{Address: addr(0, 0x3b, 0), GPUInstance: -1, ComputeInstance: -1, Code: 48, PID: 1234, Process: "python"},
		},
		"unquoted unknown pid": {
			line: "NVRM: Xid (PCI:0000:3b:00): 79, pid=<unknown>, name=<unknown>, GPU has fallen off the bus.",
			want: Xid{Address: addr(0, 0x3b, 0), GPUInstance: -1, ComputeInstance: -1, Code: 79, Message: "GPU has fallen off the bus."},
		},
		"no ')'":               {line: "NVRM: Xid (PCI:0000:3b:00: 79, GPU has fallen off the bus.", wantErr: "no ')'"},
		"empty parenthesis":    {line: "NVRM: Xid (): 79, x", wantErr: "no address"},
		"not an address":       {line: "NVRM: Xid (PCI:zz:3b:00): 79, x", wantErr: "domain"},
		"bus of three digits":  {line: "NVRM: Xid (PCI:0000:3b0:00): 79, x", wantErr: "bus"},
		"device out of range":  {line: "NVRM: Xid (PCI:0000:3b:20): 79, x", wantErr: "device"},
		"unknown attribution":  {line: "NVRM: Xid (PCI:0000:3b:00 GPU-X:01): 79, x", wantErr: "unknown attribution"},
		"attribution not num":  {line: "NVRM: Xid (PCI:0000:3b:00 GPU-I:ab): 79, x", wantErr: "MIG attribution"},
		"no colon":             {line: "NVRM: Xid (PCI:0000:3b:00) 79, x", wantErr: "no ':'"},
		"no number":            {line: "NVRM: Xid (PCI:0000:3b:00): , GPU has fallen off the bus.", wantErr: "no Xid number"},
		"number not followed":  {line: "NVRM: Xid (PCI:0000:3b:00): 79x, x", wantErr: "no ','"},
		"number out of range":  {line: "NVRM: Xid (PCI:0000:3b:00): 99999999999, x", wantErr: "out of range"},
		"pid not a number":     {line: "NVRM: Xid (PCI:0000:3b:00): 79, pid=abc, name=x, y", wantErr: "pid"},
		"pid negative":         {line: "NVRM: Xid (PCI:0000:3b:00): 79, pid=-1, name=x, y", wantErr: "pid"},
		"error names the line": {line: "kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=abc", wantErr: `"NVRM: Xid (PCI:0000:3b:00): 79, pid=abc"`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, ok, err := ParseXid(tc.line)
			if tc.wantErr != "" {
				if err == nil || ok || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParseXid = %+v, ok %v, err %v; want an error with %q", got, ok, err, tc.wantErr)
				}
				return
			}
			if err != nil || !ok {
				t.Fatalf("ParseXid = ok %v, err %v; want an Xid", ok, err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("ParseXid (-want +got):\n%s", diff)
			}
		})
	}
}

// TestParseXidNotXid: the driver's other lines, other kernel lines and
// garbage are not Xid reports, and not errors.
func TestParseXidNotXid(t *testing.T) {
	for name, line := range map[string]string{
		// https://github.com/akash-network/support/issues/209
		"GPU at PCI (UUID line)": "NVRM: GPU at PCI:0000:a1:00: GPU-979426f2-893a-7cbb-c4cf-81472f89a462",
		"fallen off, not an Xid": "NVRM: GPU 0000:a1:00.0: GPU has fallen off the bus.",
		"crash dump":             "NVRM: A GPU crash dump has been created. If possible, please run",
		"module load":            "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.161.07  Sat Feb 17 22:55:48 UTC 2024",
		// https://github.com/akash-network/support/issues/244
		"board serial": "NVRM: GPU Board Serial Number: 1650423013443",
		// https://github.com/NVIDIA/NVSentinel/issues/155
		"fallen off without an Xid": "NVRM: The NVIDIA GPU 0000:b3:00.0",
		"OOM kill":                  "Memory cgroup out of memory: Killed process 4242 (python3) total-vm:1kB, anon-rss:1kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:1kB oom_score_adj:984",
		"empty":                     "",
		"Xid without NVRM":          "Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
		"NVRM Xid without parens":   "NVRM: Xid 79 on 0000:3b:00",
		"binary":                    "\x00\xff\x01NVRM:",
	} {
		got, ok, err := ParseXid(line)
		if ok || err != nil {
			t.Errorf("%s: ParseXid(%q) = %+v, %v, %v; want not an Xid, no error", name, line, got, ok, err)
		}
	}
}
