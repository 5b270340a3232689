package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func TestSpecFiles(t *testing.T) {
	got := specFiles([]string{"--root", "/r", "--log", "/l", "create", "--bundle", "/b", "--pid-file", "/p", "id"})
	if want := []string{"/b/config.json"}; !reflect.DeepEqual(got, want) {
		t.Errorf("create: %v, want %v", got, want)
	}
	got = specFiles([]string{"exec", "--process=/tmp/proc.json", "--detach", "id"})
	if want := []string{"/tmp/proc.json"}; !reflect.DeepEqual(got, want) {
		t.Errorf("exec: %v, want %v", got, want)
	}
	if got := specFiles([]string{"delete", "--force", "id"}); len(got) != 0 {
		t.Errorf("delete: %v, want none", got)
	}
}

func TestDropCaps(t *testing.T) {
	dir := t.TempDir()
	spec := filepath.Join(dir, "config.json")
	all := []any{"CAP_CHOWN", "CAP_SYS_RESOURCE", "CAP_SYS_ADMIN"}
	doc := map[string]any{"ociVersion": "1.2.0", "process": map[string]any{
		"args":         []any{"/sbin/init"},
		"capabilities": map[string]any{"bounding": all, "effective": all, "permitted": all},
	}}
	b, _ := json.Marshal(doc)
	if err := os.WriteFile(spec, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := dropCaps(spec, map[string]bool{"CAP_SYS_RESOURCE": true}); err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	b, err := os.ReadFile(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	caps := got["process"].(map[string]any)["capabilities"].(map[string]any)
	for _, set := range []string{"bounding", "effective", "permitted"} {
		if want := []any{"CAP_CHOWN", "CAP_SYS_ADMIN"}; !reflect.DeepEqual(caps[set], want) {
			t.Errorf("%s: %v, want %v", set, caps[set], want)
		}
	}
	if got["ociVersion"] != "1.2.0" {
		t.Errorf("other fields lost: %v", got)
	}
	// A process file (runc exec --process) has the capabilities at its top level.
	proc := filepath.Join(dir, "process.json")
	b, _ = json.Marshal(map[string]any{"capabilities": map[string]any{"bounding": all}})
	if err := os.WriteFile(proc, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := dropCaps(proc, map[string]bool{"CAP_SYS_RESOURCE": true}); err != nil {
		t.Fatal(err)
	}
	if b, err = os.ReadFile(proc); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if n := len(got["capabilities"].(map[string]any)["bounding"].([]any)); n != 2 {
		t.Errorf("process file: %d capabilities left, want 2", n)
	}
}
