package tlstest

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/rabbitcluster"
)

// Private TLS servers of the machine's own binaries, on free 127.0.0.1
// ports, in temporary directories: never the machine's services. Each
// requires TLS and a client certificate its CA signed, and can be given
// another server certificate while it runs (SetServerCert), as a server
// rotates its own, so that one instance serves a test's whole matrix.

// sharedDir makes a temporary directory every user can traverse: the
// servers may run as other users than the test (postgres, rabbitmq).
func sharedDir(t testing.TB, pattern string) string {
	t.Helper()
	d, err := os.MkdirTemp("", pattern)
	require.NoError(t, err)
	require.NoError(t, os.Chmod(d, 0o755))
	t.Cleanup(func() { _ = os.RemoveAll(d) })
	return d
}

func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// serverFiles writes a server's CA, certificate and key into dir, owned
// by cred when set (the key readable by its owner only, as PostgreSQL
// demands).
func serverFiles(t testing.TB, dir string, ca *CA, leaf Leaf, cred *syscall.Credential) (caFile, certFile, keyFile string) {
	t.Helper()
	caFile, certFile, keyFile = filepath.Join(dir, "server-ca.crt"), filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key")
	for path, content := range map[string][]byte{caFile: ca.PEM, certFile: leaf.CertPEM, keyFile: leaf.KeyPEM} {
		mode := os.FileMode(0o644)
		if path == keyFile {
			mode = 0o600
		}
		tmp := path + ".tmp"
		require.NoError(t, os.WriteFile(tmp, content, mode))
		if cred != nil {
			require.NoError(t, os.Chown(tmp, int(cred.Uid), int(cred.Gid)))
		}
		require.NoError(t, os.Rename(tmp, path))
	}
	return caFile, certFile, keyFile
}

// runAs returns the credential of the named OS user when the tests run as
// root (the servers refuse, or should not, run as root), nil otherwise.
func runAs(t testing.TB, name string) *syscall.Credential {
	t.Helper()
	if os.Geteuid() != 0 {
		return nil
	}
	u, err := user.Lookup(name)
	require.NoError(t, err, "running as root, the server needs the %s user", name)
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	require.NoError(t, err)
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	require.NoError(t, err)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
}

// skipOrFail skips t when a server binary is missing, unless CI is set.
func skipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}

// Postgres is a private PostgreSQL server that accepts TLS connections
// only (hostnossl is rejected), each with a client certificate of CA
// (clientcert=verify-ca); user postgres, trust otherwise.
type Postgres struct {
	Port    int
	CA      *CA
	dir     string
	cred    *syscall.Credential
	t       testing.TB
	started bool
}

// PostgresBinDir holds initdb and postgres.
func PostgresBinDir() string {
	if d := os.Getenv("PGCLUSTER_BIN"); d != "" {
		return d
	}
	return "/usr/lib/postgresql/15/bin"
}

// StartPostgres starts a PostgreSQL server for t with a server
// certificate of ca for localhost and 127.0.0.1, and stops it when t ends.
func StartPostgres(t testing.TB, ca *CA) *Postgres {
	t.Helper()
	bin := PostgresBinDir()
	if _, err := os.Stat(filepath.Join(bin, "postgres")); err != nil {
		skipOrFail(t, "PostgreSQL server binaries: %v", err)
	}
	p := &Postgres{Port: freePort(t), CA: ca, cred: runAs(t, "postgres"), t: t}
	base := sharedDir(t, "ie-tls-pg-")
	p.dir = filepath.Join(base, "data")
	run := func(name string, args ...string) *exec.Cmd {
		cmd := exec.Command(filepath.Join(bin, name), args...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + base, "LC_ALL=C"}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred}
		return cmd
	}
	if p.cred != nil {
		require.NoError(t, os.Chown(base, int(p.cred.Uid), int(p.cred.Gid)))
	}
	out, err := run("initdb", "-D", p.dir, "-U", "postgres", "--auth=trust", "--no-locale", "-E", "UTF8", "--no-sync").CombinedOutput()
	require.NoError(t, err, "initdb: %s", out)
	p.SetServerCert(ca.Server(t))
	conf := strings.Join([]string{
		"listen_addresses = '127.0.0.1'", "unix_socket_directories = ''", "fsync = off", "max_connections = 50",
		"ssl = on", "ssl_cert_file = 'server.crt'", "ssl_key_file = 'server.key'", "ssl_ca_file = 'server-ca.crt'",
		"log_min_messages = warning",
	}, "\n")
	f, err := os.OpenFile(filepath.Join(p.dir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteString("\n" + conf + "\n")
	require.NoError(t, err)
	require.NoError(t, f.Close())
	hba := "hostssl all all 127.0.0.1/32 trust clientcert=verify-ca\nhostnossl all all 127.0.0.1/32 reject\n"
	require.NoError(t, os.WriteFile(filepath.Join(p.dir, "pg_hba.conf"), []byte(hba), 0o600))
	if p.cred != nil {
		require.NoError(t, os.Chown(filepath.Join(p.dir, "pg_hba.conf"), int(p.cred.Uid), int(p.cred.Gid)))
	}
	logf, err := os.Create(filepath.Join(base, "server.log"))
	require.NoError(t, err)
	cmd := run("postgres", "-D", p.dir, "-p", strconv.Itoa(p.Port))
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); _ = logf.Close(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGQUIT) // immediate shutdown
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(base, "server.log"))
			t.Logf("postgres log:\n%s", b)
		}
	})
	waitPort(t, p.Port, exited)
	p.waitReady(exited)
	p.started = true
	return p
}

// TerminateClients ends every other session: their clients reconnect.
func (p *Postgres) TerminateClients() {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, p.adminConfig())
	require.NoError(p.t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'")
	require.NoError(p.t, err)
}

// adminConfig is a connection of the tests' own, verified, with a client
// certificate of the server's CA.
func (p *Postgres) adminConfig() *pgx.ConnConfig {
	p.t.Helper()
	leaf := p.CA.Client(p.t, "postgres")
	pair, err := tls.X509KeyPair(leaf.CertPEM, leaf.KeyPEM)
	require.NoError(p.t, err)
	pool := x509.NewCertPool()
	pool.AddCert(p.CA.Cert)
	cfg, err := pgx.ParseConfig(p.URL("127.0.0.1", "postgres") + "?sslmode=disable")
	require.NoError(p.t, err)
	cfg.TLSConfig = &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}, ServerName: "127.0.0.1"}
	return cfg
}

// waitReady waits until the server accepts a session ("the database system
// is starting up" for a while after it listens).
func (p *Postgres) waitReady(exited <-chan struct{}) {
	p.t.Helper()
	cfg := p.adminConfig()
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		conn, err := pgx.ConnectConfig(ctx, cfg)
		cancel()
		if err == nil {
			_ = conn.Close(context.Background())
			return
		}
		select {
		case <-exited:
			p.t.Fatalf("postgres exited while starting: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("postgres not ready within a minute: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// SetServerCert replaces the server's certificate and key and makes the
// server reload them (SIGHUP): the next connection gets the new one.
func (p *Postgres) SetServerCert(leaf Leaf) {
	p.t.Helper()
	serverFiles(p.t, p.dir, p.CA, leaf, p.cred)
	if !p.started {
		return
	}
	pid, err := os.ReadFile(filepath.Join(p.dir, "postmaster.pid"))
	require.NoError(p.t, err)
	n, err := strconv.Atoi(strings.SplitN(string(pid), "\n", 2)[0])
	require.NoError(p.t, err)
	require.NoError(p.t, syscall.Kill(n, syscall.SIGHUP))
	// The postmaster reloads asynchronously.
	waitCert(p.t, leaf, func() (net.Conn, error) {
		conn, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p.Port)), time.Second)
		if err != nil {
			return nil, err
		}
		// SSLRequest: length 8, code 80877103; the server answers 'S'.
		_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := conn.Write([]byte{0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f}); err != nil {
			conn.Close()
			return nil, err
		}
		b := make([]byte, 1)
		if _, err := io.ReadFull(conn, b); err != nil || b[0] != 'S' {
			conn.Close()
			return nil, fmt.Errorf("no SSL from postgres: %q: %w", b, err)
		}
		return conn, nil
	})
}

// URL is a DATABASE_URL for database db at host (localhost or 127.0.0.1),
// without sslmode: the TLS settings make it verify-full.
func (p *Postgres) URL(host, db string) string {
	return fmt.Sprintf("postgres://postgres@%s/%s", net.JoinHostPort(host, strconv.Itoa(p.Port)), db)
}

// Redis is a private redis-server listening with TLS only, requiring a
// client certificate of CA (tls-auth-clients yes).
type Redis struct {
	Port   int
	CA     *CA
	dir    string
	t      testing.TB
	caFile string
	admin  *redis.Client
}

// StartRedis starts a redis-server for t with a server certificate of ca
// for localhost and 127.0.0.1, and stops it when t ends.
func StartRedis(t testing.TB, ca *CA) *Redis {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		skipOrFail(t, "redis-server: %v", err)
	}
	r := &Redis{Port: freePort(t), CA: ca, dir: sharedDir(t, "ie-tls-redis-"), t: t}
	caFile, certFile, keyFile := serverFiles(t, r.dir, ca, ca.Server(t), nil)
	r.caFile = caFile
	cmd := exec.Command(bin, "--port", "0", "--tls-port", strconv.Itoa(r.Port), "--bind", "127.0.0.1",
		"--tls-cert-file", certFile, "--tls-key-file", keyFile, "--tls-ca-cert-file", caFile, "--tls-auth-clients", "yes",
		"--save", "", "--appendonly", "no", "--dir", r.dir, "--logfile", filepath.Join(r.dir, "redis.log"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(r.dir, "redis.log"))
			t.Logf("redis log:\n%s", b)
		}
	})
	waitPort(t, r.Port, exited)
	// The tests' own connection, for CONFIG SET: a client certificate the
	// server trusts, made here.
	adminLeaf := ca.Client(t, "admin")
	pair, err := tls.X509KeyPair(adminLeaf.CertPEM, adminLeaf.KeyPEM)
	require.NoError(t, err)
	// Not verified: SetServerCert swaps in invalid certificates on purpose,
	// and this connection must outlive them.
	r.admin = redis.NewClient(&redis.Options{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(r.Port)), MaxRetries: -1,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{pair}, InsecureSkipVerify: true}}) //nolint:gosec // see above
	t.Cleanup(func() { _ = r.admin.Close() })
	return r
}

// URL is a rediss:// REDIS_URL at host.
func (r *Redis) URL(host string) string {
	return "rediss://" + net.JoinHostPort(host, strconv.Itoa(r.Port)) + "/0"
}

// SetServerCert replaces the server's certificate; CONFIG SET of a TLS
// file makes Redis re-read them all.
func (r *Redis) SetServerCert(leaf Leaf) {
	r.t.Helper()
	_, certFile, keyFile := serverFiles(r.t, r.dir, r.CA, leaf, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(r.t, r.admin.ConfigSet(ctx, "tls-key-file", keyFile).Err())
	require.NoError(r.t, r.admin.ConfigSet(ctx, "tls-cert-file", certFile).Err())
	waitCert(r.t, leaf, r.dialTCP)
}

func (r *Redis) dialTCP() (net.Conn, error) {
	return net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(r.Port)), time.Second)
}

// KillClients closes every client connection but the tests' own, so that
// the next command of a client dials anew.
func (r *Redis) KillClients() {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(r.t, r.admin.Do(ctx, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes").Err())
}

// RabbitMQ is a private RabbitMQ node (package rabbitcluster) with a TLS
// listener that requires a client certificate of CA (verify_peer,
// fail_if_no_peer_cert).
type RabbitMQ struct {
	*rabbitcluster.Cluster
	TLSPort int
	CA      *CA
	dir     string
	t       testing.TB
}

// StartRabbitMQ boots a one-node RabbitMQ for t (slow: share it between
// the tests of a package) with a server certificate of ca for localhost
// and 127.0.0.1, and stops it when t ends.
func StartRabbitMQ(t testing.TB, ca *CA) *RabbitMQ {
	t.Helper()
	r := &RabbitMQ{TLSPort: freePort(t), CA: ca, dir: sharedDir(t, "ie-tls-rabbit-"), t: t}
	caFile, certFile, keyFile := serverFiles(t, r.dir, ca, ca.Server(t), nil)
	// Readable by the rabbitmq user the node runs as, when the tests are
	// root: a test key, not a secret.
	require.NoError(t, os.Chmod(keyFile, 0o644))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	opts := rabbitcluster.Options{Nodes: 1, Config: func(int) string {
		return strings.Join([]string{
			"listeners.ssl.default = " + strconv.Itoa(r.TLSPort),
			"ssl_options.cacertfile = " + caFile,
			"ssl_options.certfile = " + certFile,
			"ssl_options.keyfile = " + keyFile,
			"ssl_options.verify = verify_peer",
			"ssl_options.fail_if_no_peer_cert = true",
		}, "\n")
	}}
	var c *rabbitcluster.Cluster
	var err error
	// A node sometimes refuses to boot on this machine with
	// dist_port_already_used for a port that was free a moment before
	// (another test's process took it): boot again, on new ports.
	for attempt := 1; attempt <= 3; attempt++ {
		if c, err = rabbitcluster.StartWith(ctx, opts); err == nil || errors.Is(err, rabbitcluster.ErrNotInstalled) {
			break
		}
		t.Logf("RabbitMQ node did not boot (attempt %d of 3): %.300v", attempt, err)
	}
	if errors.Is(err, rabbitcluster.ErrNotInstalled) {
		skipOrFail(t, "%v", err)
	}
	require.NoError(t, err)
	t.Cleanup(c.Close)
	r.Cluster = c
	return r
}

// URL is an amqps:// AMQP_URL at host, on the node's vhost.
func (r *RabbitMQ) URL(host string) string {
	u := url.URL{Scheme: "amqps", User: url.UserPassword(r.User, r.Password),
		Host: net.JoinHostPort(host, strconv.Itoa(r.TLSPort)), Path: "/" + r.VHost}
	return u.String()
}

// SetServerCert replaces the node's certificate: Erlang's ssl caches the
// files it read, and clearing its cache makes the next connection read
// them again (RabbitMQ's documented way to rotate a certificate).
func (r *RabbitMQ) SetServerCert(leaf Leaf) {
	r.t.Helper()
	_, _, keyFile := serverFiles(r.t, r.dir, r.CA, leaf, nil)
	require.NoError(r.t, os.Chmod(keyFile, 0o644))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := r.Ctl(ctx, 0, "eval", "ssl:clear_pem_cache().")
	require.NoError(r.t, err)
	waitCert(r.t, leaf, func() (net.Conn, error) {
		return net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(r.TLSPort)), time.Second)
	})
}

// waitCert waits until a TLS handshake over a connection of dial (ready
// for the handshake) shows leaf as the server's certificate.
func waitCert(t testing.TB, leaf Leaf, dial func() (net.Conn, error)) {
	t.Helper()
	block, _ := pem.Decode(leaf.CertPEM)
	deadline := time.Now().Add(30 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		conn, err := dial()
		if err == nil {
			// Only which certificate the server shows is looked at, not
			// whether it is valid: the tests swap in invalid ones.
			tc := tls.Client(conn, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // a probe, see above
			_ = tc.SetDeadline(time.Now().Add(2 * time.Second))
			err = tc.Handshake()
			if err == nil && bytes.Equal(tc.ConnectionState().PeerCertificates[0].Raw, block.Bytes) {
				_ = tc.Close()
				return
			}
			_ = tc.Close()
			if err == nil {
				err = errors.New("the server still shows its previous certificate")
			}
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("the server did not take its new certificate within 30s: %v", last)
}

// waitPort waits until something accepts TCP connections on port.
func waitPort(t testing.TB, port int, exited <-chan struct{}) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		conn, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), time.Second)
		if err == nil {
			_ = conn.Close()
			return
		}
		select {
		case <-exited:
			t.Fatalf("server on port %d exited while starting", port)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("server on port %d not listening within a minute: %v", port, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
