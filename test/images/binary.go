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
	dir, err := resolveDir(dir)
	if err != nil {
		return Image{}, err
	}
	if !strings.Contains(name, ":") {
		return Image{}, fmt.Errorf("image name %q has no tag", name)
	}
	st, err := os.Stat(binary)
	if err != nil {
		return Image{}, err
	}
	if st.IsDir() || st.Mode()&0o111 == 0 {
		return Image{}, fmt.Errorf("%s is not an executable file", binary)
	}
	base := filepath.Base(binary)
	layer, err := rootfsLayer(map[string]string{base: binary})
	if err != nil {
		return Image{}, err
	}
	return writeImage(dir, base, name, layer, imageConfig{Entrypoint: []string{"/" + base}})
}
