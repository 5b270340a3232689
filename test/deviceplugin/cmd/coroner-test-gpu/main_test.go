package main

import (
	"testing"

	"github.com/coroner-dev/coroner/test/deviceplugin"
)

func TestOptionsValidate(t *testing.T) {
	cases := []struct {
		name    string
		control string
		wantErr bool
	}{
		{name: "default", control: "/run/coroner-test-gpu.sock"},
		{name: "relative", control: "control.sock", wantErr: true},
		{name: "in the device-plugins directory, which the kubelet empties", control: "/var/lib/kubelet/device-plugins/control.sock", wantErr: true},
		{name: "beside that directory", control: "/var/lib/kubelet/device-plugins-control.sock"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := &options{plugin: deviceplugin.NewOptions(), control: tc.control}
			if err := o.validate(); (err != nil) != tc.wantErr {
				t.Errorf("validate: %v, want an error: %t", err, tc.wantErr)
			}
		})
	}
}
