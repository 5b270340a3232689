package lab

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// setupNetwork creates the bridge, and per node the network namespace, the veth pair,
// addresses and routes; every object is recorded in the state as soon as it exists.
func (c Config) setupNetwork(st *State) error {
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: BridgeName}}
	if err := netlink.LinkAdd(br); err != nil {
		return fmt.Errorf("create bridge %s: %w", BridgeName, err)
	}
	if err := st.addLink(BridgeName); err != nil {
		return err
	}
	link, err := netlink.LinkByName(BridgeName)
	if err != nil {
		return err
	}
	for _, cidr := range []string{bridgeIP + "/24", APIServerIP + "/32"} {
		addr, _ := netlink.ParseAddr(cidr)
		if err := netlink.AddrAdd(link, addr); err != nil {
			return fmt.Errorf("add %s to %s: %w", cidr, BridgeName, err)
		}
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("set %s up: %w", BridgeName, err)
	}

	for _, n := range c.Nodes {
		if err := c.setupNodeNetwork(st, link, n); err != nil {
			return fmt.Errorf("%s: %w", n.Name, err)
		}
	}
	return nil
}

func (c Config) setupNodeNetwork(st *State, bridge netlink.Link, n Node) error {
	ns, err := createNamedNetns(n.Netns)
	if err != nil {
		return fmt.Errorf("create network namespace %s: %w", n.Netns, err)
	}
	defer ns.Close()
	if err := st.addNetns(n.Netns); err != nil {
		return err
	}

	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: n.HostVeth, MasterIndex: bridge.Attrs().Index},
		PeerName:      "eth0",
		PeerNamespace: netlink.NsFd(int(ns)),
	}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("create veth %s: %w", n.HostVeth, err)
	}
	if err := st.addLink(n.HostVeth); err != nil {
		return err
	}
	host, err := netlink.LinkByName(n.HostVeth)
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return err
	}
	// The host reaches every pod through its node.
	if err := netlink.RouteAdd(&netlink.Route{Dst: n.PodCIDR, Gw: n.IP, LinkIndex: bridge.Attrs().Index}); err != nil {
		return fmt.Errorf("host route to %s: %w", n.PodCIDR, err)
	}

	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := h.LinkSetUp(lo); err != nil {
		return err
	}
	eth0, err := h.LinkByName("eth0")
	if err != nil {
		return err
	}
	if err := h.AddrAdd(eth0, &netlink.Addr{IPNet: &net.IPNet{IP: n.IP, Mask: net.CIDRMask(24, 32)}}); err != nil {
		return fmt.Errorf("address %s: %w", n.IP, err)
	}
	if err := h.LinkSetUp(eth0); err != nil {
		return err
	}
	if err := h.RouteAdd(&netlink.Route{Gw: net.ParseIP(bridgeIP), LinkIndex: eth0.Attrs().Index}); err != nil {
		return fmt.Errorf("default route: %w", err)
	}
	// Pods of the other nodes are reached directly over the bridge.
	for _, o := range c.Nodes {
		if o.Name == n.Name {
			continue
		}
		if err := h.RouteAdd(&netlink.Route{Dst: o.PodCIDR, Gw: o.IP, LinkIndex: eth0.Attrs().Index}); err != nil {
			return fmt.Errorf("route to %s: %w", o.PodCIDR, err)
		}
	}
	// The node forwards between its pods (CNI bridge cni0) and eth0.
	return inNetns(n.NetnsPath(), func() error {
		return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644)
	})
}

// createNamedNetns creates a network namespace pinned at /run/netns/NAME, on a locked OS
// thread that returns to the original namespace afterwards.
func createNamedNetns(name string) (netns.NsHandle, error) {
	type result struct {
		ns  netns.NsHandle
		err error
	}
	res := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			res <- result{netns.None(), err}
			return
		}
		defer orig.Close()
		ns, err := netns.NewNamed(name) // also switches this thread into it
		if serr := netns.Set(orig); serr != nil {
			// Leave the thread locked: the runtime ends it with this goroutine.
			if err == nil {
				ns.Close()
			}
			res <- result{netns.None(), fmt.Errorf("return to the host network namespace: %w", serr)}
			return
		}
		runtime.UnlockOSThread()
		res <- result{ns, err}
	}()
	r := <-res
	return r.ns, r.err
}

// deleteNetns unmounts and removes /run/netns/NAME. The namespace itself (and the node
// end of its veth pair, which takes the host end with it) goes once no process is left
// in it.
func deleteNetns(name string) error {
	p := filepath.Join("/run/netns", name)
	if _, err := os.Lstat(p); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	err := netns.DeleteNamed(name)
	if err != nil {
		// Not mounted (a half-made one): remove the file.
		if rerr := os.Remove(p); rerr == nil || errors.Is(rerr, os.ErrNotExist) {
			return nil
		}
	}
	return err
}

// deleteLink removes a host interface; no error when it does not exist.
func deleteLink(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return err
	}
	return netlink.LinkDel(l)
}

// labLinks lists the host interfaces named like the lab's.
func labLinks() []string {
	links, _ := netlink.LinkList()
	var names []string
	for _, l := range links {
		name := l.Attrs().Name
		if name == BridgeName || strings.HasPrefix(name, VethPrefix) {
			names = append(names, name)
		}
	}
	return names
}

// labNetns lists the network namespaces named like the lab's.
func labNetns() []string {
	entries, _ := os.ReadDir("/run/netns")
	var names []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), NetnsPrefix) {
			names = append(names, e.Name())
		}
	}
	return names
}

// checkAddressesFree fails when the host routes any part of LabCIDR through an interface
// that is not the lab's, or has an address in it.
func checkAddressesFree() error {
	_, lab, _ := net.ParseCIDR(LabCIDR)
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: 0}, netlink.RT_FILTER_TABLE)
	if err != nil {
		routes, err = netlink.RouteList(nil, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
	}
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		// A wider route (10.0.0.0/8 over a VPN) is fine: the lab's are more specific.
		if ones, _ := r.Dst.Mask.Size(); ones < 16 || !lab.Contains(r.Dst.IP) {
			continue
		}
		name := "?"
		if l, err := netlink.LinkByIndex(r.LinkIndex); err == nil {
			name = l.Attrs().Name
		}
		if name == BridgeName || strings.HasPrefix(name, VethPrefix) {
			continue
		}
		return fmt.Errorf("the lab's addresses %s are in use on this machine: route %s dev %s", LabCIDR, r.Dst, name)
	}
	return nil
}
