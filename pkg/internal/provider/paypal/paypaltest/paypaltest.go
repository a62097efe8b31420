// Package paypaltest stands in for PayPal's certificate host in tests: a
// loopback HTTPS server whose TLS certificate, and the message-verification
// certificates it serves, are issued by a private CA made for the test.
//
// What this proves: the provider's whole path (the allow-list, HTTPS with
// chain verification, the download, the chain and subject checks of the
// served certificate, the cache, RSA-SHA256 over PayPal's signed string)
// against certificates we issue. What it does not prove: that PayPal's live
// certificates chain to the system roots, that PayPal's hosts serve them as
// assumed, or that our signed string is byte for byte PayPal's; PayPal
// publishes no test vector and no Go library to check against, so only a
// sandbox delivery (docs/providers.md) shows that.
package paypaltest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/provider/paypal"
)

// CommonName is the subject of PayPal's message-verification certificate.
const CommonName = "messageverificationcerts.paypal.com"

// CertPath is where NewCertServer serves its first certificate, as PayPal
// names its certificates.
const CertPath = "/v1/notifications/certs/CERT-360caa42-fca2a594-test"

// CertServer is a loopback HTTPS server with a private CA.
type CertServer struct {
	// Host is the server's host:port, for the provider's allow-list.
	Host string
	// Roots holds the private CA: the roots of a provider that trusts
	// this server and what it serves.
	Roots *x509.CertPool
	// CAPEM is the CA's certificate in PEM, as PAYPAL_CA_FILE holds it.
	CAPEM []byte
	// Signer signs with the key of the certificate served at CertPath.
	Signer paypal.Signer

	root, inter *issuer
	mu          sync.Mutex
	routes      map[string]route
	fetches     map[string]int
}

type route struct {
	status   int
	body     []byte
	location string
}

type issuer struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

// NewCertServer starts a certificate server for t, stopped when t ends.
// It serves a valid chain (signing certificate, then an intermediate) at
// CertPath.
func NewCertServer(t testing.TB) *CertServer {
	t.Helper()
	s := &CertServer{routes: map[string]route{}, fetches: map[string]int{}}
	s.root = newIssuer(t, "idempotent-events test root CA", nil)
	s.inter = newIssuer(t, "idempotent-events test intermediate CA", s.root)
	s.Roots = x509.NewCertPool()
	s.Roots.AddCert(s.root.cert)
	s.CAPEM = s.root.pem

	tlsKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tlsCert := sign(t, s.root, &x509.Certificate{
		Subject: pkix.Name{CommonName: "127.0.0.1"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature,
	}, &tlsKey.PublicKey)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(s.serve))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{tlsCert.Raw}, PrivateKey: tlsKey}}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	s.Host = strings.TrimPrefix(srv.URL, "https://")
	s.Signer = s.Issue(t, CertPath, Cert{})
	return s
}

// Cert describes a signing certificate to issue.
type Cert struct {
	// CommonName is its subject; "" means CommonName.
	CommonName string
	// Untrusted issues it from a CA of its own, not the server's.
	Untrusted bool
	// Expired makes it valid only in the past.
	Expired bool
	// KeyBits is the size of its RSA key; 0 means 2048.
	KeyBits int
}

// Issue makes a signing certificate as c says, serves it (and its
// intermediate) at path, and returns a Signer for it.
func (s *CertServer) Issue(t testing.TB, path string, c Cert) paypal.Signer {
	t.Helper()
	if c.CommonName == "" {
		c.CommonName = CommonName
	}
	if c.KeyBits == 0 {
		c.KeyBits = 2048
	}
	key, err := rsa.GenerateKey(rand.Reader, c.KeyBits)
	require.NoError(t, err)
	by := s.inter
	if c.Untrusted {
		by = newIssuer(t, "some other CA", nil)
	}
	tmpl := &x509.Certificate{Subject: pkix.Name{CommonName: c.CommonName}, KeyUsage: x509.KeyUsageDigitalSignature}
	if c.Expired {
		tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-48*time.Hour), time.Now().Add(-24*time.Hour)
	}
	cert := sign(t, by, tmpl, &key.PublicKey)
	chain := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})
	chain = append(chain, by.pem...)
	s.Answer(path, http.StatusOK, chain)
	return paypal.Signer{Key: key, CertURL: s.URL(path)}
}

// Answer makes path answer status with body.
func (s *CertServer) Answer(path string, status int, body []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.routes[path] = route{status: status, body: body}
}

// Redirect makes path answer 302 to the URL to.
func (s *CertServer) Redirect(path, to string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.routes[path] = route{status: http.StatusFound, location: to}
}

// URL returns the https URL of path on the server.
func (s *CertServer) URL(path string) string { return "https://" + s.Host + path }

// Fetches returns how many times path was requested.
func (s *CertServer) Fetches(path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fetches[path]
}

func (s *CertServer) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.fetches[r.URL.Path]++
	rt, ok := s.routes[r.URL.Path]
	s.mu.Unlock()
	if !ok {
		http.NotFound(w, r)
		return
	}
	if rt.location != "" {
		w.Header().Set("Location", rt.location)
	}
	w.Header().Set("Content-Type", "application/x-pem-file")
	w.WriteHeader(rt.status)
	_, _ = w.Write(rt.body)
}

// newIssuer makes a CA, self-signed when parent is nil.
func newIssuer(t testing.TB, name string, parent *issuer) *issuer {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{Subject: pkix.Name{CommonName: name}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	is := &issuer{key: key}
	if parent == nil {
		parent = is
		is.cert = tmpl // self-signed: the template signs itself
	}
	is.cert = sign(t, parent, tmpl, &key.PublicKey)
	is.pem = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: is.cert.Raw})
	return is
}

// sign issues tmpl for pub, signed by by; validity defaults to a day
// around now.
func sign(t testing.TB, by *issuer, tmpl *x509.Certificate, pub any) *x509.Certificate {
	t.Helper()
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	require.NoError(t, err)
	tmpl.SerialNumber = serial
	if tmpl.NotAfter.IsZero() {
		tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, by.cert, pub, by.key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return cert
}
