package pki

import (
	"crypto/x509"
	"encoding/pem"
	"net"
	"testing"
	"time"
)

func TestIssuedCertificatesVerify(t *testing.T) {
	ca, err := NewCA("test-ca", 48*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca.PEM) {
		t.Fatal("CA PEM does not parse")
	}
	cases := []struct {
		name  string
		req   CertRequest
		usage x509.ExtKeyUsage
		want  bool
	}{
		{"server for its IP", CertRequest{CommonName: "apiserver", IPs: []net.IP{net.ParseIP("10.0.0.1")}, Server: true}, x509.ExtKeyUsageServerAuth, true},
		{"client", CertRequest{CommonName: "admin", Organization: []string{"system:masters"}}, x509.ExtKeyUsageClientAuth, true},
		{"client is no server", CertRequest{CommonName: "admin"}, x509.ExtKeyUsageServerAuth, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			kp, err := ca.Issue(tc.req)
			if err != nil {
				t.Fatal(err)
			}
			block, _ := pem.Decode(kp.CertPEM)
			cert, err := x509.ParseCertificate(block.Bytes)
			if err != nil {
				t.Fatal(err)
			}
			_, err = cert.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{tc.usage}})
			if (err == nil) != tc.want {
				t.Errorf("verify for %v: %v, want ok=%v", tc.usage, err, tc.want)
			}
			if got := time.Until(cert.NotAfter); got < 47*time.Hour || got > 49*time.Hour {
				t.Errorf("valid for %v more, want the CA's 48h", got)
			}
			if block, _ := pem.Decode(kp.KeyPEM); block == nil || block.Type != "PRIVATE KEY" {
				t.Errorf("key PEM is not PKCS#8")
			}
		})
	}
	key, err := NewServiceAccountKey()
	if err != nil {
		t.Fatal(err)
	}
	// kube-apiserver reads the public half only from SEC1.
	if block, _ := pem.Decode(key); block == nil || block.Type != "EC PRIVATE KEY" {
		t.Errorf("service-account key is not SEC1 EC PRIVATE KEY")
	}
}
