package kmsg

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestParseKmsg(t *testing.T) {
	cases := map[string]struct {
		in      string
		want    Record
		wantErr bool
	}{
		"kernel warning with a sequence number and microseconds": {
			in:   "4,350,2300873583,-;busybox invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0",
			want: Record{Level: 4, Facility: 0, Seq: 350, Monotonic: 2300873583 * time.Microsecond, HasTime: true, Message: "busybox invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0"},
		},
		"user-space record has facility 1": {
			in:   "12,900,5000000,-;coroner: hello",
			want: Record{Level: 4, Facility: 1, Seq: 900, Monotonic: 5 * time.Second, HasTime: true, Message: "coroner: hello"},
		},
		"escapes are undone": {
			in:   `6,90,96394,-;rcu: \x09RCU restricting \x5c CPUs`,
			want: Record{Level: 6, Seq: 90, Monotonic: 96394 * time.Microsecond, HasTime: true, Message: "rcu: \tRCU restricting \\ CPUs"},
		},
		"a malformed escape is kept": {
			in:   `6,1,1,-;a\xZZb\x4`,
			want: Record{Level: 6, Seq: 1, Monotonic: time.Microsecond, HasTime: true, Message: `a\xZZb\x4`},
		},
		"continuation lines are ignored": {
			in:   "5,344,1288213,-;virtio_blk virtio1: new size\n SUBSYSTEM=virtio\n DEVICE=+virtio:virtio1\n",
			want: Record{Level: 5, Seq: 344, Monotonic: 1288213 * time.Microsecond, HasTime: true, Message: "virtio_blk virtio1: new size"},
		},
		"continued fragment flag and extra header fields": {
			in:   "6,7,8,c,caller=T1;part",
			want: Record{Level: 6, Seq: 7, Monotonic: 8 * time.Microsecond, HasTime: true, Continued: true, Message: "part"},
		},
		"semicolons in the message stay": {
			in:   "6,7,8,-;a;b",
			want: Record{Level: 6, Seq: 7, Monotonic: 8 * time.Microsecond, HasTime: true, Message: "a;b"},
		},
		"no semicolon":        {in: "6,7,8,-", wantErr: true},
		"too few fields":      {in: "6,7;x", wantErr: true},
		"priority not number": {in: "x,7,8,-;x", wantErr: true},
		"negative timestamp":  {in: "6,7,-8,-;x", wantErr: true},
		"huge timestamp":      {in: "6,7,99999999999999999999,-;x", wantErr: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := ParseKmsg(tc.in)
			if (err != nil) != tc.wantErr {
				t.Fatalf("ParseKmsg() error = %v, want error %v", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("ParseKmsg() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseDmesg(t *testing.T) {
	cases := map[string]struct {
		in   string
		want Record
	}{
		"dmesg": {
			in:   "[ 2300.873956] oom-kill:constraint=CONSTRAINT_MEMCG",
			want: Record{Level: -1, Facility: -1, Monotonic: 2300873956 * time.Microsecond, HasTime: true, Message: "oom-kill:constraint=CONSTRAINT_MEMCG"},
		},
		"dmesg with many digits of seconds and no padding": {
			in:   "[712345.100420] Out of memory: Killed process 1 (x)",
			want: Record{Level: -1, Facility: -1, Monotonic: 712345100420 * time.Microsecond, HasTime: true, Message: "Out of memory: Killed process 1 (x)"},
		},
		"dmesg -r with a level": {
			in:   "<3>[   12.5] Memory cgroup out of memory: Killed process 1 (x)",
			want: Record{Level: 3, Facility: 0, Monotonic: 12500 * time.Millisecond, HasTime: true, Message: "Memory cgroup out of memory: Killed process 1 (x)"},
		},
		"dmesg -x with decoded level": {
			in:   "kern  :err   : [    1.000001] hello",
			want: Record{Level: -1, Facility: -1, Monotonic: time.Second + time.Microsecond, HasTime: true, Message: "hello"},
		},
		"journal line is a bare message": {
			in:   "Feb 03 19:57:08 node-a kernel: Memory cgroup out of memory: Killed process 1849 (java)",
			want: Record{Level: -1, Facility: -1, Message: "Feb 03 19:57:08 node-a kernel: Memory cgroup out of memory: Killed process 1849 (java)"},
		},
		"carriage return is dropped": {
			in:   "[ 1.000000] hi\r",
			want: Record{Level: -1, Facility: -1, Monotonic: time.Second, HasTime: true, Message: "hi"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, ParseDmesg(tc.in)); diff != "" {
				t.Errorf("ParseDmesg() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseLine(t *testing.T) {
	cases := map[string]struct {
		in       string
		wantOK   bool
		wantSeq  uint64
		wantTime bool
	}{
		"kmsg record":             {in: "6,12,34,-;x", wantOK: true, wantSeq: 12, wantTime: true},
		"dmesg line":              {in: "[ 1.0] x", wantOK: true, wantTime: true},
		"continuation line":       {in: " SUBSYSTEM=virtio"},
		"empty":                   {in: ""},
		"malformed kmsg":          {in: "6,12,34x,-;x", wantOK: true}, // not a kmsg head: a bare message
		"kmsg with bad timestamp": {in: "6,12,99999999999999999999,-;x"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			r, ok := ParseLine(tc.in)
			if ok != tc.wantOK || r.Seq != tc.wantSeq || r.HasTime != tc.wantTime {
				t.Errorf("ParseLine(%q) = %+v, %v; want ok %v, seq %d, time %v", tc.in, r, ok, tc.wantOK, tc.wantSeq, tc.wantTime)
			}
		})
	}
}

func TestParseUptime(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	got, err := ParseUptime("2287.30 1949.60\n", now)
	if err != nil {
		t.Fatal(err)
	}
	if want := now.Add(-2287300 * time.Millisecond); !got.Equal(want) {
		t.Errorf("ParseUptime() = %v, want %v", got, want)
	}
	for _, bad := range []string{"", "x 1", "-1 2", "1e300 1"} {
		if _, err := ParseUptime(bad, now); err == nil {
			t.Errorf("ParseUptime(%q) did not fail", bad)
		}
	}
}
