package deviceplugin

// inotify.go: a watch for files created in or removed from one directory.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"syscall"
)

// dirEvent is one file of interest created in or removed from the directory, or, with
// overflow set, word that the kernel dropped events and any file may have changed.
type dirEvent struct {
	name     string
	created  bool // created or moved in; else removed or moved out
	overflow bool
}

// dirWatcher reports dirEvents for some file names of one directory until Close, or until the
// directory itself goes away (then err says so).
type dirWatcher struct {
	f      *os.File
	names  []string
	events chan dirEvent // closed when the watch ends
	done   chan struct{}
	close  sync.Once
	err    error // why the watch ended; read after events is closed
}

// watchDir starts watching dir for names.
func watchDir(dir string, names ...string) (*dirWatcher, error) {
	fd, err := syscall.InotifyInit1(syscall.IN_CLOEXEC | syscall.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("inotify: %w", err)
	}
	const mask = syscall.IN_CREATE | syscall.IN_DELETE | syscall.IN_MOVED_FROM | syscall.IN_MOVED_TO |
		syscall.IN_DELETE_SELF | syscall.IN_MOVE_SELF | syscall.IN_ONLYDIR
	if _, err := syscall.InotifyAddWatch(fd, dir, mask); err != nil {
		syscall.Close(fd)
		return nil, fmt.Errorf("watching %s: %w", dir, err)
	}
	// A non-blocking descriptor goes to Go's poller: Read waits without a thread, and Close
	// ends a Read in progress.
	w := &dirWatcher{
		f:      os.NewFile(uintptr(fd), "inotify "+dir),
		names:  names,
		events: make(chan dirEvent, 16),
		done:   make(chan struct{}),
	}
	go w.read(dir)
	return w, nil
}

// Close ends the watch.
func (w *dirWatcher) Close() {
	w.close.Do(func() {
		close(w.done)
		w.f.Close()
	})
}

func (w *dirWatcher) read(dir string) {
	defer close(w.events)
	const header = syscall.SizeofInotifyEvent
	buf := make([]byte, 64*(header+syscall.NAME_MAX+1))
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			if !errors.Is(err, os.ErrClosed) {
				w.err = fmt.Errorf("reading the watch of %s: %w", dir, err)
			}
			return
		}
		for off := 0; off+header <= n; {
			// struct inotify_event: wd int32, mask, cookie, len uint32, then len bytes of
			// name padded with NULs.
			mask := binary.NativeEndian.Uint32(buf[off+4:])
			size := int(binary.NativeEndian.Uint32(buf[off+12:]))
			name := string(bytes.TrimRight(buf[off+header:off+header+size], "\x00"))
			off += header + size
			var ev dirEvent
			switch {
			case mask&syscall.IN_Q_OVERFLOW != 0:
				ev = dirEvent{overflow: true}
			case mask&(syscall.IN_DELETE_SELF|syscall.IN_MOVE_SELF|syscall.IN_IGNORED) != 0:
				w.err = fmt.Errorf("directory %s was removed or moved", dir)
				return
			case slices.Contains(w.names, name):
				ev = dirEvent{name: name, created: mask&(syscall.IN_CREATE|syscall.IN_MOVED_TO) != 0}
			default:
				continue
			}
			select {
			case w.events <- ev:
			case <-w.done:
				return
			}
		}
	}
}
