// Command cni is coroner-kind-cni, the pod network of test/kind's clusters (kindnetd, kind's
// own, cannot be built from the module proxy). It runs on every node as a host-network
// DaemonSet (test/kind/cni.yaml, kind's /kind/manifests/default-cni.yaml in the node image)
// and, every few seconds:
//   - writes the node's CNI configuration for its own pod CIDR (Debian's ptp + host-local +
//     portmap, as kindnetd does) once the controller manager has given it one;
//   - routes every other node's pod CIDR via that node's InternalIP (the nodes share one
//     docker bridge), and removes the routes it made for nodes that are gone (its routes are
//     marked with routing protocol 77).
//
// It talks to the API server at $CONTROL_PLANE_ENDPOINT when set (kind adds it to the
// DaemonSet, as for kindnetd), not through the kubernetes Service. IPv4 only.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// routeProtocol marks the routes this program owns.
const routeProtocol = netlink.RouteProtocol(77)

func main() {
	confDir := flag.String("conf-dir", "/etc/cni/net.d", "CNI configuration directory of the node")
	interval := flag.Duration("interval", 5*time.Second, "how often to reconcile")
	flag.Parse()
	node := os.Getenv("NODE_NAME")
	if node == "" {
		log.Fatal("NODE_NAME is not set")
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		log.Fatal(err)
	}
	// kind sets CONTROL_PLANE_ENDPOINT (host:port) in the DaemonSet: the API server is
	// reachable before kube-proxy has programmed the kubernetes Service.
	if ep := os.Getenv("CONTROL_PLANE_ENDPOINT"); ep != "" {
		cfg.Host = "https://" + ep
	}
	cfg.Timeout = 10 * time.Second
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer cancel()
	log.Printf("coroner-kind-cni on node %s, conf dir %s", node, *confDir)
	for {
		if err := reconcile(ctx, client, node, *confDir); err != nil {
			log.Print(err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(*interval):
		}
	}
}

func reconcile(ctx context.Context, client kubernetes.Interface, self, confDir string) error {
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	want := map[string]net.IP{} // pod CIDR -> gateway
	for _, n := range nodes.Items {
		cidr := n.Spec.PodCIDR
		if cidr == "" {
			continue
		}
		if n.Name == self {
			if err := writeConf(confDir, cidr); err != nil {
				return err
			}
			continue
		}
		if ip := internalIP(n); ip != nil {
			want[cidr] = ip
		}
	}
	for cidr, gw := range want {
		_, dst, err := net.ParseCIDR(cidr)
		if err != nil || dst.IP.To4() == nil {
			continue
		}
		r := &netlink.Route{Dst: dst, Gw: gw, Protocol: routeProtocol}
		if err := netlink.RouteReplace(r); err != nil {
			return fmt.Errorf("route %s via %s: %w", cidr, gw, err)
		}
	}
	have, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Protocol: routeProtocol}, netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		return fmt.Errorf("list routes: %w", err)
	}
	for _, r := range have {
		if r.Dst == nil {
			continue
		}
		if gw, ok := want[r.Dst.String()]; !ok || !gw.Equal(r.Gw) {
			if err := netlink.RouteDel(&r); err != nil {
				return fmt.Errorf("delete route %s: %w", r.Dst, err)
			}
			log.Printf("route %s via %s removed", r.Dst, r.Gw)
		}
	}
	return nil
}

func internalIP(n corev1.Node) net.IP {
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			if ip := net.ParseIP(a.Address); ip != nil && ip.To4() != nil {
				return ip
			}
		}
	}
	return nil
}

// conf is kindnetd's configuration, for Debian's CNI plugins 1.1.1.
func conf(podCIDR string) []byte {
	return []byte(fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": "coroner-kind",
  "plugins": [
    {"type": "ptp", "ipMasq": false, "mtu": 1500,
     "ipam": {"type": "host-local", "dataDir": "/run/cni-ipam-state", "routes": [{"dst": "0.0.0.0/0"}],
              "ranges": [[{"subnet": %q}]]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, podCIDR))
}

// writeConf writes 10-coroner.conflist unless it holds the same already (write and rename:
// containerd watches the directory).
func writeConf(dir, podCIDR string) error {
	path := filepath.Join(dir, "10-coroner.conflist")
	data := conf(podCIDR)
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		return nil
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	log.Printf("wrote %s for pod CIDR %s", path, podCIDR)
	return nil
}
