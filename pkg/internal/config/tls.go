package config

import (
	"net/url"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// TLS settings of the connections to the three services: files, so that
// Kubernetes mounts them from Secrets (cert-manager's ca.crt, tls.crt,
// tls.key), per service, because the services are often provided apart (a
// managed PostgreSQL with its provider's CA, an in-cluster RabbitMQ with
// cert-manager's). Giving any of a service's files, or <SVC>_TLS_REQUIRED,
// makes TLS mandatory for it: a URL that would connect in plaintext is
// refused here, at start, rather than sending a password in the clear. The
// files are read when the binary starts (a missing one exits 2 naming its
// variable), not by --check-config, which runs where the Secrets are not
// mounted (CI, a rendered chart). Package tlsconfig reads and reloads them.

// TLS is one service's TLS settings.
type TLS struct {
	CAFile, CertFile, KeyFile string
	Required                  bool
}

// Enabled reports whether the service's connections must use TLS.
func (t TLS) Enabled() bool {
	return t.Required || t.CAFile != "" || t.CertFile != "" || t.KeyFile != ""
}

// AMQPTLS is the TLS of the RabbitMQ connections.
type AMQPTLS struct {
	AMQPTLSCAFile   string `envconfig:"AMQP_TLS_CA_FILE"`
	AMQPTLSCertFile string `envconfig:"AMQP_TLS_CERT_FILE"`
	AMQPTLSKeyFile  string `envconfig:"AMQP_TLS_KEY_FILE"`
	AMQPTLSRequired bool   `envconfig:"AMQP_TLS_REQUIRED" default:"false"`
}

// AMQPTLSSettings returns the settings as a TLS.
func (a AMQPTLS) AMQPTLSSettings() TLS {
	return TLS{CAFile: a.AMQPTLSCAFile, CertFile: a.AMQPTLSCertFile, KeyFile: a.AMQPTLSKeyFile, Required: a.AMQPTLSRequired}
}

// RedisTLS is the TLS of the Redis connections.
type RedisTLS struct {
	RedisTLSCAFile   string `envconfig:"REDIS_TLS_CA_FILE"`
	RedisTLSCertFile string `envconfig:"REDIS_TLS_CERT_FILE"`
	RedisTLSKeyFile  string `envconfig:"REDIS_TLS_KEY_FILE"`
	RedisTLSRequired bool   `envconfig:"REDIS_TLS_REQUIRED" default:"false"`
}

// RedisTLSSettings returns the settings as a TLS.
func (r RedisTLS) RedisTLSSettings() TLS {
	return TLS{CAFile: r.RedisTLSCAFile, CertFile: r.RedisTLSCertFile, KeyFile: r.RedisTLSKeyFile, Required: r.RedisTLSRequired}
}

// DatabaseTLS is the TLS of the PostgreSQL connections.
type DatabaseTLS struct {
	DatabaseTLSCAFile   string `envconfig:"DATABASE_TLS_CA_FILE"`
	DatabaseTLSCertFile string `envconfig:"DATABASE_TLS_CERT_FILE"`
	DatabaseTLSKeyFile  string `envconfig:"DATABASE_TLS_KEY_FILE"`
	DatabaseTLSRequired bool   `envconfig:"DATABASE_TLS_REQUIRED" default:"false"`
}

// DatabaseTLSSettings returns the settings as a TLS.
func (d DatabaseTLS) DatabaseTLSSettings() TLS {
	return TLS{CAFile: d.DatabaseTLSCAFile, CertFile: d.DatabaseTLSCertFile, KeyFile: d.DatabaseTLSKeyFile, Required: d.DatabaseTLSRequired}
}

// validateTLS checks a service's settings t (variables prefix_*) against
// its URL: the client certificate and key go together, and with TLS
// enabled the URL must not connect in plaintext (plaintext(url) says why
// it would, or ""). A URL that does not parse is reported by its own
// check, not here.
func validateTLS(p *problems, prefix, urlVar string, t TLS, plaintext func() string) {
	if (t.CertFile == "") != (t.KeyFile == "") {
		p.add(prefix+"_CERT_FILE", "%s_CERT_FILE and %s_KEY_FILE go together: set both or neither", prefix, prefix)
	}
	if !t.Enabled() {
		return
	}
	if why := plaintext(); why != "" {
		p.add(urlVar, "%s, but TLS is required (%s)", why, tlsReason(prefix, t))
	}
}

// tlsReason names the setting that makes TLS required.
func tlsReason(prefix string, t TLS) string {
	switch {
	case t.CAFile != "":
		return prefix + "_CA_FILE is set"
	case t.CertFile != "":
		return prefix + "_CERT_FILE is set"
	case t.KeyFile != "":
		return prefix + "_KEY_FILE is set"
	}
	return prefix + "_REQUIRED=true"
}

// amqpPlaintext says which node of an AMQP_URL is not amqps://.
func amqpPlaintext(raw string) string {
	nodes := strings.Split(raw, ",")
	for i, node := range nodes {
		u, err := url.Parse(strings.TrimSpace(node))
		if err != nil || u.Scheme == "amqps" {
			continue
		}
		if len(nodes) > 1 {
			return "node " + strconv.Itoa(i+1) + " of the list is an amqp:// URL, plaintext; use amqps://"
		}
		return "an amqp:// URL is plaintext; use amqps://"
	}
	return ""
}

// redisPlaintext says whether a REDIS_URL is not rediss://.
func redisPlaintext(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "rediss" {
		return ""
	}
	return "a redis:// URL is plaintext; use rediss://"
}

// databasePlaintext says whether a DATABASE_URL's sslmode connects
// without TLS first (disable, allow). prefer, require and the verify modes
// are upgraded to verify-full by the TLS settings.
func databasePlaintext(raw string) string {
	cfg, err := pgconn.ParseConfig(raw)
	if err != nil || strings.HasPrefix(cfg.Host, "/") || cfg.TLSConfig != nil {
		return ""
	}
	return "its sslmode (disable or allow) connects in plaintext; drop sslmode or use sslmode=verify-full"
}
