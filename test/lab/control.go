package lab

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/coroner-dev/coroner/test/pki"
)

// writePKI creates the CA and every certificate and kubeconfig of the cluster.
func (c Config) writePKI() (*clusterPKI, error) {
	p, err := newClusterPKI(c.pkiDir())
	if err != nil {
		return nil, err
	}
	if err := p.newServiceAccountKey(); err != nil {
		return nil, err
	}
	if _, err := p.issue("apiserver", pki.CertRequest{
		CommonName: "kube-apiserver",
		IPs:        []net.IP{net.ParseIP(APIServerIP), net.ParseIP(bridgeIP), net.ParseIP("127.0.0.1")},
		DNSNames:   []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		Server:     true,
	}); err != nil {
		return nil, err
	}
	// The API server's client certificate towards the kubelets (logs, exec, port-forward).
	if _, err := p.issue("apiserver-kubelet-client", pki.CertRequest{CommonName: "kube-apiserver-kubelet-client", Organization: []string{"system:masters"}}); err != nil {
		return nil, err
	}
	if err := p.frontProxy(); err != nil {
		return nil, err
	}
	kubeconfigs := []struct{ file, cn, org string }{
		{c.Kubeconfig(), "coroner-lab-admin", "system:masters"},
		{filepath.Join(p.dir, "controller-manager.kubeconfig"), "system:kube-controller-manager", ""},
		{filepath.Join(p.dir, "scheduler.kubeconfig"), "system:kube-scheduler", ""},
	}
	for _, n := range c.Nodes {
		kubeconfigs = append(kubeconfigs, struct{ file, cn, org string }{
			filepath.Join(p.dir, n.Name+".kubeconfig"), "system:node:" + n.Name, "system:nodes"})
		if _, err := p.issue(n.Name+"-serving", pki.CertRequest{
			CommonName: n.Name, IPs: []net.IP{n.IP}, DNSNames: []string{n.Name}, Server: true,
		}); err != nil {
			return nil, err
		}
	}
	for _, k := range kubeconfigs {
		var orgs []string
		if k.org != "" {
			orgs = []string{k.org}
		}
		if err := p.kubeconfig(k.file, k.cn, orgs); err != nil {
			return nil, err
		}
	}
	return p, nil
}

func hostPort(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

// startEtcd starts etcd on 127.0.0.1 and waits until it accepts connections.
func (c Config) startEtcd(ctx context.Context, st *State) error {
	client, peer := "http://"+hostPort(EtcdClientPort), "http://"+hostPort(EtcdPeerPort)
	p, err := c.startControl(st, "etcd",
		"--name=coroner-lab",
		"--data-dir="+c.etcdDir(),
		"--listen-client-urls="+client,
		"--advertise-client-urls="+client,
		"--listen-peer-urls="+peer,
		"--initial-advertise-peer-urls="+peer,
		"--initial-cluster=coroner-lab="+peer,
		"--unsafe-no-fsync",
		"--log-level=warn",
	)
	if err != nil {
		return err
	}
	return waitTCP(ctx, p, hostPort(EtcdClientPort), 30*time.Second)
}

// startAPIServer starts kube-apiserver on APIServerIP:APIServerPort and waits for /readyz.
func (c Config) startAPIServer(ctx context.Context, st *State, p *clusterPKI) error {
	d := p.dir
	proc, err := c.startControl(st, "kube-apiserver",
		"--etcd-servers=http://"+hostPort(EtcdClientPort),
		"--bind-address="+APIServerIP,
		"--advertise-address="+APIServerIP,
		fmt.Sprintf("--secure-port=%d", APIServerPort),
		"--tls-cert-file="+filepath.Join(d, "apiserver.crt"),
		"--tls-private-key-file="+filepath.Join(d, "apiserver.key"),
		"--client-ca-file="+p.caFile(),
		"--kubelet-client-certificate="+filepath.Join(d, "apiserver-kubelet-client.crt"),
		"--kubelet-client-key="+filepath.Join(d, "apiserver-kubelet-client.key"),
		"--kubelet-certificate-authority="+p.caFile(),
		"--kubelet-preferred-address-types=InternalIP,Hostname",
		"--service-account-key-file="+p.saKeyFile(),
		"--service-account-signing-key-file="+p.saKeyFile(),
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-cluster-ip-range="+ServiceCIDR,
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		// No kube-proxy: webhooks and aggregated APIs (the platforms' managers, Kueue's
		// visibility API) are reached at their Services' endpoints, the pod IPs this
		// machine routes to, not at ClusterIPs nothing serves.
		"--enable-aggregator-routing=true",
		// The aggregation layer's front proxy, as kubeadm sets it up: the API server
		// forwards to an aggregated API (Kueue's visibility API) with a client certificate
		// of front-proxy-client and the user in X-Remote-* headers, which the aggregated
		// server trusts through the extension-apiserver-authentication ConfigMap. Without
		// it Kueue's visibility API answered 403, its APIServices were unavailable, and the
		// namespace controller, whose discovery then fails, never finished deleting a
		// namespace.
		"--requestheader-client-ca-file="+p.frontProxyCAFile(),
		"--requestheader-allowed-names="+frontProxyClientCN,
		"--requestheader-username-headers=X-Remote-User",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--proxy-client-cert-file="+filepath.Join(d, "front-proxy-client.crt"),
		"--proxy-client-key-file="+filepath.Join(d, "front-proxy-client.key"),
		"--allow-privileged=true",
		"--profiling=false",
		"--v=1",
	)
	if err != nil {
		return err
	}
	cs, err := c.Clientset()
	if err != nil {
		return err
	}
	deadline := time.Now().Add(90 * time.Second)
	var last error
	for {
		if !proc.running() {
			return fmt.Errorf("kube-apiserver exited during start-up:\n%s", logTail(proc.Log, 3000))
		}
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(rctx)
		cancel()
		if err == nil && string(body) == "ok" {
			return nil
		}
		last = err
		if time.Now().After(deadline) {
			return fmt.Errorf("kube-apiserver not ready within 90s (%v):\n%s", last, logTail(proc.Log, 3000))
		}
		if err := Sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
}

// startControllers starts kube-controller-manager and kube-scheduler and waits until both
// answer on their secure ports.
func (c Config) startControllers(ctx context.Context, st *State, p *clusterPKI) error {
	kcmKC := filepath.Join(p.dir, "controller-manager.kubeconfig")
	kcm, err := c.startControl(st, "kube-controller-manager",
		"--kubeconfig="+kcmKC,
		"--authentication-kubeconfig="+kcmKC,
		"--authorization-kubeconfig="+kcmKC,
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", KCMPort),
		"--leader-elect=false",
		"--cluster-name=coroner-lab",
		"--use-service-account-credentials=true",
		"--service-account-private-key-file="+p.saKeyFile(),
		"--root-ca-file="+p.caFile(),
		"--cluster-signing-cert-file="+p.caFile(),
		"--cluster-signing-key-file="+p.caKeyFile(),
		"--node-monitor-period=2s",
		"--node-monitor-grace-period=20s",
		// Not /usr/libexec/kubernetes/..., which it would create.
		"--flex-volume-plugin-dir="+filepath.Join(c.Dir, "controller-manager", "volume-plugins"),
		"--profiling=false",
		"--v=1",
	)
	if err != nil {
		return err
	}
	schedKC := filepath.Join(p.dir, "scheduler.kubeconfig")
	sched, err := c.startControl(st, "kube-scheduler",
		"--kubeconfig="+schedKC,
		"--authentication-kubeconfig="+schedKC,
		"--authorization-kubeconfig="+schedKC,
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", SchedulerPort),
		"--leader-elect=false",
		"--profiling=false",
		"--v=1",
	)
	if err != nil {
		return err
	}
	if err := waitHealthz(ctx, kcm, KCMPort); err != nil {
		return err
	}
	return waitHealthz(ctx, sched, SchedulerPort)
}

// waitDefaultServiceAccount waits until pods can be created in the default namespace: the
// `default` ServiceAccount (service-account controller) and the kube-root-ca.crt ConfigMap
// (root-ca-cert-publisher) that every projected token volume mounts.
func (c Config) waitDefaultServiceAccount(ctx context.Context) error {
	cs, err := c.Clientset()
	if err != nil {
		return err
	}
	return Poll(ctx, 60*time.Second, "the default ServiceAccount and kube-root-ca.crt", func() (bool, error) {
		if _, err := cs.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{}); err != nil {
			return false, nil
		}
		_, err := cs.CoreV1().ConfigMaps("default").Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		return err == nil, nil
	})
}

func (c Config) startControl(st *State, name string, args ...string) (Proc, error) {
	p, err := startDaemon(name, c.bin(name), args, c.logPath(name), "")
	if err != nil {
		return p, err
	}
	return p, st.addProc(p)
}

// RESTConfig is the cluster-admin client configuration of the lab.
func (c Config) RESTConfig() (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig())
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = 50, 100
	return cfg, nil
}

// Clientset is a cluster-admin client of the lab.
func (c Config) Clientset() (*kubernetes.Clientset, error) {
	cfg, err := c.RESTConfig()
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}

// waitTCP waits until something accepts connections on addr, or the process exits.
func waitTCP(ctx context.Context, p Proc, addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if !p.running() {
			return fmt.Errorf("%s exited before listening on %s:\n%s", p.Name, addr, logTail(p.Log, 3000))
		}
		conn, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			conn.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not listen on %s within %v:\n%s", p.Name, addr, timeout, logTail(p.Log, 3000))
		}
		if err := Sleep(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
}

// waitHealthz waits until https://127.0.0.1:port/healthz answers ok.
func waitHealthz(ctx context.Context, p Proc, port int) error {
	client := &http.Client{
		Timeout:   time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, // self-signed serving cert of a local component
	}
	url := fmt.Sprintf("https://%s/healthz", hostPort(port))
	deadline := time.Now().Add(60 * time.Second)
	for {
		if !p.running() {
			return fmt.Errorf("%s exited during start-up:\n%s", p.Name, logTail(p.Log, 3000))
		}
		resp, err := client.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %s not ok within 60s:\n%s", p.Name, url, logTail(p.Log, 3000))
		}
		if err := Sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
}

// logTail returns the last n bytes of a log file, from a line start.
func logTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	if len(b) > n {
		b = b[len(b)-n:]
		for i, ch := range b {
			if ch == '\n' {
				b = b[i+1:]
				break
			}
		}
	}
	return "  | " + indentLines(string(b), "  | ")
}

// Sleep waits for d or until ctx ends; ctx's error in the second case.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Poll calls f at once and then every 250ms until it returns true or an error, or timeout
// passes ("timed out after ... waiting for what"), or ctx ends (its error).
func Poll(ctx context.Context, timeout time.Duration, what string, f func() (bool, error)) error {
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, timeout, true, func(context.Context) (bool, error) { return f() })
	if wait.Interrupted(err) && ctx.Err() == nil {
		return fmt.Errorf("timed out after %v waiting for %s", timeout, what)
	}
	return err
}
