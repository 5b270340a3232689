// Package pki makes the certificates of the test clusters (test/harness) and of the lab
// (test/lab): a CA kept in memory, leaf certificates for servers and clients, and the
// service-account signing key. ECDSA P-256 keeps generation in the milliseconds.
package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// CA is a certificate authority kept in memory, used to sign the serving and client
// certificates of a cluster. Every certificate it issues is valid as long as it is.
type CA struct {
	Cert     *x509.Certificate
	Key      *ecdsa.PrivateKey
	PEM      []byte
	validity time.Duration
}

// NewCA creates a self-signed CA with the given common name, valid from an hour ago
// (clock skew) for validity: a day is enough for a test run, a lab may run for weeks.
func NewCA(commonName string, validity time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(validity),
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
	return &CA{Cert: cert, Key: key, PEM: pemBlock("CERTIFICATE", der), validity: validity}, nil
}

// KeyPEM is the CA's private key in SEC1 "EC PRIVATE KEY" form, for a component that signs
// with it (kube-controller-manager's --cluster-signing-key-file).
func (ca *CA) KeyPEM() ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(ca.Key)
	if err != nil {
		return nil, err
	}
	return pemBlock("EC PRIVATE KEY", der), nil
}

// CertRequest describes a leaf certificate: its subject, and for serving certificates
// the IPs and DNS names it is valid for.
type CertRequest struct {
	CommonName   string
	Organization []string
	IPs          []net.IP
	DNSNames     []string
	Server       bool // adds the server-auth usage (client auth is always present)
}

// KeyPair is a PEM-encoded certificate and private key.
type KeyPair struct {
	CertPEM, KeyPEM []byte
}

// Issue signs a new leaf certificate.
func (ca *CA) Issue(req CertRequest) (KeyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return KeyPair{}, err
	}
	usages := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	if req.Server {
		usages = append(usages, x509.ExtKeyUsageServerAuth)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: req.CommonName, Organization: req.Organization},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(ca.validity),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  usages,
		IPAddresses:  req.IPs,
		DNSNames:     req.DNSNames,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return KeyPair{}, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return KeyPair{}, err
	}
	return KeyPair{CertPEM: pemBlock("CERTIFICATE", der), KeyPEM: pemBlock("PRIVATE KEY", keyDER)}, nil
}

// WriteFiles writes the pair as dir/name.crt (readable by all) and dir/name.key (by the
// owner only) and returns both paths.
func (kp KeyPair) WriteFiles(dir, name string) (certFile, keyFile string, err error) {
	certFile = filepath.Join(dir, name+".crt")
	keyFile = filepath.Join(dir, name+".key")
	if err := os.WriteFile(certFile, kp.CertPEM, 0o644); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(keyFile, kp.KeyPEM, 0o600); err != nil {
		return "", "", err
	}
	return certFile, keyFile, nil
}

// NewServiceAccountKey returns a PEM private key for signing service-account tokens;
// kube-apiserver reads the public half from the same file, which works for the SEC1
// "EC PRIVATE KEY" encoding but not for PKCS#8.
func NewServiceAccountKey() ([]byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pemBlock("EC PRIVATE KEY", der), nil
}

func pemBlock(kind string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der})
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		panic(fmt.Sprintf("crypto/rand failed: %v", err))
	}
	return n
}
