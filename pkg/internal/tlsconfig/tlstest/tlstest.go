// Package tlstest makes the certificates of the TLS tests: a CA generated
// for the test, server and client certificates it signs (valid, expired,
// for another name), and Secret volumes laid out as the kubelet mounts
// them (ca.crt, tls.crt and tls.key symlinked through ..data, which an
// update swaps atomically), so that a rotation is what cert-manager and the
// kubelet do.
//
// It is for tests only: no product package imports it
// (pkg/internal/app/layers_test.go checks).
package tlstest

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
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// CA is a certificate authority made for a test.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	// PEM is the CA certificate, as ca.crt holds it.
	PEM []byte
}

var serial atomic.Int64

func init() { serial.Store(time.Now().UnixNano()) }

// NewCA makes a CA named name, valid from an hour ago for a day.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(serial.Add(1)),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return &CA{Cert: cert, Key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// Leaf is a certificate and its key, PEM-encoded.
type Leaf struct {
	CertPEM, KeyPEM []byte
}

// LeafOptions shape a certificate.
type LeafOptions struct {
	// CommonName is the subject's CN; Postgres maps it to the user of a
	// client certificate.
	CommonName string
	// Names are the DNS names and IP addresses (SANs) of a server
	// certificate.
	Names []string
	// Client makes a client certificate, else a server one.
	Client bool
	// Expired makes it valid only in the past.
	Expired bool
}

// Issue makes a certificate that ca signs.
func (ca *CA) Issue(t testing.TB, o LeafOptions) Leaf {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial.Add(1)),
		Subject:      pkix.Name{CommonName: o.CommonName},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if o.Client {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	if o.Expired {
		tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-48*time.Hour), time.Now().Add(-24*time.Hour)
	}
	for _, n := range o.Names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	require.NoError(t, err)
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	return Leaf{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}),
	}
}

// Server issues a server certificate for localhost and 127.0.0.1.
func (ca *CA) Server(t testing.TB) Leaf {
	return ca.Issue(t, LeafOptions{CommonName: "localhost", Names: []string{"localhost", "127.0.0.1"}})
}

// Client issues a client certificate for user (its CN).
func (ca *CA) Client(t testing.TB, user string) Leaf {
	return ca.Issue(t, LeafOptions{CommonName: user, Client: true})
}

// Secret is a directory laid out as the kubelet mounts a Secret of
// cert-manager's: ca.crt, tls.crt and tls.key are symlinks into ..data,
// itself a symlink to a timestamped directory that every Update replaces.
type Secret struct {
	Dir     string
	version int
}

// CAFile is the path of the CA bundle a pod's settings name.
func (s *Secret) CAFile() string { return filepath.Join(s.Dir, "ca.crt") }

// CertFile is the path of the client certificate.
func (s *Secret) CertFile() string { return filepath.Join(s.Dir, "tls.crt") }

// KeyFile is the path of the client key.
func (s *Secret) KeyFile() string { return filepath.Join(s.Dir, "tls.key") }

// NewSecret writes a Secret volume into a new directory under dir (a
// test's TempDir, or a directory other users can read) holding ca as
// ca.crt and leaf as tls.crt and tls.key.
func NewSecret(t testing.TB, dir string, ca []byte, leaf Leaf) *Secret {
	t.Helper()
	d, err := os.MkdirTemp(dir, "secret-")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(d, 0o755))
	s := &Secret{Dir: d}
	s.Update(t, ca, leaf)
	for _, name := range []string{"ca.crt", "tls.crt", "tls.key"} {
		require.NoError(t, os.Symlink(filepath.Join("..data", name), filepath.Join(d, name)))
	}
	return s
}

// Update replaces the Secret's contents the way the kubelet does: a new
// timestamped directory, then an atomic rename of a new ..data symlink
// over the old one, then the old directory removed.
func (s *Secret) Update(t testing.TB, ca []byte, leaf Leaf) {
	t.Helper()
	s.version++
	name := fmt.Sprintf("..%s_%d", time.Now().Format("2006_01_02_15_04_05"), s.version)
	dir := filepath.Join(s.Dir, name)
	require.NoError(t, os.Mkdir(dir, 0o755))
	// Readable by the private servers' users (the tests may run as root,
	// the servers as postgres or rabbitmq); Postgres wants 0600 or 0640 on
	// a key it owns, which StartPostgres copies for itself.
	for file, content := range map[string][]byte{"ca.crt": ca, "tls.crt": leaf.CertPEM, "tls.key": leaf.KeyPEM} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, file), content, 0o644))
	}
	old, _ := os.Readlink(filepath.Join(s.Dir, "..data"))
	tmp := filepath.Join(s.Dir, "..data_tmp"+strconv.Itoa(s.version))
	require.NoError(t, os.Symlink(name, tmp))
	require.NoError(t, os.Rename(tmp, filepath.Join(s.Dir, "..data")))
	if old != "" {
		require.NoError(t, os.RemoveAll(filepath.Join(s.Dir, old)))
	}
}
