package eventsctl

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/idempotent-events/idempotent-events/pkg/internal/event"
	"github.com/idempotent-events/idempotent-events/pkg/internal/provider/paypal"
)

// paypalTypes are the PayPal event types send makes, with the status of
// the capture resource each carries; "" is a refund resource naming its
// capture (PAYMENT.CAPTURE.REFUNDED and REVERSED carry the refund).
var paypalTypes = map[string]string{
	"PAYMENT.CAPTURE.PENDING":   "PENDING",
	"PAYMENT.CAPTURE.COMPLETED": "COMPLETED",
	"PAYMENT.CAPTURE.DENIED":    "DECLINED",
	"PAYMENT.CAPTURE.DECLINED":  "DECLINED",
	"PAYMENT.CAPTURE.REFUNDED":  "",
	"PAYMENT.CAPTURE.REVERSED":  "",
}

func paypalKnownTypes() []string {
	ts := make([]string, 0, len(paypalTypes))
	for t := range paypalTypes {
		ts = append(ts, t)
	}
	slices.Sort(ts)
	return ts
}

// paypalEvent is a PayPal event about a capture, for paypalBody.
type paypalEvent struct {
	id, typ, status, captureID, currency string
	// amount is the captured amount, refunded the capture's refunded
	// total after a refund; in cents.
	amount, refunded int64
	captured, at     time.Time
}

// money is PayPal's money of cents: a decimal string in the currency's
// unit, as PayPal writes two-decimal currencies.
func money(currency string, cents int64) map[string]any {
	return map[string]any{"currency_code": strings.ToUpper(currency), "value": fmt.Sprintf("%d.%02d", cents/100, cents%100)}
}

// body is the event as PayPal's Payments v2 webhooks send it: a capture
// resource with its status (status set), or a refund resource naming the
// capture in its "up" link, with the refunded total. It is checked as the
// receiver decodes it.
func (e paypalEvent) body() ([]byte, error) {
	stamp := func(t time.Time) string { return t.UTC().Format(time.RFC3339) }
	ev := map[string]any{"id": e.id, "event_version": "1.0", "create_time": stamp(e.at), "resource_version": "2.0",
		"event_type": e.typ, "summary": "sent by eventsctl", "links": []any{}}
	if e.status != "" {
		ev["resource_type"] = "capture"
		ev["resource"] = map[string]any{"id": e.captureID, "status": e.status, "amount": money(e.currency, e.amount), "final_capture": true,
			"seller_receivable_breakdown": map[string]any{"gross_amount": money(e.currency, e.amount),
				"paypal_fee": money(e.currency, e.amount*349/10000), "net_amount": money(e.currency, e.amount-e.amount*349/10000)},
			"create_time": stamp(e.captured), "update_time": stamp(e.at)}
	} else {
		refundID := strings.ToUpper(randomHex(9))
		ev["resource_type"] = "refund"
		ev["resource"] = map[string]any{"id": refundID, "status": "COMPLETED", "amount": money(e.currency, e.refunded),
			"seller_payable_breakdown": map[string]any{"total_refunded_amount": money(e.currency, e.refunded)},
			"create_time":              stamp(e.at), "update_time": stamp(e.at),
			"links": []any{
				map[string]any{"href": "https://api.sandbox.paypal.com/v2/payments/refunds/" + refundID, "rel": "self", "method": "GET"},
				map[string]any{"href": "https://api.sandbox.paypal.com/v2/payments/captures/" + e.captureID, "rel": "up", "method": "GET"},
			}}
	}
	b, err := json.Marshal(ev)
	if err != nil {
		return nil, fmt.Errorf("encode the %s event: %w", e.typ, err)
	}
	if _, err := event.DecodePayPal(b); err != nil {
		return nil, fmt.Errorf("the %s event would be refused by the receiver (check -object, -amount, -currency): %w", e.typ, err)
	}
	return b, nil
}

func newPayPalID(prefix string) string { return prefix + strings.ToUpper(randomHex(9)) }

// paypalDelivery is the one PayPal event the flags describe: -type
// (PAYMENT.CAPTURE.COMPLETED by default) about capture -object (a new one
// by default), -amount captured, or the refunded total for a refund type;
// -status makes it a capture resource with that status instead.
func (f *eventFlags) paypalDelivery(set map[string]bool, object string) (delivery, error) {
	typ := "PAYMENT.CAPTURE.COMPLETED"
	if set["type"] {
		typ = f.typ
	}
	status, ok := paypalTypes[typ]
	if !ok {
		return delivery{}, fmt.Errorf("-type: send makes the PayPal events %s, got %q (or send your own with -file)", strings.Join(paypalKnownTypes(), ", "), typ)
	}
	if set["status"] {
		status = strings.ToUpper(f.status)
	}
	id := f.id
	if id == "" {
		id = newPayPalID("WH-")
	}
	capture := object
	if capture == "" {
		capture = newPayPalID("")
	}
	now := time.Now().Truncate(time.Second)
	e := paypalEvent{id: id, typ: typ, status: status, captureID: capture, currency: f.currency, amount: f.amount,
		refunded: f.amount, captured: now, at: now}
	body, err := e.body()
	return delivery{body: body}, err
}

// paypalEvents makes the events of a PayPal capture's lifecycle: one per
// type, in the order given, step apart from -created, about one capture
// of amount. Each PAYMENT.CAPTURE.REFUNDED refunds an equal share (the
// last one the rest), so the capture is partially refunded until the last;
// PAYMENT.CAPTURE.REVERSED takes back all of it.
func (f *lifecycleFlags) paypalEvents(amount int64, currency string) ([]lifecycleEvent, error) {
	var types []string
	refunds := 0
	for _, t := range strings.Split(f.types, ",") {
		t = strings.TrimSpace(t)
		if _, ok := paypalTypes[t]; !ok {
			return nil, fmt.Errorf("-types: unknown PayPal event type %q; send makes %s", t, strings.Join(paypalKnownTypes(), ", "))
		}
		if t == "PAYMENT.CAPTURE.REFUNDED" {
			refunds++
		}
		types = append(types, t)
	}
	start, err := f.start()
	if err != nil {
		return nil, err
	}
	capture := f.object
	if capture == "" {
		capture = newPayPalID("")
	}
	var evs []lifecycleEvent
	refunded := 0
	for i, typ := range types {
		e := paypalEvent{id: newPayPalID("WH-"), typ: typ, status: paypalTypes[typ], captureID: capture, currency: currency,
			amount: amount, captured: start, at: start.Add(time.Duration(i) * f.step)}
		switch typ {
		case "PAYMENT.CAPTURE.REFUNDED":
			refunded++
			e.refunded = amount * int64(refunded) / int64(refunds)
		case "PAYMENT.CAPTURE.REVERSED":
			e.refunded = amount
		}
		body, err := e.body()
		if err != nil {
			return nil, err
		}
		evs = append(evs, lifecycleEvent{id: e.id, typ: typ, objectID: capture, created: e.at, body: body})
	}
	return evs, nil
}

// paypalFlags are send's flags for a PayPal source.
type paypalFlags struct {
	dir, addr string
	env       bool
}

// defaultPayPalCertAddr is where a new -paypal-dev directory serves its
// certificate.
const defaultPayPalCertAddr = "127.0.0.1:8443"

func (f *paypalFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.dir, "paypal-dev", "", "for a PayPal source: a `directory` holding a stand-in for PayPal's certificate host (made if missing:\n"+
		"a private CA, a message-verification certificate and its key). send signs with the key and serves the certificate\n"+
		"over HTTPS on its loopback address while it sends, for a receiver that trusts it (-paypal-dev-env; docs/providers.md)")
	fs.StringVar(&f.addr, "paypal-cert-addr", defaultPayPalCertAddr, "the loopback `host:port` a new -paypal-dev directory serves its certificate on")
	fs.BoolVar(&f.env, "paypal-dev-env", false, "print the receiver's PAYPAL_CERT_HOSTS and PAYPAL_CA_FILE for -paypal-dev (made if missing), as\n"+
		"shell exports, and send nothing")
}

// dev loads, or makes, the -paypal-dev directory.
func (f *paypalFlags) dev() (*paypalDev, error) {
	if f.dir == "" {
		return nil, errors.New("a PayPal source needs -paypal-dev DIR: PayPal signs with a certificate the receiver downloads " +
			"and must trust, and send stands in for PayPal's host (docs/providers.md)")
	}
	return loadPayPalDev(f.dir, f.addr)
}

// paypalDevCertPath is where the stand-in serves its certificate, named as
// PayPal names its own.
const paypalDevCertPath = "/v1/notifications/certs/CERT-idempotent-events-dev"

// The files of a -paypal-dev directory.
const (
	devCAFile      = "ca.pem"          // PAYPAL_CA_FILE
	devChainFile   = "cert-chain.pem"  // served at paypalDevCertPath
	devSigningKey  = "signing-key.pem" // the certificate's key
	devTLSCertFile = "tls-cert.pem"    // the HTTPS server's certificate
	devTLSKeyFile  = "tls-key.pem"
	devAddrFile    = "address" // host:port, for PAYPAL_CERT_HOSTS
)

// paypalDev stands in for PayPal's certificate host, for trying a PayPal
// source by hand: a CA of its own issued a message-verification
// certificate (CN messageverificationcerts.paypal.com, an RSA key) and the
// TLS certificate of a loopback HTTPS server that serves it. A receiver
// with PAYPAL_CERT_HOSTS naming the address and PAYPAL_CA_FILE the CA
// verifies what send signs exactly as it verifies PayPal's deliveries;
// the CA is trusted for nothing else. Kept in a directory, so the receiver
// can be pointed at it before anything is sent, and the same certificate
// is served every time (the receiver caches it by URL).
type paypalDev struct {
	dir, addr string
	signer    paypal.Signer
	chain     []byte
	tls       tls.Certificate
}

// loadPayPalDev reads the stand-in in dir, making it first (serving on
// addr, which must be a loopback address) when dir holds none.
func loadPayPalDev(dir, addr string) (*paypalDev, error) {
	if _, err := os.Stat(filepath.Join(dir, devAddrFile)); errors.Is(err, os.ErrNotExist) {
		if err := checkDevAddr(addr); err != nil {
			return nil, err
		}
		if err := makePayPalDev(dir, addr); err != nil {
			return nil, fmt.Errorf("-paypal-dev: make %s: %w", dir, err)
		}
	}
	read := func(name string) ([]byte, error) {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("-paypal-dev: %w (remove %s to make a new one)", err, dir)
		}
		return b, nil
	}
	d := &paypalDev{dir: dir}
	var files [5][]byte
	for i, name := range []string{devAddrFile, devChainFile, devSigningKey, devTLSCertFile, devTLSKeyFile} {
		b, err := read(name)
		if err != nil {
			return nil, err
		}
		files[i] = b
	}
	d.addr, d.chain = strings.TrimSpace(string(files[0])), files[1]
	block, _ := pem.Decode(files[2])
	if block == nil {
		return nil, fmt.Errorf("-paypal-dev: %s holds no PEM key (remove %s to make a new one)", devSigningKey, dir)
	}
	key, err := x509.ParsePKCS1PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("-paypal-dev: %s: %w (remove %s to make a new one)", devSigningKey, err, dir)
	}
	if d.tls, err = tls.X509KeyPair(files[3], files[4]); err != nil {
		return nil, fmt.Errorf("-paypal-dev: the TLS certificate: %w (remove %s to make a new one)", err, dir)
	}
	d.signer = paypal.Signer{Key: key, CertURL: "https://" + d.addr + paypalDevCertPath}
	return d, nil
}

// devValidity is how long the stand-in's certificates are valid.
const devValidity = 2 * 365 * 24 * time.Hour

// checkDevAddr accepts a loopback host:port: the stand-in's CA is trusted
// by the receiver for what this address serves, so it serves nothing
// beyond this machine.
func checkDevAddr(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("-paypal-cert-addr: want host:port, got %q", addr)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("-paypal-cert-addr: the stand-in serves on a loopback address only, got %q", addr)
	}
	return nil
}

// makePayPalDev makes the CA, the certificates and their keys in dir, for
// a stand-in serving on addr (checked by checkDevAddr).
func makePayPalDev(dir, addr string) error {
	host, _, _ := net.SplitHostPort(addr)
	ip := net.ParseIP(host)
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	caTmpl := &x509.Certificate{Subject: pkix.Name{CommonName: "idempotent-events PayPal stand-in CA (development only)"},
		IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true, KeyUsage: x509.KeyUsageCertSign}
	ca, caDER, err := issue(caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	signingKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	_, leafDER, err := issue(&x509.Certificate{Subject: pkix.Name{CommonName: "messageverificationcerts.paypal.com"},
		KeyUsage: x509.KeyUsageDigitalSignature}, ca, &signingKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	tlsKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tlsTmpl := &x509.Certificate{Subject: pkix.Name{CommonName: host}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	if ip != nil {
		tlsTmpl.IPAddresses = []net.IP{ip}
	} else {
		tlsTmpl.DNSNames = []string{host}
	}
	_, tlsDER, err := issue(tlsTmpl, ca, &tlsKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	tlsKeyDER, err := x509.MarshalECPrivateKey(tlsKey)
	if err != nil {
		return err
	}
	certPEM := func(der []byte) []byte { return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}) }
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for _, f := range []struct {
		name string
		data []byte
		mode os.FileMode
	}{
		{devCAFile, certPEM(caDER), 0o644},
		{devChainFile, certPEM(leafDER), 0o644},
		{devSigningKey, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(signingKey)}), 0o600},
		{devTLSCertFile, certPEM(tlsDER), 0o644},
		{devTLSKeyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: tlsKeyDER}), 0o600},
		{devAddrFile, []byte(addr + "\n"), 0o644}, // last: its presence says the directory is whole
	} {
		if err := os.WriteFile(filepath.Join(dir, f.name), f.data, f.mode); err != nil {
			return err
		}
	}
	return nil
}

// issue signs tmpl for pub with parent's key, valid from an hour ago (a
// clock a little behind) for devValidity.
func issue(tmpl, parent *x509.Certificate, pub any, by *ecdsa.PrivateKey) (*x509.Certificate, []byte, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		return nil, nil, err
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(devValidity)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, by)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	return cert, der, err
}

// receiverEnv is what a receiver needs to trust the stand-in, as shell
// exports: its address in PAYPAL_CERT_HOSTS, its CA in PAYPAL_CA_FILE.
func (d *paypalDev) receiverEnv() string {
	ca, err := filepath.Abs(filepath.Join(d.dir, devCAFile))
	if err != nil {
		ca = filepath.Join(d.dir, devCAFile)
	}
	quote := func(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
	return fmt.Sprintf("export PAYPAL_CERT_HOSTS=%s\nexport PAYPAL_CA_FILE=%s\n", quote(d.addr), quote(ca))
}

// serve serves the certificate over HTTPS on the stand-in's address until
// stop is called; stop waits for the server to end.
func (d *paypalDev) serve() (stop func(), err error) {
	ln, err := net.Listen("tcp", d.addr)
	if err != nil {
		return nil, fmt.Errorf("-paypal-dev: serve the certificate on %s: %w (is another eventsctl send serving it?)", d.addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+paypalDevCertPath, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/x-pem-file")
		_, _ = w.Write(d.chain)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{d.tls}, MinVersion: tls.VersionTLS12}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.ServeTLS(ln, "", "") // ends with http.ErrServerClosed at stop
	}()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}, nil
}
