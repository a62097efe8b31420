package tlsconfig

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Service names one of the three services in errors and hints.
type Service struct {
	// Name is the product, "PostgreSQL".
	Name string
	// URLVar is the variable of its URL, "DATABASE_URL".
	URLVar string
	// Prefix is the prefix of its TLS variables, "DATABASE_TLS".
	Prefix string
}

// The services the binaries connect to.
var (
	Postgres = Service{Name: "PostgreSQL", URLVar: "DATABASE_URL", Prefix: "DATABASE_TLS"}
	RabbitMQ = Service{Name: "RabbitMQ", URLVar: "AMQP_URL", Prefix: "AMQP_TLS"}
	Redis    = Service{Name: "Redis", URLVar: "REDIS_URL", Prefix: "REDIS_TLS"}
)

// String is "PostgreSQL (DATABASE_URL)".
func (s Service) String() string { return s.Name + " (" + s.URLVar + ")" }

// Files are a service's TLS settings.
type Files struct {
	// CAFile is a PEM bundle of the CAs that may sign the server's
	// certificate; empty: the system's roots.
	CAFile string
	// CertFile and KeyFile are the client certificate (PEM, the chain after
	// it) and its key, for servers that require one; both or neither.
	CertFile, KeyFile string
	// Required: TLS without any file, the server verified against the
	// system's roots. Any file implies it.
	Required bool
}

// Enabled reports whether the service's connections must use TLS.
func (f Files) Enabled() bool {
	return f.Required || f.CAFile != "" || f.CertFile != "" || f.KeyFile != ""
}

// FileError is a TLS file that cannot be used: Var is its variable.
type FileError struct {
	Var  string
	Path string
	Err  error
}

func (e *FileError) Error() string { return fmt.Sprintf("%s: %s: %v", e.Var, e.Path, e.Err) }

func (e *FileError) Unwrap() error { return e.Err }

// Client hands out the TLS configuration of one service's connections,
// re-reading its files when they change. Its methods are safe for
// concurrent use. A nil *Client is a service without TLS settings: its
// adapters leave the libraries' defaults alone.
type Client struct {
	service Service
	files   Files

	mu    sync.Mutex
	ca    stamp
	cert  stamp
	key   stamp
	roots *x509.CertPool   // nil: the system's
	pair  *tls.Certificate // nil: no client certificate

	// askedWithout: a server asked for a client certificate while this
	// client had none to send (Explain).
	askedWithout atomic.Bool
}

// New reads the files of service's settings f and returns their Client,
// or nil when f configures no TLS. Its error is a *FileError naming the
// variable of the file that cannot be read or does not parse.
func New(service Service, f Files) (*Client, error) {
	if !f.Enabled() {
		return nil, nil
	}
	if (f.CertFile == "") != (f.KeyFile == "") {
		return nil, &FileError{Var: service.Prefix + "_CERT_FILE", Path: f.CertFile + f.KeyFile,
			Err: fmt.Errorf("%s_CERT_FILE and %s_KEY_FILE go together: set both or neither", service.Prefix, service.Prefix)}
	}
	c := &Client{service: service, files: f}
	if err := c.reload(true); err != nil {
		return nil, err
	}
	return c, nil
}

// Service is the service c configures.
func (c *Client) Service() Service { return c.service }

// Config returns the TLS configuration of a new connection to serverName,
// the host as dialled (a DNS name or an IP address), which the server's
// certificate must name. It first re-reads the files that changed since
// the last call.
func (c *Client) Config(serverName string) *tls.Config {
	_ = c.reload(false)
	c.mu.Lock()
	roots, pair := c.roots, c.pair
	c.mu.Unlock()
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS12,
		ServerName: serverName,
		RootCAs:    roots,
	}
	if pair != nil {
		// Sent whatever CAs the server says it accepts (the Certificates
		// field is not): a server that refuses it then says why, instead
		// of a bare "certificate required".
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return pair, nil }
	} else {
		// None to send (an empty one is what Go sends without this), but
		// noted: in TLS 1.3 the server refuses after the client's side of
		// the handshake returned, and its reset may overtake its alert.
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			c.askedWithout.Store(true)
			return &tls.Certificate{}, nil
		}
	}
	return cfg
}

// Explain is the service's Explain, and it also explains a connection cut
// right after a handshake in which the server asked for a client
// certificate that this client did not have: the server's alert saying
// so may be lost to the reset (TLS 1.3 refuses after the handshake).
func (c *Client) Explain(err error) error {
	e := c.service.Explain(err)
	if e != err || !c.askedWithout.Load() || //nolint:errorlint // identity: Explain returns err itself when it has nothing to add
		!errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) && !errors.Is(err, io.EOF) {
		return e
	}
	reason, hint := c.service.classify(errors.New("tls: certificate required"))
	return &Error{Service: c.service, Reason: reason, Hint: hint, Err: err}
}

// stamp identifies a version of a file: the kubelet's symlink swap and an
// in-place rewrite both change it.
type stamp struct {
	mod   time.Time
	size  int64
	ino   uint64
	dev   uint64
	valid bool
}

func stat(path string) (stamp, error) {
	fi, err := os.Stat(path) // follows the symlinks of a Secret volume
	if err != nil {
		return stamp{}, err
	}
	s := stamp{mod: fi.ModTime(), size: fi.Size(), valid: true}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		s.ino, s.dev = st.Ino, uint64(st.Dev) //nolint:unconvert // Dev's type differs by platform
	}
	return s, nil
}

// reload re-reads the files whose stamp changed. first: the error of any
// file is returned; later, a file that cannot be read or parsed leaves the
// previous material in use (a rotation caught half way), and its stamp is
// not kept, so the next call tries it again.
func (c *Client) reload(first bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	if c.files.CAFile != "" {
		st, err := stat(c.files.CAFile)
		if err == nil && st != c.ca {
			var pool *x509.CertPool
			if pool, err = readPool(c.files.CAFile); err == nil {
				c.roots, c.ca = pool, st
			}
		}
		if err != nil {
			errs = append(errs, &FileError{Var: c.service.Prefix + "_CA_FILE", Path: c.files.CAFile, Err: err})
		}
	}
	if c.files.CertFile != "" {
		cst, err := stat(c.files.CertFile)
		var kst stamp
		if err == nil {
			kst, err = stat(c.files.KeyFile)
			if err != nil {
				errs = append(errs, &FileError{Var: c.service.Prefix + "_KEY_FILE", Path: c.files.KeyFile, Err: err})
			}
		} else {
			errs = append(errs, &FileError{Var: c.service.Prefix + "_CERT_FILE", Path: c.files.CertFile, Err: err})
		}
		if err == nil && (cst != c.cert || kst != c.key) {
			pair, err := tls.LoadX509KeyPair(c.files.CertFile, c.files.KeyFile)
			if err != nil {
				errs = append(errs, &FileError{Var: c.service.Prefix + "_CERT_FILE", Path: c.files.CertFile,
					Err: fmt.Errorf("with %s_KEY_FILE: %w", c.service.Prefix, err)})
			} else {
				c.pair, c.cert, c.key = &pair, cst, kst
			}
		}
	}
	if first {
		return errors.Join(errs...)
	}
	return nil
}

// readPool reads a PEM bundle of CA certificates.
func readPool(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, errors.New("no PEM certificate in it")
	}
	return pool, nil
}
