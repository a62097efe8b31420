package tlsconfig

import (
	"crypto/x509"
	"errors"
	"strings"
)

// Error is a TLS failure of a connection to a service, in words.
type Error struct {
	Service Service
	// Reason says what is wrong: "certificate signed by unknown authority".
	Reason string
	// Hint says which setting to look at; may be empty.
	Hint string
	// Err is the client library's error.
	Err error
}

// Error is "PostgreSQL (DATABASE_URL): TLS: <reason>; <hint> (<library's error>)".
func (e *Error) Error() string {
	s := e.Service.String() + ": TLS: " + e.Reason
	if e.Hint != "" {
		s += "; " + e.Hint
	}
	return s + " (" + e.Err.Error() + ")"
}

func (e *Error) Unwrap() error { return e.Err }

// Explain returns err as an *Error when it is a TLS failure of a
// connection to s, and err unchanged otherwise (nil, io.EOF, a timeout, a
// refused password stay what they are). It reads the error's chain first
// and then its words, since not every client keeps the chain (amqp091 and
// pgx put some TLS failures into text of their own).
func (s Service) Explain(err error) error {
	if err == nil {
		return nil
	}
	var already *Error
	if errors.As(err, &already) {
		return err
	}
	reason, hint := s.classify(err)
	if reason == "" {
		return err
	}
	return &Error{Service: s, Reason: reason, Hint: hint, Err: err}
}

func (s Service) classify(err error) (reason, hint string) {
	ca := s.Prefix + "_CA_FILE"
	cert := s.Prefix + "_CERT_FILE"
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	var invalid x509.CertificateInvalidError
	switch {
	case errors.As(err, &unknown):
		return "certificate signed by unknown authority", "the server's certificate does not chain to a CA of " + ca + " (or of the system's roots, without it)"
	case errors.As(err, &host):
		return "the server's certificate is not valid for the host in " + s.URLVar + " (" + strings.TrimPrefix(host.Error(), "x509: ") + ")",
			"connect by a name the certificate lists"
	case errors.As(err, &invalid) && invalid.Reason == x509.Expired:
		return "the server's certificate has expired or is not yet valid", "renew the server's certificate (or check the clocks)"
	}
	msg := err.Error()
	has := func(words ...string) bool {
		for _, w := range words {
			if strings.Contains(msg, w) {
				return true
			}
		}
		return false
	}
	switch {
	case has("certificate signed by unknown authority"):
		return "certificate signed by unknown authority", "the server's certificate does not chain to a CA of " + ca + " (or of the system's roots, without it)"
	case has("x509: certificate is valid for", "x509: certificate is not valid for any names"):
		return "the server's certificate is not valid for the host in " + s.URLVar, "connect by a name the certificate lists"
	case has("x509: certificate has expired or is not yet valid"):
		return "the server's certificate has expired or is not yet valid", "renew the server's certificate (or check the clocks)"
	case has("tls: certificate required", "requires a valid client certificate", "connection requires a valid client certificate"):
		return "the server requires a client certificate", "set " + cert + " and " + s.Prefix + "_KEY_FILE"
	case has("tls: expired certificate", "tls: certificate expired"):
		return "the server refused the client certificate: it has expired", "renew the certificate of " + cert
	case has("tls: unknown certificate authority", "tls: bad certificate", "tls: unsupported certificate",
		"tls: certificate revoked", "tls: unknown certificate", "tls: access denied"):
		return "the server refused the client certificate", "is " + cert + " issued by a CA the server trusts?"
	case has("first record does not look like a TLS handshake", "server refused TLS connection", "tls: handshake failure"):
		return "the server did not complete a TLS handshake", "is TLS enabled on the server, on the port in " + s.URLVar + "?"
	case has("tls: ", "x509: "):
		return "handshake failed", ""
	}
	return "", ""
}
