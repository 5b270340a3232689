package deviceplugin

// control.go: the control API, for a process other than the plugin's to fail and heal
// devices (the lab's "coronerctl chaos device-fail NODE DEVICE" through coroner-lab), and
// its client.
//
// HTTP/1.1 over a unix socket, JSON bodies:
//
//	GET  /devices             200 [{"id":"gpu-0","health":"Healthy","pci":"0000:10:00.0"}, ...]
//	POST /devices/{id}/fail   200 the device, now Unhealthy; 404 if there is no such device
//	POST /devices/{id}/heal   200 the device, now Healthy; 404 likewise
//
// Errors have a plain-text body of one line. By hand:
//
//	curl --unix-socket SOCKET -X POST http://plugin/devices/gpu-1/fail

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// ControlHandler is the control API's HTTP handler for p.
func ControlHandler(p *Plugin) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /devices", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, p.Devices())
	})
	setHealth := func(healthy bool) http.HandlerFunc {
		return func(w http.ResponseWriter, req *http.Request) {
			d, err := p.SetHealth(req.PathValue("id"), healthy)
			var unknown *UnknownDeviceError
			if errors.As(err, &unknown) {
				http.Error(w, err.Error(), http.StatusNotFound)
				return
			}
			writeJSON(w, d)
		}
	}
	mux.HandleFunc("POST /devices/{id}/fail", setHealth(false))
	mux.HandleFunc("POST /devices/{id}/heal", setHealth(true))
	return mux
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	// A failed write is the client's gone connection: nothing is left to tell it.
	_ = json.NewEncoder(w).Encode(v)
}

// ListenControl listens on a unix socket at path for the control API, replacing a stale
// file there.
func ListenControl(path string) (net.Listener, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	return net.Listen("unix", path)
}

// ServeControl serves the control API for p on l until ctx ends; it then closes l, which
// removes its socket.
func ServeControl(ctx context.Context, l net.Listener, p *Plugin) error {
	srv := &http.Server{Handler: ControlHandler(p), ReadHeaderTimeout: 10 * time.Second}
	stopped := context.AfterFunc(ctx, func() { srv.Close() })
	defer stopped()
	if err := srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// ControlClient calls a plugin's control API.
type ControlClient struct {
	http *http.Client
}

// NewControlClient returns a client of the control API served at the unix socket path.
func NewControlClient(path string) *ControlClient {
	dialer := &net.Dialer{}
	transport := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dialer.DialContext(ctx, "unix", path)
		},
	}
	return &ControlClient{http: &http.Client{Transport: transport}}
}

// List returns the plugin's devices in ID order.
func (c *ControlClient) List(ctx context.Context) ([]Device, error) {
	var out []Device
	return out, c.call(ctx, http.MethodGet, "/devices", &out)
}

// Fail marks the device unhealthy and returns it.
func (c *ControlClient) Fail(ctx context.Context, id string) (Device, error) {
	return c.setHealth(ctx, id, "fail")
}

// Heal marks the device healthy and returns it.
func (c *ControlClient) Heal(ctx context.Context, id string) (Device, error) {
	return c.setHealth(ctx, id, "heal")
}

func (c *ControlClient) setHealth(ctx context.Context, id, verb string) (Device, error) {
	var out Device
	if id == "" {
		return out, errors.New("no device ID")
	}
	return out, c.call(ctx, http.MethodPost, "/devices/"+url.PathEscape(id)+"/"+verb, &out)
}

// Close releases the client's idle connections.
func (c *ControlClient) Close() { c.http.CloseIdleConnections() }

func (c *ControlClient) call(ctx context.Context, method, path string, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, "http://plugin"+path, nil)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, strings.TrimSpace(string(msg)))
	}
	return json.NewDecoder(resp.Body).Decode(out)
}
