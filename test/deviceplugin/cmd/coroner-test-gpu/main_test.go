package main

import (
	"testing"

	"github.com/coroner-dev/coroner/test/deviceplugin"
)

func TestOptionsValidate(t *testing.T) {
	cases := []struct {
		name    string
		control string
		pciBase string
		wantErr bool
	}{
		{name: "default", control: "/run/coroner-test-gpu.sock"},
		{name: "a PCI base of its own", control: "/run/coroner-test-gpu.sock", pciBase: "0003:20"},
		{name: "a PCI base without a domain", control: "/run/coroner-test-gpu.sock", pciBase: "20", wantErr: true},
		{name: "a PCI base that is not hex", control: "/run/coroner-test-gpu.sock", pciBase: "000g:20", wantErr: true},
		{name: "a PCI base whose buses run past ff", control: "/run/coroner-test-gpu.sock", pciBase: "0000:ff", wantErr: true},
		{name: "relative", control: "control.sock", wantErr: true},
		{name: "in the device-plugins directory, which the kubelet empties", control: "/var/lib/kubelet/device-plugins/control.sock", wantErr: true},
		{name: "beside that directory", control: "/var/lib/kubelet/device-plugins-control.sock"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := &options{plugin: deviceplugin.NewOptions(), control: tc.control, pciBase: "0000:10"}
			if tc.pciBase != "" {
				o.pciBase = tc.pciBase
			}
			if err := o.validate(); (err != nil) != tc.wantErr {
				t.Errorf("validate: %v, want an error: %t", err, tc.wantErr)
			}
		})
	}
}
