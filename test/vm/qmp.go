package vm

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"time"
)

// Status asks QEMU over its QMP socket (Machine.QMP) what state the guest is in:
// "running", or why it is not ("io-error": QEMU stopped the guest on a disk write it could
// not do, such as a full host disk; "internal-error", "guest-panicked", "paused", ...).
func Status(ctx context.Context, sock string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return "", fmt.Errorf("QMP %s: %w", sock, err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	r := bufio.NewReader(conn)
	// The greeting, then one command at a time; asynchronous events may come between.
	if _, err := r.ReadBytes('\n'); err != nil {
		return "", fmt.Errorf("QMP %s: no greeting: %w", sock, err)
	}
	if _, err := qmpCall(conn, r, "qmp_capabilities"); err != nil {
		return "", fmt.Errorf("QMP %s: %w", sock, err)
	}
	ret, err := qmpCall(conn, r, "query-status")
	if err != nil {
		return "", fmt.Errorf("QMP %s: %w", sock, err)
	}
	return parseQueryStatus(ret)
}

// qmpCall sends one command and returns its "return" value, skipping events.
func qmpCall(conn net.Conn, r *bufio.Reader, command string) (json.RawMessage, error) {
	if _, err := fmt.Fprintf(conn, "{\"execute\":%q}\n", command); err != nil {
		return nil, err
	}
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			return nil, fmt.Errorf("%s: %w", command, err)
		}
		var msg struct {
			Return json.RawMessage `json:"return"`
			Error  *struct {
				Class string `json:"class"`
				Desc  string `json:"desc"`
			} `json:"error"`
			Event string `json:"event"`
		}
		if err := json.Unmarshal(line, &msg); err != nil {
			return nil, fmt.Errorf("%s: %w in %q", command, err, line)
		}
		switch {
		case msg.Event != "":
			continue
		case msg.Error != nil:
			return nil, fmt.Errorf("%s: %s: %s", command, msg.Error.Class, msg.Error.Desc)
		case msg.Return != nil:
			return msg.Return, nil
		}
	}
}

// parseQueryStatus is the status of query-status's return value.
func parseQueryStatus(ret json.RawMessage) (string, error) {
	var st struct {
		Status  string `json:"status"`
		Running bool   `json:"running"`
	}
	if err := json.Unmarshal(ret, &st); err != nil {
		return "", fmt.Errorf("query-status: %w in %s", err, ret)
	}
	if st.Status == "" {
		return "", fmt.Errorf("query-status: no status in %s", ret)
	}
	return st.Status, nil
}
