package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Standard Webhooks headers (https://www.standardwebhooks.com).
const (
	StandardIDHeader        = "webhook-id"
	StandardTimestampHeader = "webhook-timestamp"
	StandardSignatureHeader = "webhook-signature"
)

// StandardVerifier checks Standard Webhooks signatures: webhook-signature
// holds space-separated "v1,<base64 HMAC-SHA256>" values over
// "<webhook-id>.<webhook-timestamp>.<raw body>", keyed by the base64 secret
// after its whsec_ prefix.
type StandardVerifier struct {
	keys      [][]byte
	tolerance time.Duration
	now       func() time.Time
}

// NewStandardVerifier parses secrets ("whsec_<base64>", the prefix
// optional).
func NewStandardVerifier(secrets []string, tolerance time.Duration) (*StandardVerifier, error) {
	v := &StandardVerifier{tolerance: tolerance, now: time.Now}
	for i, s := range secrets {
		key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(s, "whsec_"))
		if err != nil || len(key) == 0 {
			return nil, &SecretError{Index: i + 1}
		}
		v.keys = append(v.keys, key)
	}
	return v, nil
}

// WithClock returns a copy of v that reads the time from now; for tests.
func (v *StandardVerifier) WithClock(now func() time.Time) *StandardVerifier {
	c := *v
	c.now = now
	return &c
}

// Scheme implements Verifier.
func (v *StandardVerifier) Scheme() string { return SchemeStandard }

// Verify implements Verifier.
func (v *StandardVerifier) Verify(h http.Header, body []byte) (int, error) {
	id, ts, sig := h.Get(StandardIDHeader), h.Get(StandardTimestampHeader), h.Get(StandardSignatureHeader)
	if id == "" || ts == "" || sig == "" {
		return -1, &Error{Reason: ReasonMissing, Detail: "webhook-id, webhook-timestamp and webhook-signature are required"}
	}
	unix, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || unix < 0 {
		return -1, &Error{Reason: ReasonMalformed, Detail: "webhook-timestamp is not a unix timestamp"}
	}
	var sigs [][]byte
	for _, f := range strings.Fields(sig) {
		version, value, ok := strings.Cut(f, ",")
		if !ok || version != "v1" {
			continue // other versions may follow
		}
		raw, err := base64.StdEncoding.DecodeString(value)
		if err != nil || len(raw) != sha256.Size {
			continue
		}
		if len(sigs) < 8 {
			sigs = append(sigs, raw)
		}
	}
	if len(sigs) == 0 {
		return -1, &Error{Reason: ReasonMalformed, Detail: "no well-formed v1 signature in webhook-signature"}
	}
	matched := -1
	for i, key := range v.keys {
		m := hmac.New(sha256.New, key)
		m.Write([]byte(id))
		m.Write([]byte{'.'})
		m.Write([]byte(ts))
		m.Write([]byte{'.'})
		m.Write(body)
		mac := m.Sum(nil)
		for _, s := range sigs {
			if hmac.Equal(mac, s) && matched < 0 {
				matched = i
			}
		}
	}
	if matched < 0 {
		return -1, &Error{Reason: ReasonMismatch, Detail: "no v1 signature matches under any configured secret"}
	}
	if err := CheckAge(v.now(), time.Unix(unix, 0), v.tolerance); err != nil {
		return -1, err
	}
	return matched, nil
}
