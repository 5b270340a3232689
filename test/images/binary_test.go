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
	config, layer := imageParts(t, files, img.Digest)
	if strings.Join(config.Entrypoint, " ") != "/coroner-agent" {
		t.Errorf("entrypoint %q, want [/coroner-agent]", config.Entrypoint)
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

// TestFromBinaryAs: a platform's manager at /manager, run as a user that is not root.
func TestFromBinaryAs(t *testing.T) {
	if _, err := os.Stat(BusyboxPath); err != nil {
		t.Skipf("busybox-static not installed: %v", err)
	}
	dir := t.TempDir()
	bin := filepath.Join(t.TempDir(), "kueue")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho kueue\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	img, err := FromBinaryAs(dir, "coroner.dev/kueue:v0.17.0", bin, "manager", "65532:65532")
	if err != nil {
		t.Fatal(err)
	}
	if img.Tarball != filepath.Join(dir, "kueue.tar") {
		t.Errorf("tarball %s", img.Tarball)
	}
	config, layer := imageParts(t, readTar(t, img.Tarball), img.Digest)
	if strings.Join(config.Entrypoint, " ") != "/manager" || config.User != "65532:65532" {
		t.Errorf("config %+v, want entrypoint /manager, user 65532:65532", config)
	}
	if h := layer["manager"]; h == nil || h.Typeflag != tar.TypeReg || h.Mode != 0o755 {
		t.Errorf("layer entry manager: %+v, want an executable file at the image's root", h)
	}
	for _, bad := range []string{"", "bin/manager"} {
		if _, err := FromBinaryAs(dir, "coroner.dev/kueue:v0.17.0", bin, bad, ""); err == nil {
			t.Errorf("entry %q: want an error", bad)
		}
	}
}

// runConfig is the part of an image's config the tests read.
type runConfig struct {
	Entrypoint []string `json:"Entrypoint"`
	User       string   `json:"User"`
}

// imageParts reads the config and the (only) layer's entries of the image whose manifest
// has digest, from the files of its tarball.
func imageParts(t *testing.T, files map[string][]byte, digest string) (runConfig, map[string]*tar.Header) {
	t.Helper()
	var manifest struct {
		Config descriptor   `json:"config"`
		Layers []descriptor `json:"layers"`
	}
	if err := json.Unmarshal(files[blobPath(digest)], &manifest); err != nil {
		t.Fatal(err)
	}
	var config struct {
		Config runConfig `json:"config"`
	}
	if err := json.Unmarshal(files[blobPath(manifest.Config.Digest)], &config); err != nil {
		t.Fatal(err)
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
	return config.Config, layer
}
