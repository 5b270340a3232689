package harness

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/coroner-dev/coroner/test/host"
)

// freePorts returns n distinct TCP ports on 127.0.0.1 that were free a moment ago. The
// listeners are held until all ports are chosen, so the n ports differ from each other;
// another program may still take one before our child binds it, which Start handles by
// retrying with new ports.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		listeners = append(listeners, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// waitTCP waits until something accepts connections on addr, the process exits, or the
// timeout passes.
func waitTCP(p *host.Process, addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if done, err := p.Exited(); done {
			return fmt.Errorf("%s exited before listening on %s: %v\n%s", p.Name(), addr, err, p.LogTail(4000))
		}
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not listen on %s within %v\n%s", p.Name(), addr, timeout, p.LogTail(4000))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// errPortTaken tells Start to try again with other ports.
var errPortTaken = errors.New("port taken")

func hostPort(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }
