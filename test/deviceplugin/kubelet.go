package deviceplugin

// kubelet.go: Run, which serves the plugin's socket and keeps the plugin registered with
// the kubelet across the kubelet's restarts.
//
// When a kubelet starts, its device manager deletes every socket in the device-plugins
// directory (the plugins' and the old kubelet.sock) and then listens on a new kubelet.sock;
// it remembers no plugin. A plugin must therefore notice that its socket was deleted (listen
// again) and that kubelet.sock was created (register again). Run watches the directory with
// inotify for both.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/utils/clock"
)

// Run serves the plugin on SocketPath and registers it with the kubelet at
// KubeletSocketPath, until ctx ends; it then stops serving and removes its socket. It makes
// the directory if need be, writes the state directory's files (state.go) and waits for
// kubelet.sock to appear. It listens again when its
// socket is deleted and registers again whenever kubelet.sock is created; a failed
// registration is retried after 1 s, 2 s, ... up to Options.RetryMax. It returns an error
// only if it cannot serve or watch the directory. Run once at a time.
func (p *Plugin) Run(ctx context.Context) error {
	r := &runner{p: p, logger: klog.FromContext(ctx).WithValues("resource", p.opts.ResourceName)}
	if err := os.MkdirAll(p.opts.Dir, 0o750); err != nil {
		return err
	}
	if err := p.writeState(); err != nil {
		return fmt.Errorf("state dir %s: %w", p.opts.StateDir, err)
	}
	// Watch before listening and registering, so that no kubelet restart is missed.
	w, err := watchDir(p.opts.Dir, p.opts.SocketName, KubeletSocketName)
	if err != nil {
		return err
	}
	defer w.Close()
	defer r.stop()
	if err := r.serve(); err != nil {
		return err
	}
	r.wantRegister = true
	for {
		if r.wantRegister && r.retry == nil {
			r.tryRegister(ctx)
		}
		var retry <-chan time.Time
		if r.retry != nil {
			retry = r.retry.C()
		}
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.events:
			if !ok {
				return w.err
			}
			// Take every event already here before acting: a kubelet's restart is a
			// burst (sockets deleted, kubelet.sock created) that one pass handles.
			checkSocket := r.note(ev)
			for more := true; more; {
				select {
				case ev, ok := <-w.events:
					if !ok {
						return w.err
					}
					checkSocket = r.note(ev) || checkSocket
				default:
					more = false
				}
			}
			if checkSocket && !r.socketIsOurs() {
				r.logger.Info("The plugin's socket is gone; listening again", "socket", p.SocketPath())
				r.stop()
				if err := r.serve(); err != nil {
					return err
				}
				r.registerNow()
			}
		case <-retry:
			r.retry = nil
		}
	}
}

// runner is Run's state; only Run's goroutine touches it.
type runner struct {
	p      *Plugin
	logger klog.Logger

	server *grpc.Server
	served chan struct{} // closed when server.Serve has returned
	inode  uint64        // of the socket file server listens on

	wantRegister bool
	waiting      bool        // for kubelet.sock to appear, said once in the log
	retry        clock.Timer // set while waiting to retry a failed registration
	backoff      time.Duration
}

// note takes one event into account and says whether the plugin's socket may be gone.
func (r *runner) note(ev dirEvent) (checkSocket bool) {
	switch {
	case ev.overflow:
		r.registerNow()
		return true
	case ev.name == KubeletSocketName && ev.created:
		r.logger.Info("kubelet.sock was created; registering again")
		r.registerNow()
	case ev.name == r.p.opts.SocketName && !ev.created:
		return true
	}
	return false
}

// registerNow makes the next pass register at once, whatever a failed attempt scheduled.
func (r *runner) registerNow() {
	r.wantRegister = true
	r.backoff = 0
	if r.retry != nil {
		r.retry.Stop()
		r.retry = nil
	}
}

// serve listens on the plugin's socket, replacing any stale file there, and serves the
// DevicePlugin service on it.
func (r *runner) serve() error {
	path := r.p.SocketPath()
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return err
	}
	fi, err := os.Stat(path)
	if err != nil {
		l.Close()
		return err
	}
	r.inode = fi.Sys().(*syscall.Stat_t).Ino
	r.server = grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(r.server, &service{p: r.p, logger: r.logger})
	r.served = make(chan struct{})
	go func(s *grpc.Server, served chan struct{}) {
		defer close(served)
		if err := s.Serve(l); err != nil {
			r.logger.Error(err, "Serving the device plugin failed", "socket", path)
		}
	}(r.server, r.served)
	r.logger.Info("Serving the device plugin", "socket", path)
	return nil
}

// socketIsOurs says whether the plugin's socket path is still the socket the server
// listens on. While the listener is open its inode cannot be reused.
func (r *runner) socketIsOurs() bool {
	fi, err := os.Stat(r.p.SocketPath())
	if err != nil {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && fi.Mode()&os.ModeSocket != 0 && st.Ino == r.inode
}

// stop stops the server, which ends the kubelet's ListAndWatch streams; closing the
// listener removes the socket file if it is still there.
func (r *runner) stop() {
	if r.server == nil {
		return
	}
	r.server.Stop()
	<-r.served
	r.server = nil
}

// tryRegister registers the plugin if kubelet.sock exists; if that fails it schedules a
// retry.
func (r *runner) tryRegister(ctx context.Context) {
	if _, err := os.Stat(r.p.KubeletSocketPath()); errors.Is(err, os.ErrNotExist) {
		if !r.waiting {
			r.logger.Info("Waiting for the kubelet's socket", "socket", r.p.KubeletSocketPath())
		}
		r.waiting = true
		return // its creation is an event
	}
	r.waiting = false
	if err := r.p.register(ctx); err != nil {
		if ctx.Err() != nil {
			return
		}
		r.backoff = min(max(2*r.backoff, time.Second), r.p.opts.RetryMax)
		r.logger.Error(err, "Registering with the kubelet failed", "retryIn", r.backoff)
		r.retry = r.p.clock.NewTimer(r.backoff)
		if r.p.onRetry != nil {
			r.p.onRetry(r.backoff)
		}
		return
	}
	r.wantRegister = false
	r.backoff = 0
	r.logger.Info("Registered with the kubelet", "socket", r.p.KubeletSocketPath(), "endpoint", r.p.opts.SocketName)
}

// register makes one Register call to the kubelet, which connects back to the plugin's
// socket and asks for its options before it answers.
func (p *Plugin) register(ctx context.Context) error {
	conn, err := grpc.NewClient("unix://"+p.KubeletSocketPath(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, p.opts.RegisterTimeout)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     p.opts.SocketName,
		ResourceName: p.opts.ResourceName,
		Options:      options(),
	})
	if err != nil {
		return fmt.Errorf("registering %s at %s: %w", p.opts.ResourceName, p.KubeletSocketPath(), err)
	}
	return nil
}
