package lab

import (
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/coroner-dev/coroner/test/pki"
)

// certValidity is how long the lab's certificates are valid: a lab may run for weeks
// (test/harness's certificates last a day, enough for a test run).
const certValidity = 365 * 24 * time.Hour

// clusterPKI is the lab's certificate authority and the files it writes in dir.
type clusterPKI struct {
	dir string
	ca  *pki.CA
}

// newClusterPKI makes a new CA and writes its certificate and key (the controller-manager
// signs with it).
func newClusterPKI(dir string) (*clusterPKI, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	ca, err := pki.NewCA("coroner-lab-ca", certValidity)
	if err != nil {
		return nil, err
	}
	p := &clusterPKI{dir: dir, ca: ca}
	key, err := ca.KeyPEM()
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(p.caFile(), ca.PEM, 0o644); err != nil {
		return nil, err
	}
	return p, os.WriteFile(p.caKeyFile(), key, 0o600)
}

func (p *clusterPKI) caFile() string    { return filepath.Join(p.dir, "ca.crt") }
func (p *clusterPKI) caKeyFile() string { return filepath.Join(p.dir, "ca.key") }
func (p *clusterPKI) saKeyFile() string { return filepath.Join(p.dir, "service-account.key") }

// issue signs a leaf certificate and writes dir/name.crt and dir/name.key.
func (p *clusterPKI) issue(name string, req pki.CertRequest) (pki.KeyPair, error) {
	kp, err := p.ca.Issue(req)
	if err != nil {
		return kp, err
	}
	_, _, err = kp.WriteFiles(p.dir, name)
	return kp, err
}

// kubeconfig issues a client certificate and writes a kubeconfig with it embedded.
func (p *clusterPKI) kubeconfig(path, cn string, orgs []string) error {
	kp, err := p.issue(filepath.Base(path)+"-client", pki.CertRequest{CommonName: cn, Organization: orgs})
	if err != nil {
		return err
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["coroner-lab"] = &clientcmdapi.Cluster{Server: APIServerURL(), CertificateAuthorityData: p.ca.PEM}
	kc.AuthInfos[cn] = &clientcmdapi.AuthInfo{ClientCertificateData: kp.CertPEM, ClientKeyData: kp.KeyPEM}
	kc.Contexts["coroner-lab"] = &clientcmdapi.Context{Cluster: "coroner-lab", AuthInfo: cn}
	kc.CurrentContext = "coroner-lab"
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return err
	}
	return os.Chmod(path, 0o600)
}

// newServiceAccountKey writes the key that signs service-account tokens.
func (p *clusterPKI) newServiceAccountKey() error {
	key, err := pki.NewServiceAccountKey()
	if err != nil {
		return err
	}
	return os.WriteFile(p.saKeyFile(), key, 0o600)
}

// frontProxyClientCN is the common name of the API server's client certificate towards
// aggregated APIs (--requestheader-allowed-names), kubeadm's.
const frontProxyClientCN = "front-proxy-client"

func (p *clusterPKI) frontProxyCAFile() string { return filepath.Join(p.dir, "front-proxy-ca.crt") }

// frontProxy writes a CA of its own for the aggregation layer (as kubeadm does: a client
// certificate of the cluster's CA must not be able to pose as the front proxy) and the
// API server's front-proxy-client certificate signed by it.
func (p *clusterPKI) frontProxy() error {
	ca, err := pki.NewCA("coroner-lab-front-proxy-ca", certValidity)
	if err != nil {
		return err
	}
	if err := os.WriteFile(p.frontProxyCAFile(), ca.PEM, 0o644); err != nil {
		return err
	}
	kp, err := ca.Issue(pki.CertRequest{CommonName: frontProxyClientCN})
	if err != nil {
		return err
	}
	_, _, err = kp.WriteFiles(p.dir, "front-proxy-client")
	return err
}
