package lab

import (
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestSocketMade: the change time of a unix socket just made is about now; a regular file
// or nothing is no socket.
func TestSocketMade(t *testing.T) {
	dir := t.TempDir()
	before := time.Now()
	path := filepath.Join(dir, "kubelet.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	made, ok := socketMade(path)
	if !ok {
		t.Fatal("a listening unix socket not seen")
	}
	if made.Before(before.Add(-50*time.Millisecond)) || made.After(time.Now().Add(time.Second)) {
		t.Errorf("made %v, want about %v", made, before)
	}
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{file, filepath.Join(dir, "none")} {
		if _, ok := socketMade(p); ok {
			t.Errorf("%s taken for a socket", p)
		}
	}
}
