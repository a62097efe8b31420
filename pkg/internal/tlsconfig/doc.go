// Package tlsconfig makes the TLS configuration of the connections to
// RabbitMQ, PostgreSQL and Redis from files: a CA bundle, a client
// certificate and its key per service, as Kubernetes mounts them from a
// Secret (cert-manager writes ca.crt, tls.crt and tls.key into one).
//
// Verification is never weaker than the libraries' strictest mode: the
// server's certificate must chain to the CA bundle (the system's roots
// without one) and name the host the client dialled (pgx's
// sslmode=verify-full, amqp091's and go-redis's defaults for amqps:// and
// rediss://). A URL that would connect in plaintext while TLS is configured
// is refused by the config package, and the PostgreSQL fallbacks that would
// retry without TLS are dropped here.
//
// Rotation: a Client stats its files every time a connection is made, and
// re-reads them when one changed (the kubelet swaps the ..data symlink of
// a Secret volume, cert-manager renews in place). Every new connection
// therefore uses the files as they are now; a connection already open keeps
// the certificate it was made with, which TLS never checks again, so
// nothing in flight is dropped for a rotation. A file that does not parse
// after a change (a writer that is not atomic, caught half way) leaves the
// previous material in use, and is tried again at the next connection.
//
// Errors: Service.Explain turns the TLS failures the clients report, in
// whatever words and wrappings, into one sentence that names the service,
// its URL variable and what is wrong (unknown authority, wrong name,
// expired, client certificate refused), with a hint at the setting to fix.
package tlsconfig
