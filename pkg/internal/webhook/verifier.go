package webhook

import (
	"errors"
	"fmt"
	"net/http"
	"time"
)

// Signature schemes.
const (
	SchemeStripe   = "stripe"
	SchemeStandard = "standard"
	SchemeGitHub   = "github"
)

// Verifier checks the signature of a request over its raw body.
type Verifier interface {
	// Verify returns the index of the secret that matched, or an *Error.
	Verify(h http.Header, body []byte) (int, error)
	// Scheme names the signature scheme.
	Scheme() string
}

// Reason classifies a verification failure; it is a metric label and part of
// the 401 answer.
type Reason string

// Verification failure reasons.
const (
	ReasonMissing   Reason = "missing_signature"
	ReasonMalformed Reason = "malformed_signature"
	ReasonMismatch  Reason = "signature_mismatch"
	ReasonStale     Reason = "timestamp_too_old"
	ReasonFuture    Reason = "timestamp_in_future"
)

// Error is a failed verification.
type Error struct {
	Reason Reason
	Detail string
}

func (e *Error) Error() string { return string(e.Reason) + ": " + e.Detail }

// ReasonOf returns the Reason of a verification error, or "" if err is not
// one.
func ReasonOf(err error) Reason {
	var e *Error
	if errors.As(err, &e) {
		return e.Reason
	}
	return ""
}

// SecretError is a secret a verifier cannot use (a Standard Webhooks
// secret that is not whsec_<base64>).
type SecretError struct {
	// Index is the position of the secret in its list, from 1.
	Index int
}

func (e *SecretError) Error() string { return fmt.Sprintf("secret %d is not whsec_<base64>", e.Index) }

// NewVerifier returns the verifier of scheme over secrets: the one place
// that maps a scheme name to its verifier. Secrets it cannot use are a
// *SecretError; an unknown scheme is an error naming the known ones.
func NewVerifier(scheme string, secrets []string, tolerance time.Duration) (Verifier, error) {
	switch scheme {
	case SchemeStripe:
		return NewStripeVerifier(secrets, tolerance), nil
	case SchemeStandard:
		return NewStandardVerifier(secrets, tolerance)
	case SchemeGitHub:
		return NewGitHubVerifier(secrets), nil
	}
	return nil, fmt.Errorf("scheme must be %s, %s or %s, got %q", SchemeStripe, SchemeStandard, SchemeGitHub, scheme)
}
