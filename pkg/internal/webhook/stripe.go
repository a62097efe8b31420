package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// StripeHeader is the header that carries a Stripe signature.
const StripeHeader = "Stripe-Signature"

// StripeVerifier checks Stripe-Signature headers. Stripe signs
// "t.<raw body>" with HMAC-SHA256 under the endpoint's signing secret and
// sends Stripe-Signature: t=<unix seconds>,v1=<hex>[,v1=<hex>…]. A request
// is authentic when any v1 value matches the MAC under any of the configured
// secrets (several during a rotation) and its timestamp is within the
// tolerance of now, in either direction: an old timestamp is a replay, one
// from the future is a forgery or a broken clock. Every comparison of secret
// material is constant-time.
type StripeVerifier struct {
	secrets   [][]byte
	tolerance time.Duration
	now       func() time.Time
}

// NewStripeVerifier returns a verifier that accepts signatures made with any
// of secrets and timestamps within tolerance of now.
func NewStripeVerifier(secrets []string, tolerance time.Duration) *StripeVerifier {
	v := &StripeVerifier{tolerance: tolerance, now: time.Now}
	for _, s := range secrets {
		v.secrets = append(v.secrets, []byte(s))
	}
	return v
}

// WithClock returns a copy of v that reads the time from now; for tests.
func (v *StripeVerifier) WithClock(now func() time.Time) *StripeVerifier {
	c := *v
	c.now = now
	return &c
}

// Scheme implements Verifier.
func (v *StripeVerifier) Scheme() string { return SchemeStripe }

// Verify implements Verifier: it checks the Stripe-Signature header.
func (v *StripeVerifier) Verify(h http.Header, body []byte) (int, error) {
	return v.VerifyHeader(h.Get(StripeHeader), body)
}

// VerifyHeader checks a Stripe-Signature value against body. On success it
// returns the index of the secret that matched, so a rotation can be
// finished with evidence.
func (v *StripeVerifier) VerifyHeader(header string, body []byte) (int, error) {
	if header == "" {
		return -1, &Error{Reason: ReasonMissing, Detail: "no " + StripeHeader + " header"}
	}
	ts, sigs, err := parseStripeHeader(header)
	if err != nil {
		return -1, err
	}
	matched := -1
	mac := make([]byte, 0, sha256.Size)
	for i, secret := range v.secrets {
		mac = stripeMAC(mac[:0], secret, ts, body)
		for _, sig := range sigs {
			// hmac.Equal is constant-time; every candidate is compared so the
			// time taken does not depend on which one matched.
			if hmac.Equal(mac, sig) && matched < 0 {
				matched = i
			}
		}
	}
	if matched < 0 {
		return -1, &Error{Reason: ReasonMismatch, Detail: "no v1 signature matches the body under any configured secret"}
	}
	if err := CheckAge(v.now(), time.Unix(ts, 0), v.tolerance); err != nil {
		return -1, err
	}
	return matched, nil
}

// CheckAge rejects a signature timestamp further than tolerance from now,
// in either direction: old is a replay, future is a forgery or a broken
// clock. Both edges are inclusive.
func CheckAge(now, signed time.Time, tolerance time.Duration) error {
	age := now.Sub(signed)
	switch {
	case age > tolerance:
		return &Error{Reason: ReasonStale, Detail: "timestamp is older than the tolerance of " + tolerance.String()}
	case age < -tolerance:
		return &Error{Reason: ReasonFuture, Detail: "timestamp is further in the future than the tolerance of " + tolerance.String()}
	}
	return nil
}

// parseStripeHeader reads t and every v1 from "t=…,v1=…,v0=…". Unknown
// schemes are ignored, as Stripe documents.
func parseStripeHeader(header string) (int64, [][]byte, error) {
	var (
		ts    int64 = -1
		sigs  [][]byte
		rest  = header
		field string
	)
	for rest != "" {
		field, rest, _ = strings.Cut(rest, ",")
		key, value, ok := strings.Cut(strings.TrimSpace(field), "=")
		if !ok {
			return 0, nil, &Error{Reason: ReasonMalformed, Detail: "element without '=' in " + StripeHeader}
		}
		switch key {
		case "t":
			n, err := strconv.ParseInt(value, 10, 64)
			if err != nil || n < 0 {
				return 0, nil, &Error{Reason: ReasonMalformed, Detail: "t is not a unix timestamp"}
			}
			ts = n
		case "v1":
			if len(value) != 2*sha256.Size {
				continue // cannot match; other v1 values may
			}
			sig, err := hex.DecodeString(value)
			if err != nil {
				continue
			}
			if len(sigs) < 8 {
				sigs = append(sigs, sig)
			}
		}
	}
	if ts < 0 {
		return 0, nil, &Error{Reason: ReasonMalformed, Detail: "no t= timestamp in " + StripeHeader}
	}
	if len(sigs) == 0 {
		return 0, nil, &Error{Reason: ReasonMalformed, Detail: "no well-formed v1= signature in " + StripeHeader}
	}
	return ts, sigs, nil
}

func stripeMAC(dst, secret []byte, ts int64, body []byte) []byte {
	m := hmac.New(sha256.New, secret)
	var buf [20]byte
	m.Write(strconv.AppendInt(buf[:0], ts, 10))
	m.Write([]byte{'.'})
	m.Write(body)
	return m.Sum(dst)
}

// SignStripe returns a Stripe-Signature header value for body signed with
// secret at time t, as Stripe would send it.
func SignStripe(secret string, t time.Time, body []byte) string {
	mac := stripeMAC(nil, []byte(secret), t.Unix(), body)
	return "t=" + strconv.FormatInt(t.Unix(), 10) + ",v1=" + hex.EncodeToString(mac)
}
