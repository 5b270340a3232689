package images

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Names of coroner's own images, as the manifests in deploy/ refer to them.
const (
	AgentName = "docker.io/coroner/coroner-agent:dev"
	ShimName  = "docker.io/coroner/coroner-shim:dev"
)

// FromBinary builds an image named name from one static binary: a single layer holding the
// busybox root file system (for `kubectl exec ... sh` when debugging) and the binary at
// /<base name of binary>, which is the image's entrypoint. The tarball is
// dir/<base name>.tar (dir is Dir() when empty); as for the other images it is rewritten
// only when its digest changes, so building again from the same binary costs a read and a
// hash.
//
// The binary must be static (CGO_ENABLED=0): the image has no C library.
func FromBinary(dir, name, binary string) (Image, error) {
	return FromBinaryAs(dir, name, binary, filepath.Base(binary), "")
}

// FromBinaryAs is FromBinary with the binary at /<entry> and the image's user (uid:gid;
// empty: root): the images of the platforms coroner runs beside (Kueue's and JobSet's
// managers), whose own manifests run /manager with runAsNonRoot, as their published
// images (distroless, user 65532) allow. The tarball is dir/<base name of binary>.tar.
func FromBinaryAs(dir, name, binary, entry, user string) (Image, error) {
	dir, err := resolveDir(dir)
	if err != nil {
		return Image{}, err
	}
	if !strings.Contains(name, ":") {
		return Image{}, fmt.Errorf("image name %q has no tag", name)
	}
	if entry == "" || strings.Contains(entry, "/") {
		return Image{}, fmt.Errorf("entry %q: want a file name at the image's root", entry)
	}
	st, err := os.Stat(binary)
	if err != nil {
		return Image{}, err
	}
	if st.IsDir() || st.Mode()&0o111 == 0 {
		return Image{}, fmt.Errorf("%s is not an executable file", binary)
	}
	layer, err := rootfsLayer(map[string]string{entry: binary})
	if err != nil {
		return Image{}, err
	}
	return writeImage(dir, filepath.Base(binary), name, layer, imageConfig{Entrypoint: []string{"/" + entry}, User: user})
}
