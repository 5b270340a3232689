package images

import (
	"archive/tar"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestFromBinary(t *testing.T) {
	if _, err := os.Stat(BusyboxPath); err != nil {
		t.Skipf("busybox-static not installed: %v", err)
	}
	dir := t.TempDir()
	bin := filepath.Join(t.TempDir(), "coroner-agent")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho agent\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	img, err := FromBinary(dir, AgentName, bin)
	if err != nil {
		t.Fatal(err)
	}
	if img.Name != AgentName || img.Tarball != filepath.Join(dir, "coroner-agent.tar") {
		t.Errorf("image %+v", img)
	}
	files := readTar(t, img.Tarball)
	var index struct {
		Manifests []descriptor `json:"manifests"`
	}
	if err := json.Unmarshal(files["index.json"], &index); err != nil {
		t.Fatal(err)
	}
	if len(index.Manifests) != 1 || index.Manifests[0].Annotations["io.containerd.image.name"] != AgentName {
		t.Fatalf("index.json %s", files["index.json"])
	}
	var manifest struct {
		Config descriptor   `json:"config"`
		Layers []descriptor `json:"layers"`
	}
	if err := json.Unmarshal(files[blobPath(img.Digest)], &manifest); err != nil {
		t.Fatal(err)
	}
	var config struct {
		Config struct {
			Entrypoint []string `json:"Entrypoint"`
		} `json:"config"`
	}
	if err := json.Unmarshal(files[blobPath(manifest.Config.Digest)], &config); err != nil {
		t.Fatal(err)
	}
	if strings.Join(config.Config.Entrypoint, " ") != "/coroner-agent" {
		t.Errorf("entrypoint %q, want [/coroner-agent]", config.Config.Entrypoint)
	}
	layer := map[string]*tar.Header{}
	tr := tar.NewReader(strings.NewReader(string(files[blobPath(manifest.Layers[0].Digest)])))
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		layer[h.Name] = h
	}
	if h := layer["coroner-agent"]; h == nil || h.Typeflag != tar.TypeReg || h.Mode != 0o755 {
		t.Errorf("layer entry coroner-agent: %+v", h)
	}
	if layer["bin/sh"] == nil {
		t.Error("layer lacks busybox's bin/sh")
	}

	// The same binary gives the same digest; a different one another.
	again, err := FromBinary(dir, AgentName, bin)
	if err != nil || again.Digest != img.Digest {
		t.Errorf("rebuild: %v, digest %s, was %s", err, again.Digest, img.Digest)
	}
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho agent v2\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	changed, err := FromBinary(dir, AgentName, bin)
	if err != nil || changed.Digest == img.Digest {
		t.Errorf("changed binary: %v, digest %s unchanged", err, changed.Digest)
	}

	if _, err := FromBinary(dir, "no-tag", bin); err == nil {
		t.Error("a name without a tag was accepted")
	}
}
