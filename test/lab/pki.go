package lab

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// certValidity is how long the lab's certificates are valid: a lab may run for weeks
// (test/harness's certificates last a day, enough for a test run).
const certValidity = 365 * 24 * time.Hour

// pki is the lab's certificate authority and the files it wrote.
type pki struct {
	dir    string
	caCert *x509.Certificate
	caKey  crypto.Signer
	caPEM  []byte
}

// certRequest describes a leaf certificate.
type certRequest struct {
	cn     string
	orgs   []string
	ips    []net.IP
	dns    []string
	server bool
}

func newPKI(dir string) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "coroner-lab-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(certValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	p := &pki{dir: dir, caCert: cert, caKey: key, caPEM: pemBlock("CERTIFICATE", der)}
	if err := os.WriteFile(p.caFile(), p.caPEM, 0o644); err != nil {
		return nil, err
	}
	return p, os.WriteFile(p.caKeyFile(), pemBlock("EC PRIVATE KEY", keyDER), 0o600)
}

func (p *pki) caFile() string    { return filepath.Join(p.dir, "ca.crt") }
func (p *pki) caKeyFile() string { return filepath.Join(p.dir, "ca.key") }
func (p *pki) saKeyFile() string { return filepath.Join(p.dir, "service-account.key") }

// issue signs a leaf certificate and writes dir/name.crt and dir/name.key.
func (p *pki) issue(name string, req certRequest) (certFile, keyFile string, certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", nil, nil, err
	}
	usages := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	if req.server {
		usages = append(usages, x509.ExtKeyUsageServerAuth)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: req.cn, Organization: req.orgs},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(certValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  usages,
		IPAddresses:  req.ips,
		DNSNames:     req.dns,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, key.Public(), p.caKey)
	if err != nil {
		return "", "", nil, nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return "", "", nil, nil, err
	}
	certPEM, keyPEM = pemBlock("CERTIFICATE", der), pemBlock("PRIVATE KEY", keyDER)
	certFile, keyFile = filepath.Join(p.dir, name+".crt"), filepath.Join(p.dir, name+".key")
	if err := os.WriteFile(certFile, certPEM, 0o644); err != nil {
		return "", "", nil, nil, err
	}
	return certFile, keyFile, certPEM, keyPEM, os.WriteFile(keyFile, keyPEM, 0o600)
}

// kubeconfig issues a client certificate and writes a kubeconfig with it embedded.
func (p *pki) kubeconfig(path, cn string, orgs []string) error {
	_, _, certPEM, keyPEM, err := p.issue(filepath.Base(path)+"-client", certRequest{cn: cn, orgs: orgs})
	if err != nil {
		return err
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["coroner-lab"] = &clientcmdapi.Cluster{Server: APIServerURL(), CertificateAuthorityData: p.caPEM}
	kc.AuthInfos[cn] = &clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: keyPEM}
	kc.Contexts["coroner-lab"] = &clientcmdapi.Context{Cluster: "coroner-lab", AuthInfo: cn}
	kc.CurrentContext = "coroner-lab"
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return err
	}
	return os.Chmod(path, 0o600)
}

// newServiceAccountKey writes the key that signs service-account tokens. kube-apiserver
// reads the public half from the same file, which works for SEC1 "EC PRIVATE KEY".
func (p *pki) newServiceAccountKey() error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return os.WriteFile(p.saKeyFile(), pemBlock("EC PRIVATE KEY", der), 0o600)
}

func pemBlock(kind string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der})
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		panic(err)
	}
	return n
}
