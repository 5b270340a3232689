// Package harness starts a real etcd and kube-apiserver on 127.0.0.1 for integration tests,
// in the spirit of controller-runtime's envtest but with the binaries this repository builds
// itself (test/tools/build.sh: Kubernetes v1.36.3 and etcd v3.6 from their Go modules, into
// _output/bin).
//
// One API server is shared by all tests of a package:
//
//	func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }
//
//	func TestSomething(t *testing.T) {
//		env := harness.Shared(t)
//		client := kubernetes.NewForConfigOrDie(env.Config)
//		...
//	}
//
// Each test should work in its own namespace (env.Namespace(t)) so tests do not see each
// other's objects. The harness disables the ServiceAccount admission plugin: no
// kube-controller-manager runs by default, so no `default` ServiceAccount would ever appear
// and every pod create would be refused. Tests that need the built-in controllers start
// them with StartControllerManager.
//
// Processes are started with a parent-death signal and in their own process group, and
// Main stops them after the tests, so nothing is left behind even when a test fails,
// panics or times out.
package harness

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/coroner-dev/coroner/test/host"
	"github.com/coroner-dev/coroner/test/pki"
)

// KubeVersion is the Kubernetes version test/tools/build.sh builds.
const KubeVersion = "v1.36.3"

// Options tune Start. The zero value is what tests want.
type Options struct {
	// BinDir holds etcd and kube-apiserver; default $CORONER_BIN_DIR, else
	// <repository>/_output/bin.
	BinDir string
	// APIServerFlags are appended to the harness's own kube-apiserver flags (a later
	// --flag=value wins).
	APIServerFlags []string
	// Keep leaves the working directory (certificates, logs, etcd data) after Stop;
	// also set by CORONER_HARNESS_KEEP=1.
	Keep bool
}

// Env is a running etcd + kube-apiserver.
type Env struct {
	// Config authenticates as a cluster admin (client certificate in group system:masters).
	Config *rest.Config
	// Kubeconfig is the path of a kubeconfig file with the same credentials, for
	// binaries and kubectl.
	Kubeconfig string
	// Dir is the working directory: certificates, process logs, etcd data.
	Dir string
	// ServerVersion is the gitVersion the API server reports.
	ServerVersion string
	// StartupTime is how long Start took until /readyz answered ok.
	StartupTime time.Duration

	binDir string
	ca     *pki.CA
	keep   bool
	mu     sync.Mutex
	procs  []*host.Process // in start order; stopped in reverse
}

// Start launches etcd and kube-apiserver and waits until the API server is ready. On error
// everything it started is stopped again.
func Start(opts Options) (*Env, error) {
	binDir, err := resolveBinDir(opts.BinDir)
	if err != nil {
		return nil, err
	}
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		env, err := start(binDir, opts)
		if err == nil {
			return env, nil
		}
		lastErr = err
		if !errors.Is(err, errPortTaken) {
			break
		}
	}
	return nil, lastErr
}

func start(binDir string, opts Options) (_ *Env, err error) {
	began := time.Now()
	dir, err := os.MkdirTemp("", "coroner-harness-")
	if err != nil {
		return nil, err
	}
	env := &Env{Dir: dir, binDir: binDir, keep: opts.Keep || os.Getenv("CORONER_HARNESS_KEEP") == "1"}
	defer func() {
		if err != nil {
			env.Stop()
		}
	}()

	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	etcdClient, etcdPeer, apiPort := ports[0], ports[1], ports[2]

	etcd, err := env.startProcess("etcd",
		"--name=harness",
		"--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls=http://"+hostPort(etcdClient),
		"--advertise-client-urls=http://"+hostPort(etcdClient),
		"--listen-peer-urls=http://"+hostPort(etcdPeer),
		"--initial-advertise-peer-urls=http://"+hostPort(etcdPeer),
		"--initial-cluster=harness=http://"+hostPort(etcdPeer),
		"--unsafe-no-fsync",
		"--log-level=warn",
	)
	if err != nil {
		return nil, err
	}
	if err := waitTCP(etcd, hostPort(etcdClient), 20*time.Second); err != nil {
		return nil, portErr(err, etcd)
	}

	pki, err := env.writePKI()
	if err != nil {
		return nil, err
	}
	args := []string{
		"--etcd-servers=http://" + hostPort(etcdClient),
		"--etcd-prefix=/registry",
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", apiPort),
		"--tls-cert-file=" + pki.servingCert,
		"--tls-private-key-file=" + pki.servingKey,
		"--client-ca-file=" + pki.caFile,
		"--service-account-key-file=" + pki.saKey,
		"--service-account-signing-key-file=" + pki.saKey,
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-cluster-ip-range=10.0.0.0/24",
		"--authorization-mode=RBAC",
		"--disable-admission-plugins=ServiceAccount",
		"--allow-privileged=true",
		"--profiling=false",
		"--v=1",
	}
	args = append(args, opts.APIServerFlags...)
	apiserver, err := env.startProcess("kube-apiserver", args...)
	if err != nil {
		return nil, err
	}

	env.Config = &rest.Config{
		Host: "https://" + hostPort(apiPort),
		TLSClientConfig: rest.TLSClientConfig{
			CAData:   env.ca.PEM,
			CertData: pki.admin.CertPEM,
			KeyData:  pki.admin.KeyPEM,
		},
		QPS:   200,
		Burst: 400,
	}
	if err := env.waitReady(apiserver, 60*time.Second); err != nil {
		return nil, portErr(err, apiserver)
	}
	if err := env.installCRDs(30 * time.Second); err != nil {
		return nil, err
	}
	if env.Kubeconfig, err = writeKubeconfig(filepath.Join(dir, "admin.kubeconfig"), env.Config); err != nil {
		return nil, err
	}
	env.StartupTime = time.Since(began)
	return env, nil
}

type pkiFiles struct {
	caFile, servingCert, servingKey, saKey string
	admin                                  pki.KeyPair
}

func (e *Env) writePKI() (pkiFiles, error) {
	var f pkiFiles
	ca, err := pki.NewCA("coroner-harness-ca", 24*time.Hour)
	if err != nil {
		return f, err
	}
	e.ca = ca
	f.caFile = filepath.Join(e.Dir, "ca.crt")
	if err := os.WriteFile(f.caFile, ca.PEM, 0o600); err != nil {
		return f, err
	}
	serving, err := ca.Issue(pki.CertRequest{
		CommonName: "kube-apiserver",
		IPs:        []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.0.0.1")},
		DNSNames:   []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
		Server:     true,
	})
	if err != nil {
		return f, err
	}
	if f.servingCert, f.servingKey, err = serving.WriteFiles(e.Dir, "apiserver"); err != nil {
		return f, err
	}
	if f.admin, err = ca.Issue(pki.CertRequest{CommonName: "harness-admin", Organization: []string{"system:masters"}}); err != nil {
		return f, err
	}
	saKey, err := pki.NewServiceAccountKey()
	if err != nil {
		return f, err
	}
	f.saKey = filepath.Join(e.Dir, "service-account.key")
	return f, os.WriteFile(f.saKey, saKey, 0o600)
}

// waitReady polls /readyz until it answers ok, then reads the server version.
func (e *Env) waitReady(p *host.Process, timeout time.Duration) error {
	client, err := kubernetes.NewForConfig(e.Config)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	var lastErr error
	for time.Now().Before(deadline) {
		if done, werr := p.Exited(); done {
			return fmt.Errorf("kube-apiserver exited during start-up: %v\n%s", werr, p.LogTail(6000))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		body, err := client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		cancel()
		if err == nil && string(body) == "ok" {
			v, err := client.Discovery().ServerVersion()
			if err != nil {
				return fmt.Errorf("reading server version: %w", err)
			}
			e.ServerVersion = v.GitVersion
			return nil
		}
		lastErr = err
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("kube-apiserver not ready within %v (last error: %v)\n%s", timeout, lastErr, p.LogTail(6000))
}

// portErr marks a start-up failure caused by a port another program took meanwhile.
func portErr(err error, p *host.Process) error {
	if strings.Contains(p.LogTail(20000), "address already in use") {
		return fmt.Errorf("%w: %v", errPortTaken, err)
	}
	return err
}

func (e *Env) startProcess(name string, args ...string) (*host.Process, error) {
	bin := filepath.Join(e.binDir, name)
	p, err := host.StartProcess(e.Dir, name, bin, args...)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	e.procs = append(e.procs, p)
	e.mu.Unlock()
	return p, nil
}

// Stop stops every process the Env started, newest first, waits for them to exit and
// removes the working directory (unless Keep). It is safe to call more than once.
func (e *Env) Stop() {
	e.mu.Lock()
	procs := e.procs
	e.procs = nil
	e.mu.Unlock()
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].Stop(10 * time.Second)
	}
	if !e.keep && e.Dir != "" {
		os.RemoveAll(e.Dir)
	}
}

// PIDs returns the process IDs of the running children, for tests of the harness itself.
func (e *Env) PIDs() []int {
	e.mu.Lock()
	defer e.mu.Unlock()
	var pids []int
	for _, p := range e.procs {
		pids = append(pids, p.PID())
	}
	return pids
}

// Namespace creates a namespace named after the test and deletes it when the test ends.
func (e *Env) Namespace(t testing.TB) string {
	t.Helper()
	client := kubernetes.NewForConfigOrDie(e.Config)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: namespacePrefix(t.Name())}}
	ns, err := client.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating test namespace: %v", err)
	}
	t.Cleanup(func() {
		_ = client.CoreV1().Namespaces().Delete(context.Background(), ns.Name, metav1.DeleteOptions{})
	})
	return ns.Name
}

// namespacePrefix turns a test name into a valid namespace prefix.
func namespacePrefix(name string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(name) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	p := strings.Trim(b.String(), "-")
	if len(p) > 40 {
		p = strings.TrimRight(p[:40], "-")
	}
	return p + "-"
}

func writeKubeconfig(path string, cfg *rest.Config) (string, error) {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["harness"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData}
	kc.Contexts["harness"] = &clientcmdapi.Context{Cluster: "harness", AuthInfo: "admin"}
	kc.CurrentContext = "harness"
	return path, clientcmd.WriteToFile(*kc, path)
}

// resolveBinDir finds the folder with the harness binaries.
func resolveBinDir(dir string) (string, error) {
	if dir == "" {
		dir = os.Getenv("CORONER_BIN_DIR")
	}
	if dir == "" {
		root, err := host.RepoRoot()
		if err != nil {
			return "", err
		}
		dir = filepath.Join(root, "_output", "bin")
	}
	for _, name := range []string{"etcd", "kube-apiserver"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return "", fmt.Errorf("%w: %s not found in %s; run `make tools` (test/tools/build.sh) first", ErrNoBinaries, name, dir)
		}
	}
	return dir, nil
}

// ErrNoBinaries means the Kubernetes binaries have not been built.
var ErrNoBinaries = errors.New("harness binaries missing")
