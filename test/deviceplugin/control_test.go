package deviceplugin

// control_test.go: the control API, from its client through the plugin to the kubelet's
// ListAndWatch stream.

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

func TestControlRoundTrip(t *testing.T) {
	state := tempDir(t)
	kmsg := filepath.Join(state, "kmsg")
	if err := os.WriteFile(kmsg, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	p, _ := startRegistered(t, 2, func(o *Options) { o.StateDir, o.Kmsg = state, kmsg })
	socket := filepath.Join(tempDir(t), "control.sock")
	l, err := ListenControl(socket)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- ServeControl(ctx, l, p) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-served:
			if err != nil {
				t.Errorf("ServeControl: %v", err)
			}
		case <-time.After(testTimeout):
			t.Errorf("ServeControl did not return within %v of its context's end", testTimeout)
		}
	})
	c := NewControlClient(socket)
	t.Cleanup(c.Close)
	stream, err := dialPlugin(t, p).ListAndWatch(testContext(t), &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	recv := func(step string, want ...string) {
		t.Helper()
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if diff := cmp.Diff(want, healths(resp.Devices)); diff != "" {
			t.Errorf("%s: the kubelet's list (-want +got):\n%s", step, diff)
		}
	}
	recv("first list", "GPU-0=Healthy", "GPU-1=Healthy")

	devices, err := c.List(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]Device{
		{ID: "GPU-0", Health: "Healthy", PCI: "0000:10:00.0"},
		{ID: "GPU-1", Health: "Healthy", PCI: "0000:11:00.0"},
	}, devices); diff != "" {
		t.Errorf("List (-want +got):\n%s", diff)
	}

	d, err := c.Fail(testContext(t), "GPU-1")
	if err != nil {
		t.Fatal(err)
	}
	if want := (Device{ID: "GPU-1", Health: "Unhealthy", PCI: "0000:11:00.0"}); d != want {
		t.Errorf("Fail: %+v, want %+v", d, want)
	}
	recv("after Fail", "GPU-0=Healthy", "GPU-1=Unhealthy")

	if d, err = c.Heal(testContext(t), "GPU-1"); err != nil {
		t.Fatal(err)
	}
	if d.Health != "Healthy" {
		t.Errorf("Heal: %+v, want Healthy", d)
	}
	recv("after Heal", "GPU-0=Healthy", "GPU-1=Healthy")

	d, line, err := c.FailWithXid(testContext(t), "GPU-0", 48)
	if err != nil {
		t.Fatal(err)
	}
	if d.Health != "Unhealthy" || !strings.HasPrefix(line, "NVRM: Xid (PCI:0000:10:00): 48, ") {
		t.Errorf("FailWithXid: %+v, %q", d, line)
	}
	if b, _ := os.ReadFile(kmsg); string(b) != "<3>"+line+"\n" {
		t.Errorf("kernel log: %q, want the line FailWithXid returned", b)
	}
	recv("after FailWithXid", "GPU-0=Unhealthy", "GPU-1=Healthy")
	if _, _, err := c.FailWithXid(testContext(t), "GPU-1", 1000); err == nil {
		t.Errorf("FailWithXid of Xid 1000: no error")
	}
	var res FailResult
	if err := c.call(testContext(t), "POST", "/devices/GPU-1/fail?xid=abc", &res); err == nil || !strings.Contains(err.Error(), "400") {
		t.Errorf("fail?xid=abc: %v, want a 400", err)
	}
	if p.Devices()[1].Health != "Healthy" {
		t.Errorf("GPU-1 after refused fails: %+v", p.Devices()[1])
	}

	// An Xid line alone: the kernel log gets it, the device stays Healthy, no update.
	before, _ := os.ReadFile(kmsg)
	d, line, err = c.WriteXid(testContext(t), "GPU-1", 13)
	if err != nil {
		t.Fatal(err)
	}
	if d.Health != "Healthy" || !strings.HasPrefix(line, "NVRM: Xid (PCI:0000:11:00): 13, ") {
		t.Errorf("WriteXid: %+v, %q", d, line)
	}
	if b, _ := os.ReadFile(kmsg); string(b) != string(before)+"<3>"+line+"\n" {
		t.Errorf("kernel log after WriteXid: %q", b)
	}
	if p.Devices()[1].Health != "Healthy" {
		t.Errorf("GPU-1 after WriteXid: %+v, want Healthy", p.Devices()[1])
	}
	if err := c.call(testContext(t), "POST", "/devices/GPU-1/xid?code=0", &res); err == nil || !strings.Contains(err.Error(), "400") {
		t.Errorf("xid?code=0: %v, want a 400", err)
	}
	if _, _, err := c.WriteXid(testContext(t), "GPU-7", 13); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("WriteXid of an unknown device: %v, want a 404", err)
	}

	for _, id := range []string{"GPU-7", "", "../devices"} {
		if _, err := c.Fail(testContext(t), id); err == nil {
			t.Errorf("Fail(%q): no error", id)
		}
	}
	if _, err := c.Fail(testContext(t), "GPU-7"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("Fail of an unknown device: %v, want a 404", err)
	}
}
