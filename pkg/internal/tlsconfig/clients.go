package tlsconfig

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// Adapters of a Client to the three client libraries. Each makes the TLS
// configuration when a connection is made, not once, so that a rotated
// file reaches every new connection.

// ConfigurePgx makes every host of cfg a verified TLS connection with the
// files as they are now: the host's name checked (sslmode=verify-full),
// whatever sslmode the URL has, and no plaintext fallback (pgx's default
// sslmode=prefer would retry a failed handshake in plaintext). Hosts that
// are Unix sockets keep their plaintext connection: TLS does not apply to
// them. A nil c leaves cfg as it is.
func (c *Client) ConfigurePgx(cfg *pgconn.Config) {
	if c == nil {
		return
	}
	hosts := append([]*pgconn.FallbackConfig{{Host: cfg.Host, Port: cfg.Port, TLSConfig: cfg.TLSConfig}}, cfg.Fallbacks...)
	var out []*pgconn.FallbackConfig
	seen := map[string]bool{}
	for _, h := range hosts {
		key := net.JoinHostPort(h.Host, strconv.Itoa(int(h.Port)))
		if seen[key] {
			continue // the plaintext retry of a host already there
		}
		seen[key] = true
		fb := *h
		if !isSocket(h.Host) {
			fb.TLSConfig = c.Config(h.Host)
		}
		out = append(out, &fb)
	}
	cfg.Host, cfg.Port, cfg.TLSConfig = out[0].Host, out[0].Port, out[0].TLSConfig
	cfg.Fallbacks = out[1:]
}

// isSocket reports whether a pgx host is a Unix socket directory.
func isSocket(host string) bool { return strings.HasPrefix(host, "/") }

// ConfigurePool does ConfigurePgx for the pool's connection settings and
// again before every connection the pool makes, so that connections made
// after a rotation use the new files. A nil c leaves cfg as it is.
func (c *Client) ConfigurePool(cfg *pgxpool.Config) {
	if c == nil {
		return
	}
	c.ConfigurePgx(&cfg.ConnConfig.Config)
	before := cfg.BeforeConnect
	cfg.BeforeConnect = func(ctx context.Context, cc *pgx.ConnConfig) error {
		c.ConfigurePgx(&cc.Config)
		if before != nil {
			return before(ctx, cc)
		}
		return nil
	}
}

// ConnectPgx connects one connection to databaseURL with c's TLS (nil c:
// as pgx.Connect), and explains a TLS failure (Postgres.Explain).
func (c *Client) ConnectPgx(ctx context.Context, databaseURL string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		return nil, err
	}
	c.ConfigurePgx(&cfg.Config)
	conn, err := pgx.ConnectConfig(ctx, cfg)
	return conn, Postgres.Explain(err)
}

// NewPool opens a pool on databaseURL with c's TLS (nil c: as
// pgxpool.New).
func (c *Client) NewPool(ctx context.Context, databaseURL string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, err
	}
	c.ConfigurePool(cfg)
	return pgxpool.NewWithConfig(ctx, cfg)
}

// AMQPConfig is the TLS configuration of a connection to the broker node
// at host (the host of its amqps:// URL, without the port), or nil for a
// nil c (amqp091 then uses its defaults for amqps://).
func (c *Client) AMQPConfig(host string) *tls.Config {
	if c == nil {
		return nil
	}
	return c.Config(host)
}

// RedisDialer returns a go-redis Dialer that makes a TLS connection to
// each address it is given, verified against that address's host, and
// whose TLS failures, during the handshake or after it (a server that
// refuses the client certificate says so at the first read, in TLS 1.3),
// name Redis. A nil c returns nil: go-redis's own dialer.
func (c *Client) RedisDialer(timeout time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	if c == nil {
		return nil
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			host = addr
		}
		d := tls.Dialer{NetDialer: &net.Dialer{Timeout: timeout, KeepAlive: 5 * time.Minute}, Config: c.Config(host)}
		conn, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, c.service.Explain(err)
		}
		return explainedConn{Conn: conn, service: c.service}, nil
	}
}

// explainedConn explains the TLS errors of its reads and writes; every
// other error, io.EOF and timeouts included, passes as it is.
type explainedConn struct {
	net.Conn
	service Service
}

func (c explainedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	return n, c.explain(err)
}

func (c explainedConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	return n, c.explain(err)
}

// alertWait bounds the read of a server's alert after a reset.
const alertWait = 200 * time.Millisecond

// explain explains err; a reset is looked behind first. A server that
// refuses the client certificate (TLS 1.3: after the client's handshake
// returned) sends an alert and closes, and the client's first write,
// already under way, may then fail with a reset before the alert was
// read: the alert is read now, and explained, when it is there.
func (c explainedConn) explain(err error) error {
	if err == nil {
		return nil
	}
	// Explain returns err itself when it has nothing to add: identity, not errors.Is.
	if e := c.service.Explain(err); e != err || !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) { //nolint:errorlint // see above
		return e
	}
	_ = c.Conn.SetReadDeadline(time.Now().Add(alertWait))
	var b [1]byte
	if _, rerr := c.Conn.Read(b[:]); rerr != nil {
		if e := c.service.Explain(rerr); e != rerr { //nolint:errorlint // identity, as above
			return e
		}
	}
	return err
}

// HTTPTransport is an http.Transport whose HTTPS connections use c's TLS,
// made at every connection; nil for a nil c (http.DefaultTransport's).
func (c *Client) HTTPTransport() *http.Transport {
	if c == nil {
		return nil
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.DialTLSContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			host = addr
		}
		d := tls.Dialer{NetDialer: &net.Dialer{Timeout: 5 * time.Second}, Config: c.Config(host)}
		conn, err := d.DialContext(ctx, network, addr)
		return conn, c.service.Explain(err)
	}
	return t
}

// RedisHook explains the TLS failures of every command and pipeline of a
// go-redis client (go-redis does not always return its connection's
// errors as they are); add it with AddHook. Other errors pass unchanged,
// redis.Nil included.
func RedisHook() redis.Hook { return redisHook{} }

type redisHook struct{}

func (redisHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		return conn, Redis.Explain(err)
	}
}

func (redisHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := Redis.Explain(next(ctx, cmd))
		if err != nil {
			cmd.SetErr(err)
		}
		return err
	}
}

func (redisHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := Redis.Explain(next(ctx, cmds))
		for _, cmd := range cmds {
			if e := cmd.Err(); e != nil {
				cmd.SetErr(Redis.Explain(e))
			}
		}
		return err
	}
}
