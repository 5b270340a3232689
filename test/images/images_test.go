package images

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"strings"
	"testing"
)

// readTar returns the regular files of a tarball by name.
func readTar(t *testing.T, path string) map[string][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			files[h.Name] = b
		}
	}
}

func TestImages(t *testing.T) {
	if _, err := os.Stat(BusyboxPath); err != nil {
		t.Skipf("busybox-static not installed: %v", err)
	}
	dir := t.TempDir()
	imgs, err := BuildAll(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, img := range imgs {
		files := readTar(t, img.Tarball)
		if string(files["oci-layout"]) != `{"imageLayoutVersion":"1.0.0"}` {
			t.Errorf("%s: oci-layout %q", img.Name, files["oci-layout"])
		}
		// Every blob is stored under its own digest.
		for name, data := range files {
			if strings.HasPrefix(name, "blobs/sha256/") && digest(data) != "sha256:"+strings.TrimPrefix(name, "blobs/sha256/") {
				t.Errorf("%s: blob %s has digest %s", img.Name, name, digest(data))
			}
		}
		var index struct {
			Manifests []descriptor `json:"manifests"`
		}
		if err := json.Unmarshal(files["index.json"], &index); err != nil {
			t.Fatal(err)
		}
		if len(index.Manifests) != 1 || index.Manifests[0].Digest != img.Digest ||
			index.Manifests[0].Annotations["io.containerd.image.name"] != img.Name {
			t.Errorf("%s: index.json %s", img.Name, files["index.json"])
		}
		var manifest struct {
			Config descriptor   `json:"config"`
			Layers []descriptor `json:"layers"`
		}
		if err := json.Unmarshal(files[blobPath(img.Digest)], &manifest); err != nil {
			t.Fatal(err)
		}
		if len(manifest.Layers) != 1 {
			t.Fatalf("%s: %d layers", img.Name, len(manifest.Layers))
		}
		var config struct {
			RootFS struct {
				DiffIDs []string `json:"diff_ids"`
			} `json:"rootfs"`
		}
		if err := json.Unmarshal(files[blobPath(manifest.Config.Digest)], &config); err != nil {
			t.Fatal(err)
		}
		if len(config.RootFS.DiffIDs) != 1 || config.RootFS.DiffIDs[0] != manifest.Layers[0].Digest {
			t.Errorf("%s: diff_ids %v, layer %s", img.Name, config.RootFS.DiffIDs, manifest.Layers[0].Digest)
		}
		layer := map[string]string{}
		tr := tar.NewReader(strings.NewReader(string(files[blobPath(manifest.Layers[0].Digest)])))
		for {
			h, err := tr.Next()
			if err != nil {
				break
			}
			layer[h.Name] = h.Linkname
		}
		for _, want := range []string{"bin/busybox", "tmp/", "etc/passwd"} {
			if _, ok := layer[want]; !ok {
				t.Errorf("%s: layer lacks %s", img.Name, want)
			}
		}
		if layer["bin/sh"] != "/bin/busybox" {
			t.Errorf("%s: bin/sh -> %q, want /bin/busybox", img.Name, layer["bin/sh"])
		}
		if _, ok := layer["bin/memhog"]; ok != (img.Name == BusyboxName) {
			t.Errorf("%s: has memhog %v", img.Name, ok)
		}
	}

	// Building again gives the same digests and does not rewrite the tarballs.
	before, err := os.Stat(imgs[1].Tarball)
	if err != nil {
		t.Fatal(err)
	}
	again, err := BuildPause(dir)
	if err != nil {
		t.Fatal(err)
	}
	after, err := os.Stat(again.Tarball)
	if err != nil {
		t.Fatal(err)
	}
	if again.Digest != imgs[1].Digest || !after.ModTime().Equal(before.ModTime()) {
		t.Errorf("rebuild: digest %s (was %s), mtime %v (was %v)", again.Digest, imgs[1].Digest, after.ModTime(), before.ModTime())
	}
}
