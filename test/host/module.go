package host

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// ModuleDir returns the directory of a Go module's source (path@version), downloaded
// through the module proxy into the module cache when it is not there yet: the files
// other projects publish beside their code (kind's node image files, Kueue's and JobSet's
// manifests) are read from there, at the version built.
func ModuleDir(ctx context.Context, module string) (string, error) {
	if !strings.Contains(module, "@") {
		return "", fmt.Errorf("module %q: want path@version", module)
	}
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", module)
	cmd.Dir = os.TempDir() // outside any module: its go.mod must not matter
	cmd.Env = append(os.Environ(), "GOFLAGS=")
	out, err := cmd.Output()
	var m struct{ Dir, Error string }
	_ = json.Unmarshal(out, &m)
	if err != nil || m.Dir == "" {
		return "", fmt.Errorf("go mod download %s: %v %s", module, err, m.Error)
	}
	return m.Dir, nil
}
