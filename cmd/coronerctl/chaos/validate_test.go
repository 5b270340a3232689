package chaos

import (
	"strings"
	"testing"
)

func TestValidateDeviceActions(t *testing.T) {
	cases := []struct {
		args    []string
		xid     int
		wantErr string
	}{
		{args: []string{"devices", "lab-node-1"}},
		{args: []string{"devices", "lab-node-1", "GPU-0"}, wantErr: "usage: coronerctl chaos devices NODE"},
		{args: []string{"device-fail", "lab-node-1"}},
		{args: []string{"device-fail", "lab-node-1", "GPU-1"}, xid: 79},
		{args: []string{"device-fail", "lab-node-1", "pod/train-0"}},
		{args: []string{"device-fail", "lab-node-1", ""}, wantErr: "usage: coronerctl chaos device-fail NODE [DEVICE|pod/NAME]"},
		{args: []string{"device-fail"}, wantErr: "usage"},
		{args: []string{"device-fail", "lab-node-1", "GPU-0", "GPU-1"}, wantErr: "usage"},
		{args: []string{"device-fail", "lab-node-1"}, xid: 1000, wantErr: "--xid must be an Xid number from 1 to 999"},
		{args: []string{"device-heal", "lab-node-1"}},
		{args: []string{"device-heal", "lab-node-1", "GPU-0"}},
		{args: []string{"device-heal", "lab-node-1"}, xid: 79, wantErr: "--xid is a flag of device-fail and device-xid, not of device-heal"},
		{args: []string{"device-xid", "lab-node-1", "GPU-0"}, xid: 13},
		{args: []string{"device-xid", "lab-node-1", "pod/train-0"}, xid: 79},
		{args: []string{"device-xid", "lab-node-1", "GPU-0"}, wantErr: "usage: coronerctl chaos device-xid NODE DEVICE|pod/NAME --xid N"},
		{args: []string{"device-xid", "lab-node-1"}, xid: 13, wantErr: "usage: coronerctl chaos device-xid"},
		{args: []string{"partition", "lab-node-1", "GPU-0"}, wantErr: "usage: coronerctl chaos partition NODE"},
	}
	for _, tc := range cases {
		o := NewOptions()
		o.Xid = tc.xid
		err := o.Validate(tc.args)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("Validate(%q, --xid=%d): %v", tc.args, tc.xid, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("Validate(%q, --xid=%d): %v, want an error with %q", tc.args, tc.xid, err, tc.wantErr)
		}
	}
}
