package tlsconfig_test

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/tlsconfig"
	"github.com/idempotent-events/idempotent-events/pkg/internal/tlsconfig/tlstest"
)

// server is a loopback TLS server that requires a client certificate of
// clientCA and answers "ok" to every connection.
func server(t *testing.T, leaf tlstest.Leaf, clientCA *tlstest.CA) string {
	t.Helper()
	pair, err := tls.X509KeyPair(leaf.CertPEM, leaf.KeyPEM)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(clientCA.Cert)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{pair}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert,
	})
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
				if err := conn.(*tls.Conn).Handshake(); err == nil {
					_, _ = io.WriteString(conn, "ok\n")
				}
			}()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); <-done })
	return ln.Addr().String()
}

// roundTrip makes a new connection to addr with c's configuration for
// host and reads the server's answer: the server's refusal of a client
// certificate shows at the first read in TLS 1.3.
func roundTrip(c *tlsconfig.Client, addr, host string) error {
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, c.Config(host))
	if err != nil {
		return c.Service().Explain(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return c.Service().Explain(err)
	}
	if line != "ok\n" {
		return errors.New("unexpected answer " + line)
	}
	return nil
}

func TestMatrix(t *testing.T) {
	t.Parallel()
	ca, other := tlstest.NewCA(t, "test CA"), tlstest.NewCA(t, "another CA")
	dir := t.TempDir()
	good := server(t, ca.Server(t), ca)
	client := tlstest.NewSecret(t, dir, ca.PEM, ca.Client(t, "ie"))
	files := tlsconfig.Files{CAFile: client.CAFile(), CertFile: client.CertFile(), KeyFile: client.KeyFile()}

	for _, tc := range []struct {
		name   string
		addr   string
		host   string
		files  tlsconfig.Files
		reason string
	}{
		{name: "verifies", addr: good, host: "localhost", files: files},
		{name: "verifies by IP address", addr: good, host: "127.0.0.1", files: files},
		{name: "wrong CA", addr: good, host: "localhost", reason: "certificate signed by unknown authority",
			files: tlsconfig.Files{CAFile: tlstest.NewSecret(t, dir, other.PEM, ca.Client(t, "ie")).CAFile(), CertFile: files.CertFile, KeyFile: files.KeyFile}},
		{name: "wrong name", addr: server(t, ca.Issue(t, tlstest.LeafOptions{Names: []string{"db.example"}}), ca), host: "localhost", files: files,
			reason: "the server's certificate is not valid for the host in DATABASE_URL"},
		{name: "expired", addr: server(t, ca.Issue(t, tlstest.LeafOptions{Names: []string{"localhost"}, Expired: true}), ca), host: "localhost", files: files,
			reason: "the server's certificate has expired or is not yet valid"},
		{name: "no client certificate", addr: good, host: "localhost", files: tlsconfig.Files{CAFile: files.CAFile},
			reason: "the server requires a client certificate"},
		{name: "expired client certificate", addr: good, host: "localhost", reason: "the server refused the client certificate",
			files: secretFiles(tlstest.NewSecret(t, dir, ca.PEM, ca.Issue(t, tlstest.LeafOptions{CommonName: "ie", Client: true, Expired: true})))},
		{name: "client certificate of another CA", addr: good, host: "localhost", reason: "the server refused the client certificate",
			files: secretFiles(tlstest.NewSecret(t, dir, ca.PEM, other.Client(t, "ie")))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := tlsconfig.New(tlsconfig.Postgres, tc.files)
			require.NoError(t, err)
			err = roundTrip(c, tc.addr, tc.host)
			if tc.reason == "" {
				require.NoError(t, err)
				return
			}
			var terr *tlsconfig.Error
			require.ErrorAs(t, err, &terr)
			require.Contains(t, terr.Reason, tc.reason)
			require.Contains(t, err.Error(), "PostgreSQL (DATABASE_URL): TLS: "+tc.reason)
		})
	}
}

func secretFiles(s *tlstest.Secret) tlsconfig.Files {
	return tlsconfig.Files{CAFile: s.CAFile(), CertFile: s.CertFile(), KeyFile: s.KeyFile()}
}

// A rotation of the mounted files reaches the next connection of the same
// Client, in both directions: a client certificate the server refuses
// replaced by a good one, a CA bundle replaced by the wrong one and back.
func TestRotation(t *testing.T) {
	t.Parallel()
	ca, other := tlstest.NewCA(t, "test CA"), tlstest.NewCA(t, "another CA")
	addr := server(t, ca.Server(t), ca)
	secret := tlstest.NewSecret(t, t.TempDir(), ca.PEM, ca.Issue(t, tlstest.LeafOptions{CommonName: "ie", Client: true, Expired: true}))
	c, err := tlsconfig.New(tlsconfig.Redis, secretFiles(secret))
	require.NoError(t, err)
	require.ErrorContains(t, roundTrip(c, addr, "localhost"), "Redis (REDIS_URL): TLS: the server refused the client certificate")

	secret.Update(t, ca.PEM, ca.Client(t, "ie"))
	require.NoError(t, roundTrip(c, addr, "localhost"), "the renewed client certificate is used without a new Client")

	secret.Update(t, other.PEM, ca.Client(t, "ie"))
	require.ErrorContains(t, roundTrip(c, addr, "localhost"), "certificate signed by unknown authority")
	secret.Update(t, ca.PEM, ca.Client(t, "ie"))
	require.NoError(t, roundTrip(c, addr, "localhost"))
}

// A file caught half way through a rotation that is not atomic (a key
// that does not match the certificate) leaves the previous pair in use.
func TestRotationKeepsLastGoodFiles(t *testing.T) {
	t.Parallel()
	ca := tlstest.NewCA(t, "test CA")
	addr := server(t, ca.Server(t), ca)
	dir := t.TempDir()
	first, second := ca.Client(t, "ie"), ca.Client(t, "ie")
	files := tlsconfig.Files{CAFile: filepath.Join(dir, "ca.crt"), CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key")}
	require.NoError(t, os.WriteFile(files.CAFile, ca.PEM, 0o600))
	require.NoError(t, os.WriteFile(files.CertFile, first.CertPEM, 0o600))
	require.NoError(t, os.WriteFile(files.KeyFile, first.KeyPEM, 0o600))
	c, err := tlsconfig.New(tlsconfig.RabbitMQ, files)
	require.NoError(t, err)
	require.NoError(t, roundTrip(c, addr, "localhost"))

	require.NoError(t, os.WriteFile(files.CertFile, second.CertPEM, 0o600)) // the key is not written yet
	require.NoError(t, roundTrip(c, addr, "localhost"), "the mismatched pair is not used")
	require.NoError(t, os.WriteFile(files.KeyFile, second.KeyPEM, 0o600))
	require.NoError(t, roundTrip(c, addr, "localhost"))
}

func TestNew(t *testing.T) {
	t.Parallel()
	c, err := tlsconfig.New(tlsconfig.Postgres, tlsconfig.Files{})
	require.NoError(t, err)
	require.Nil(t, c, "no setting, no TLS of ours")

	dir := t.TempDir()
	_, err = tlsconfig.New(tlsconfig.Postgres, tlsconfig.Files{CAFile: filepath.Join(dir, "missing.crt")})
	var ferr *tlsconfig.FileError
	require.ErrorAs(t, err, &ferr)
	require.Equal(t, "DATABASE_TLS_CA_FILE", ferr.Var)

	notPEM := filepath.Join(dir, "ca.crt")
	require.NoError(t, os.WriteFile(notPEM, []byte("not a certificate"), 0o600))
	_, err = tlsconfig.New(tlsconfig.Redis, tlsconfig.Files{CAFile: notPEM})
	require.ErrorAs(t, err, &ferr)
	require.Equal(t, "REDIS_TLS_CA_FILE", ferr.Var)
	require.ErrorContains(t, err, "no PEM certificate")

	_, err = tlsconfig.New(tlsconfig.RabbitMQ, tlsconfig.Files{CertFile: notPEM})
	require.ErrorAs(t, err, &ferr)
	require.Equal(t, "AMQP_TLS_CERT_FILE", ferr.Var)

	c, err = tlsconfig.New(tlsconfig.RabbitMQ, tlsconfig.Files{Required: true})
	require.NoError(t, err)
	require.Nil(t, c.Config("localhost").RootCAs, "required alone: the system's roots")
}

// ConfigurePgx verifies every host by its own name and drops the
// plaintext retry of sslmode=prefer.
func TestConfigurePgx(t *testing.T) {
	t.Parallel()
	ca := tlstest.NewCA(t, "test CA")
	s := tlstest.NewSecret(t, t.TempDir(), ca.PEM, ca.Client(t, "ie"))
	c, err := tlsconfig.New(tlsconfig.Postgres, tlsconfig.Files{CAFile: s.CAFile()})
	require.NoError(t, err)
	cfg, err := pgconn.ParseConfig("postgres://u@db-0:5432,db-1:5433/x") // sslmode=prefer
	require.NoError(t, err)
	require.Len(t, cfg.Fallbacks, 3, "prefer: TLS then plaintext for each host, minus the first")
	c.ConfigurePgx(cfg)
	require.Equal(t, "db-0", cfg.Host)
	require.Equal(t, "db-0", cfg.TLSConfig.ServerName)
	require.False(t, cfg.TLSConfig.InsecureSkipVerify)
	require.Len(t, cfg.Fallbacks, 1)
	require.Equal(t, "db-1", cfg.Fallbacks[0].Host)
	require.Equal(t, "db-1", cfg.Fallbacks[0].TLSConfig.ServerName)

	var nilClient *tlsconfig.Client
	plain, err := pgconn.ParseConfig("postgres://u@db-0:5432/x?sslmode=disable")
	require.NoError(t, err)
	nilClient.ConfigurePgx(plain)
	require.Nil(t, plain.TLSConfig, "a nil Client changes nothing")
}

func TestExplainLeavesOtherErrorsAlone(t *testing.T) {
	t.Parallel()
	require.NoError(t, tlsconfig.Postgres.Explain(nil))
	require.Same(t, io.EOF, tlsconfig.Redis.Explain(io.EOF))
	refused := errors.New("dial tcp 127.0.0.1:1: connect: connection refused")
	require.Equal(t, refused, tlsconfig.RabbitMQ.Explain(refused))
}
