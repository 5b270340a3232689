package kind

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"
)

// The node image's component images (kube-apiserver, etcd, coredns, pause, ...) need what
// test/images does not offer: binaries under /usr/local/bin (kubeadm's static pods call the
// bare name), files taken from the Debian root file system (kube-proxy's iptables and its
// libraries), no busybox. This is the same recipe as test/images (one uncompressed layer,
// fixed timestamps, an OCI layout tarball with io.containerd.image.name), over a list of
// entries. coroner's own images still come from test/images.FromBinary.

// entry is one file, directory or symbolic link of a layer.
type entry struct {
	Path string // without a leading slash
	Src  string // host file to copy (regular files)
	Data []byte // contents (regular files without Src)
	Mode int64
	Link string // symbolic link target
	Dir  bool
}

var ociEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// baseEntries are every image's /etc/passwd, /etc/group and /tmp.
func baseEntries() []entry {
	return []entry{
		{Path: "etc", Dir: true, Mode: 0o755},
		{Path: "tmp", Dir: true, Mode: 0o1777},
		{Path: "etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{Path: "etc/group", Mode: 0o644, Data: []byte("root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n")},
		{Path: "etc/nsswitch.conf", Mode: 0o644, Data: []byte("hosts: files dns\n")},
	}
}

// layerTar writes the entries as a tar, parents first, each directory once.
func layerTar(entries []entry) ([]byte, error) {
	byPath := map[string]entry{}
	for _, e := range entries {
		e.Path = strings.Trim(e.Path, "/")
		for d := filepath.Dir(e.Path); d != "." && d != "/"; d = filepath.Dir(d) {
			if _, ok := byPath[d]; !ok {
				byPath[d] = entry{Path: d, Dir: true, Mode: 0o755}
			}
		}
		byPath[e.Path] = e
	}
	paths := make([]string, 0, len(byPath))
	for p := range byPath {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range paths {
		e := byPath[p]
		h := &tar.Header{Name: p, Mode: e.Mode, ModTime: ociEpoch, Uname: "root", Gname: "root", Format: tar.FormatPAX}
		var data []byte
		switch {
		case e.Dir:
			h.Typeflag, h.Name = tar.TypeDir, p+"/"
		case e.Link != "":
			h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, e.Link, 0o777
		default:
			data = e.Data
			if e.Src != "" {
				var err error
				if data, err = os.ReadFile(e.Src); err != nil {
					return nil, err
				}
			}
			h.Typeflag, h.Size = tar.TypeReg, int64(len(data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if data != nil {
			if _, err := tw.Write(data); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// ociImage is a built component image.
type ociImage struct {
	Name    string // registry.k8s.io/...:tag
	Tarball string
	Digest  string // manifest digest
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// writeOCI writes dir/file.tar (an OCI layout with one image) unless dir/file.tar.digest
// says it holds the same manifest already.
func writeOCI(dir, file, name string, entries []entry, entrypoint, cmd []string) (ociImage, error) {
	layer, err := layerTar(entries)
	if err != nil {
		return ociImage{}, err
	}
	ld := sha(layer)
	config, err := json.Marshal(map[string]any{
		"created":      ociEpoch.Format(time.RFC3339),
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"config": map[string]any{
			"Env":        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			"Entrypoint": entrypoint,
			"Cmd":        cmd,
			"WorkingDir": "/",
		},
		"rootfs":  map[string]any{"type": "layers", "diff_ids": []string{ld}},
		"history": []map[string]any{{"created": ociEpoch.Format(time.RFC3339), "created_by": "coroner test/kind"}},
	})
	if err != nil {
		return ociImage{}, err
	}
	type desc struct {
		MediaType   string            `json:"mediaType"`
		Digest      string            `json:"digest"`
		Size        int64             `json:"size"`
		Annotations map[string]string `json:"annotations,omitempty"`
		Platform    map[string]string `json:"platform,omitempty"`
	}
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        desc{MediaType: "application/vnd.oci.image.config.v1+json", Digest: sha(config), Size: int64(len(config))},
		"layers":        []desc{{MediaType: "application/vnd.oci.image.layer.v1.tar", Digest: ld, Size: int64(len(layer))}},
	})
	if err != nil {
		return ociImage{}, err
	}
	img := ociImage{Name: name, Tarball: filepath.Join(dir, file+".tar"), Digest: sha(manifest)}
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.index.v1+json",
		"manifests": []desc{{
			MediaType: "application/vnd.oci.image.manifest.v1+json", Digest: img.Digest, Size: int64(len(manifest)),
			Annotations: map[string]string{
				"io.containerd.image.name":          name,
				"org.opencontainers.image.ref.name": name[strings.LastIndex(name, ":")+1:],
			},
			Platform: map[string]string{"architecture": runtime.GOARCH, "os": "linux"},
		}},
	})
	if err != nil {
		return ociImage{}, err
	}
	stamp := img.Tarball + ".digest"
	if old, err := os.ReadFile(stamp); err == nil && string(old) == img.Digest+"\n" {
		if _, err := os.Stat(img.Tarball); err == nil {
			return img, nil
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return ociImage{}, err
	}
	tmp, err := os.CreateTemp(dir, "."+file+".*")
	if err != nil {
		return ociImage{}, err
	}
	defer os.Remove(tmp.Name())
	tw := tar.NewWriter(tmp)
	blob := func(d string) string { return "blobs/sha256/" + strings.TrimPrefix(d, "sha256:") }
	for _, d := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: ociEpoch}); err != nil {
			return ociImage{}, err
		}
	}
	for _, e := range []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", index},
		{blob(ld), layer},
		{blob(sha(config)), config},
		{blob(img.Digest), manifest},
	} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: e.name, Mode: 0o644, Size: int64(len(e.data)), ModTime: ociEpoch}); err != nil {
			return ociImage{}, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return ociImage{}, err
		}
	}
	if err := tw.Close(); err != nil {
		return ociImage{}, err
	}
	if err := tmp.Close(); err != nil {
		return ociImage{}, err
	}
	if err := os.Rename(tmp.Name(), img.Tarball); err != nil {
		return ociImage{}, err
	}
	return img, os.WriteFile(stamp, []byte(img.Digest+"\n"), 0o644)
}

// String is for logs.
func (i ociImage) String() string { return fmt.Sprintf("%s (%s)", i.Name, i.Digest[:19]) }
