package paypal

import (
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/idempotent-events/idempotent-events/pkg/internal/webhook"
)

// Bounds of the certificate cache and of one download.
const (
	// maxCachedCerts bounds the cache: PayPal signs with one certificate
	// at a time (two around a renewal), per environment.
	maxCachedCerts = 32
	// maxCertLife re-fetches a certificate daily even if it is valid for
	// longer, so a certificate PayPal stops serving is not used for a year.
	maxCertLife = 24 * time.Hour
	// refusedFor remembers a refused certificate URL, so a stream of
	// forged requests naming it costs one download a minute.
	refusedFor = time.Minute
	// maxCertBytes bounds a download: a chain is a few kilobytes.
	maxCertBytes = 64 << 10
	// maxChain bounds the certificates of one download.
	maxChain = 8
	// minKeyBits is the smallest RSA key accepted.
	minKeyBits = 2048
)

// certSource fetches, verifies and caches the signing certificates named
// by PAYPAL-CERT-URL.
type certSource struct {
	hosts  map[string]bool
	roots  *x509.CertPool
	client *http.Client
	now    func() time.Time

	mu    sync.Mutex
	cache map[string]*certEntry
}

// certEntry is one URL's download: done is closed once key (or err) and
// expires are set, so concurrent requests for the URL wait for one
// download.
type certEntry struct {
	done    chan struct{}
	added   time.Time
	key     *rsa.PublicKey
	err     error
	expires time.Time
}

func newCertSource(hosts []string, roots *x509.CertPool, timeout time.Duration, now func() time.Time) *certSource {
	c := &certSource{hosts: map[string]bool{}, roots: roots, now: now, cache: map[string]*certEntry{}}
	for _, h := range hosts {
		c.hosts[normalHost(h)] = true
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	// Downloads are rare (cached); no idle connection, so no goroutine
	// outlives one.
	tr.DisableKeepAlives = true
	c.client = &http.Client{
		Transport: tr,
		Timeout:   timeout,
		// A redirect could lead off the allow-list: it is an answer like
		// any other non-200, and refused.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return c
}

// normalHost lower-cases a host and drops the default port, so
// "API.PayPal.com:443" is "api.paypal.com".
func normalHost(h string) string {
	h = strings.ToLower(h)
	if host, port, err := net.SplitHostPort(h); err == nil && port == "443" {
		return host
	}
	return h
}

func untrusted(detail string) error {
	return &webhook.Error{Reason: webhook.ReasonUntrusted, Detail: detail}
}

func unavailable(detail string) error {
	return &webhook.Error{Reason: webhook.ReasonUnavailable, Detail: detail}
}

// allowed parses rawURL and accepts only https on an allow-listed host.
func (c *certSource) allowed(rawURL string) (*url.URL, error) {
	const want = CertURLHeader + " must be an https URL on an allowed certificate host"
	if len(rawURL) > maxCertURL {
		return nil, untrusted(want)
	}
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme != "https" || u.User != nil || u.Opaque != "" || !c.hosts[normalHost(u.Host)] {
		return nil, untrusted(want)
	}
	return u, nil
}

// key returns the public key of the verified certificate at rawURL.
func (c *certSource) key(rawURL string) (*rsa.PublicKey, error) {
	u, err := c.allowed(rawURL)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if e := c.cache[rawURL]; e != nil {
		select {
		case <-e.done:
			if c.now().Before(e.expires) {
				c.mu.Unlock()
				return e.key, e.err
			}
			delete(c.cache, rawURL)
		default:
			c.mu.Unlock()
			<-e.done
			return e.key, e.err
		}
	}
	e := &certEntry{done: make(chan struct{}), added: c.now()}
	c.insert(rawURL, e)
	c.mu.Unlock()

	e.key, e.expires, e.err = c.fetch(u)
	if webhook.ReasonOf(e.err) == webhook.ReasonUnavailable {
		// Not remembered: the next request tries again.
		c.mu.Lock()
		if c.cache[rawURL] == e {
			delete(c.cache, rawURL)
		}
		c.mu.Unlock()
	}
	close(e.done)
	return e.key, e.err
}

// insert adds e, evicting the oldest entry when the cache is full. Called
// with c.mu held. An evicted download in flight still completes for those
// waiting on it.
func (c *certSource) insert(rawURL string, e *certEntry) {
	if len(c.cache) >= maxCachedCerts {
		var oldest string
		for k, v := range c.cache {
			if oldest == "" || v.added.Before(c.cache[oldest].added) {
				oldest = k
			}
		}
		delete(c.cache, oldest)
	}
	c.cache[rawURL] = e
}

// fetch downloads and verifies the certificate at u. It returns the key,
// until when to keep it (or the refusal), and a *webhook.Error.
func (c *certSource) fetch(u *url.URL) (*rsa.PublicKey, time.Time, error) {
	now := c.now()
	refused := now.Add(refusedFor)
	resp, err := c.client.Get(u.String())
	if err != nil {
		var uerr *url.Error
		if errors.As(err, &uerr) && isTLSTrust(uerr.Err) {
			return nil, refused, untrusted("the certificate host's TLS certificate does not verify")
		}
		return nil, now, unavailable("the certificate could not be downloaded")
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500:
		return nil, now, unavailable(fmt.Sprintf("the certificate host answered %d", resp.StatusCode))
	case resp.StatusCode != http.StatusOK:
		return nil, refused, untrusted(fmt.Sprintf("the certificate URL answered %d", resp.StatusCode))
	}
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxCertBytes+1))
	if err != nil {
		return nil, now, unavailable("the certificate download was cut off")
	}
	if len(raw) > maxCertBytes {
		return nil, refused, untrusted("the certificate download is larger than 64 KiB")
	}
	key, notAfter, err := c.verify(raw, now)
	if err != nil {
		return nil, refused, untrusted(err.Error())
	}
	return key, minTime(notAfter, now.Add(maxCertLife)), nil
}

// isTLSTrust reports whether err is the TLS peer's certificate failing to
// verify: permanent, unlike a network error.
func isTLSTrust(err error) bool {
	var unknown x509.UnknownAuthorityError
	var invalid x509.CertificateInvalidError
	var host x509.HostnameError
	var verr *tls.CertificateVerificationError
	return errors.As(err, &unknown) || errors.As(err, &invalid) || errors.As(err, &host) || errors.As(err, &verr)
}

// verify checks a downloaded chain (the signing certificate first, then
// intermediates) against c.roots at now, and returns the signing
// certificate's key and expiry.
func (c *certSource) verify(raw []byte, now time.Time) (*rsa.PublicKey, time.Time, error) {
	chain, err := ParseChain(raw)
	if err != nil {
		return nil, time.Time{}, err
	}
	leaf := chain[0]
	inter := x509.NewCertPool()
	for _, cert := range chain[1:] {
		inter.AddCert(cert)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: c.roots, Intermediates: inter, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return nil, time.Time{}, errors.New("the certificate's chain does not verify")
	}
	cn := leaf.Subject.CommonName
	if !strings.HasPrefix(cn, "messageverificationcerts.") || !strings.HasSuffix(cn, ".paypal.com") {
		return nil, time.Time{}, errors.New("the certificate is not PayPal's message-verification certificate")
	}
	key, ok := leaf.PublicKey.(*rsa.PublicKey)
	if !ok || key.N.BitLen() < minKeyBits {
		return nil, time.Time{}, errors.New("the certificate's key is not RSA of at least 2048 bits")
	}
	return key, leaf.NotAfter, nil
}

// ParseChain reads the PEM certificates of a download, the signing
// certificate first. Blocks of other types are skipped; no certificate, or
// more than maxChain, is an error.
func ParseChain(raw []byte) ([]*x509.Certificate, error) {
	var chain []*x509.Certificate
	for rest := raw; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		if len(chain) == maxChain {
			return nil, fmt.Errorf("the download holds more than %d certificates", maxChain)
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, errors.New("the download holds a certificate that does not parse")
		}
		chain = append(chain, cert)
	}
	if len(chain) == 0 {
		return nil, errors.New("the download holds no PEM certificate")
	}
	return chain, nil
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
