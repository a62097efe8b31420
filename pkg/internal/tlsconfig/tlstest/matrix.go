package tlstest

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/tlsconfig"
)

// Server is a private TLS server whose certificate a test can swap.
type Server interface {
	SetServerCert(Leaf)
}

// Open makes a long-lived client of a service with the TLS files f, for
// the host 127.0.0.1, and returns a function that makes a new connection
// through that client and returns its error, or nil once a round trip
// over it worked.
type Open func(t *testing.T, f tlsconfig.Files) (connect func() error)

// Files are the settings of a Secret volume.
func Files(s *Secret) tlsconfig.Files {
	return tlsconfig.Files{CAFile: s.CAFile(), CertFile: s.CertFile(), KeyFile: s.KeyFile()}
}

// RunMatrix runs the TLS matrix of service against srv, whose certificate
// ca issued for 127.0.0.1 and which requires a client certificate of ca:
// a connection verifies; a wrong CA, a certificate for another name, an
// expired certificate and a missing client certificate are each refused
// with the error that names the service and says which. Its subtests run
// one after the other: two of them swap the server's certificate.
func RunMatrix(t *testing.T, srv Server, ca *CA, service tlsconfig.Service, open Open) {
	dir := t.TempDir()
	good := NewSecret(t, dir, ca.PEM, ca.Client(t, "postgres"))
	other := NewCA(t, "another CA")
	refused := func(t *testing.T, f tlsconfig.Files, reason string) {
		t.Helper()
		err := open(t, f)()
		var terr *tlsconfig.Error
		require.ErrorAs(t, err, &terr, "want %q", reason)
		require.Equal(t, service, terr.Service)
		require.Contains(t, terr.Reason, reason)
		require.Contains(t, err.Error(), service.String()+": TLS: "+reason)
		t.Logf("refused: %v", err)
	}
	t.Run("verifies", func(t *testing.T) {
		require.NoError(t, open(t, Files(good))())
	})
	t.Run("wrong CA", func(t *testing.T) {
		f := Files(good)
		f.CAFile = NewSecret(t, dir, other.PEM, Leaf{}).CAFile()
		refused(t, f, "certificate signed by unknown authority")
	})
	t.Run("no client certificate", func(t *testing.T) {
		refused(t, tlsconfig.Files{CAFile: good.CAFile()}, "the server requires a client certificate")
	})
	t.Run("wrong name", func(t *testing.T) {
		srv.SetServerCert(ca.Issue(t, LeafOptions{CommonName: "db.example", Names: []string{"db.example"}}))
		defer srv.SetServerCert(ca.Server(t))
		refused(t, Files(good), "the server's certificate is not valid for the host in "+service.URLVar)
	})
	t.Run("expired", func(t *testing.T) {
		srv.SetServerCert(ca.Issue(t, LeafOptions{CommonName: "localhost", Names: []string{"localhost", "127.0.0.1"}, Expired: true}))
		defer srv.SetServerCert(ca.Server(t))
		refused(t, Files(good), "the server's certificate has expired or is not yet valid")
	})
	t.Run("verifies again", func(t *testing.T) {
		require.NoError(t, open(t, Files(good))())
	})
}

// RunRotation rotates the files of one long-lived client in place, as the
// kubelet does for a renewed cert-manager Secret, and requires every new
// connection to use them: an expired client certificate the server
// refuses, renewed; then a CA bundle replaced by a wrong one, and back.
func RunRotation(t *testing.T, ca *CA, service tlsconfig.Service, open Open) {
	secret := NewSecret(t, t.TempDir(), ca.PEM, ca.Issue(t, LeafOptions{CommonName: "postgres", Client: true, Expired: true}))
	connect := open(t, Files(secret))
	err := connect()
	require.ErrorContains(t, err, service.String()+": TLS: the server refused the client certificate")

	secret.Update(t, ca.PEM, ca.Client(t, "postgres"))
	require.NoError(t, connect(), "the renewed client certificate reaches the next connection")

	secret.Update(t, NewCA(t, "another CA").PEM, ca.Client(t, "postgres"))
	require.ErrorContains(t, connect(), "certificate signed by unknown authority")

	secret.Update(t, ca.PEM, ca.Client(t, "postgres"))
	require.NoError(t, connect())
}
