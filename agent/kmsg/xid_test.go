package kmsg

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestReaderXids: the Reader hands on the NVIDIA driver's Xid reports with their time,
// in the order logged, beside the OOM kills; a malformed one is counted, not sent, and a
// record written from user space (facility 1, as `echo > /dev/kmsg` makes) is not read.
// The Xid lines are real ones (agent/nvidia's TestParseXid cites their sources).
func TestReaderXids(t *testing.T) {
	const in = "" +
		"4,1001,5000000,-;NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n" +
		"4,1002,5100000,-;NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter\n" +
		"12,1003,5200000,-;NVRM: Xid (PCI:0000:a1:00): 48, pid=1, name=forged, written from user space\n" +
		"4,1004,5300000,-;NVRM: Xid (PCI:zzzz): 79, malformed\n" +
		"6,1005,5400000,-;NVRM: GPU at PCI:0000:a1:00: GPU-9221d5d1-b60b-a624-bf14-0a1819cfda3b\n"
	boot := time.Date(2026, 12, 7, 8, 0, 0, 0, time.UTC)
	rd := NewReader(strings.NewReader(in), boot)
	xids := make(chan XidReport, 10)
	rd.Xids = xids
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := rd.Run(ctx, make(chan OOMKill, 10)); err != nil {
		t.Fatal(err)
	}
	close(xids)
	var got []XidReport
	for x := range xids {
		got = append(got, x)
	}
	if len(got) != 2 {
		t.Fatalf("%d Xid reports %+v, want the 79 and the 13", len(got), got)
	}
	if x := got[0]; x.Xid.Code != 79 || x.Xid.Address.String() != "0000:a1:00.0" || x.Seq != 1001 || !x.Time.Equal(boot.Add(5*time.Second)) {
		t.Errorf("first report %+v", x)
	}
	if x := got[1]; x.Xid.Code != 13 || x.Xid.DeviceFault() {
		t.Errorf("second report %+v, want Xid 13, the application's", x)
	}
	if n := rd.BadXids(); n != 1 {
		t.Errorf("BadXids = %d, want 1", n)
	}
}

// With UserSpaceXids, an Xid line a program wrote to /dev/kmsg (facility user, as the
// lab's test GPU plugin writes it) is read too; an OOM kill report so written still is
// not.
func TestReaderUserSpaceXids(t *testing.T) {
	const in = "" +
		"12,2001,6000000,-;NVRM: Xid (PCI:0001:10:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n" +
		"12,2002,6100000,-;Memory cgroup out of memory: Killed process 4242 (forged) total-vm:1kB, anon-rss:1kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:0kB oom_score_adj:0\n"
	for _, on := range []bool{false, true} {
		rd := NewReader(strings.NewReader(in), time.Date(2026, 12, 7, 8, 0, 0, 0, time.UTC))
		xids := make(chan XidReport, 10)
		rd.Xids, rd.UserSpaceXids = xids, on
		kills := make(chan OOMKill, 10)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := rd.Run(ctx, kills); err != nil {
			t.Fatal(err)
		}
		cancel()
		close(xids)
		close(kills)
		n := 0
		for x := range xids {
			n++
			if x.Xid.Code != 79 || x.Xid.Address.String() != "0001:10:00.0" {
				t.Errorf("UserSpaceXids=%v: report %+v", on, x)
			}
		}
		if want := map[bool]int{false: 0, true: 1}[on]; n != want {
			t.Errorf("UserSpaceXids=%v: %d Xid reports, want %d", on, n, want)
		}
		for k := range kills {
			t.Errorf("UserSpaceXids=%v: an OOM kill read from a user-space record: %+v", on, k)
		}
	}
}
