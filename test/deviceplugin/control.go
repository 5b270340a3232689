package deviceplugin

// control.go: the control API, for a process other than the plugin's to fail and heal
// devices (the lab's "coronerctl chaos device-fail NODE DEVICE" through coroner-lab), and
// its client.
//
// HTTP/1.1 over a unix socket, JSON bodies:
//
//	GET  /devices                 200 [{"id":"GPU-0","health":"Healthy","pci":"0000:10:00.0"}, ...]
//	POST /devices/{id}/fail       200 the device, now Unhealthy; 404 if there is no such device
//	POST /devices/{id}/fail?xid=N 200 the same, after an Xid line for the device's PCI address
//	                              in the kernel log ("xid" in the answer: the line); 400 for a
//	                              bad N, 500 when the kernel log cannot be written (nothing
//	                              changed then)
//	POST /devices/{id}/heal       200 the device, now Healthy; 404 likewise
//	POST /devices/{id}/xid?code=N 200 the device, its health unchanged, after an Xid line
//	                              for its PCI address in the kernel log; 400 for a bad N
//
// Errors have a plain-text body of one line. By hand:
//
//	curl --unix-socket SOCKET -X POST 'http://plugin/devices/GPU-1/fail?xid=79'

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
	"strconv"
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
			var res FailResult
			var err error
			if xid := req.URL.Query().Get("xid"); xid != "" && !healthy {
				code, perr := strconv.Atoi(xid)
				if perr != nil || code < MinXid || code > MaxXid {
					http.Error(w, fmt.Sprintf("xid %q: want a number from %d to %d", xid, MinXid, MaxXid), http.StatusBadRequest)
					return
				}
				res.Device, res.Xid, err = p.FailWithXid(req.PathValue("id"), code)
			} else {
				res.Device, err = p.SetHealth(req.PathValue("id"), healthy)
			}
			var unknown *UnknownDeviceError
			switch {
			case errors.As(err, &unknown):
				http.Error(w, err.Error(), http.StatusNotFound)
				return
			case err != nil:
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			writeJSON(w, res)
		}
	}
	mux.HandleFunc("POST /devices/{id}/fail", setHealth(false))
	mux.HandleFunc("POST /devices/{id}/heal", setHealth(true))
	mux.HandleFunc("POST /devices/{id}/xid", func(w http.ResponseWriter, req *http.Request) {
		q := req.URL.Query().Get("code")
		code, perr := strconv.Atoi(q)
		if perr != nil || code < MinXid || code > MaxXid {
			http.Error(w, fmt.Sprintf("code %q: want an Xid number from %d to %d", q, MinXid, MaxXid), http.StatusBadRequest)
			return
		}
		var res FailResult
		var err error
		res.Device, res.Xid, err = p.WriteXid(req.PathValue("id"), code)
		var unknown *UnknownDeviceError
		switch {
		case errors.As(err, &unknown):
			http.Error(w, err.Error(), http.StatusNotFound)
		case err != nil:
			http.Error(w, err.Error(), http.StatusInternalServerError)
		default:
			writeJSON(w, res)
		}
	})
	return mux
}

// FailResult is the control API's answer to fail and heal: the device, and the Xid line
// written to the kernel log, if any.
type FailResult struct {
	Device
	Xid string `json:"xid,omitempty"`
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
	r, err := c.setHealth(ctx, id, "fail", 0)
	return r.Device, err
}

// FailWithXid writes an Xid line of code for the device's PCI address to its node's
// kernel log, then marks the device unhealthy; it returns the device and the line.
func (c *ControlClient) FailWithXid(ctx context.Context, id string, code int) (Device, string, error) {
	if code < MinXid || code > MaxXid {
		return Device{}, "", fmt.Errorf("xid %d: want a number from %d to %d", code, MinXid, MaxXid)
	}
	r, err := c.setHealth(ctx, id, "fail", code)
	return r.Device, r.Xid, err
}

// Heal marks the device healthy and returns it.
func (c *ControlClient) Heal(ctx context.Context, id string) (Device, error) {
	r, err := c.setHealth(ctx, id, "heal", 0)
	return r.Device, err
}

func (c *ControlClient) setHealth(ctx context.Context, id, verb string, xid int) (FailResult, error) {
	var out FailResult
	if id == "" {
		return out, errors.New("no device ID")
	}
	path := "/devices/" + url.PathEscape(id) + "/" + verb
	if xid != 0 {
		path += "?xid=" + strconv.Itoa(xid)
	}
	return out, c.call(ctx, http.MethodPost, path, &out)
}

// Close releases the client's idle connections.
// WriteXid writes an Xid line of code for the device's PCI address to its node's kernel
// log, its health left as it is; it returns the device and the line.
func (c *ControlClient) WriteXid(ctx context.Context, id string, code int) (Device, string, error) {
	if id == "" {
		return Device{}, "", errors.New("no device ID")
	}
	if code < MinXid || code > MaxXid {
		return Device{}, "", fmt.Errorf("xid %d: want a number from %d to %d", code, MinXid, MaxXid)
	}
	var out FailResult
	err := c.call(ctx, http.MethodPost, "/devices/"+url.PathEscape(id)+"/xid?code="+strconv.Itoa(code), &out)
	return out.Device, out.Xid, err
}

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
