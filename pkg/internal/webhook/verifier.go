package webhook

import (
	"errors"
	"fmt"
	"net/http"
)

// Signature schemes of the HMAC verifiers in this package; each is also the
// name of the provider that uses it (pkg/internal/provider).
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
	// ReasonUntrusted is a signature made with a key the receiver does not
	// trust: a certificate from a host off the allow-list, or one whose
	// chain or subject does not verify (PayPal).
	ReasonUntrusted Reason = "certificate_untrusted"
	// ReasonUnavailable is a signature that could not be checked for now:
	// the provider's certificate could not be fetched (PayPal's host down
	// or slow). It is the one reason answered 503, not 401, so the provider
	// retries instead of the event being refused for our outage.
	ReasonUnavailable Reason = "verification_unavailable"
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
// secret that is not whsec_<base64>, a PayPal webhook id that is not
// letters and digits). It never quotes the secret.
type SecretError struct {
	// Index is the position of the secret in its list, from 1.
	Index int
	// Form is what the secret should look like; "" is Standard Webhooks'
	// whsec_<base64>.
	Form string
}

func (e *SecretError) Error() string {
	form := e.Form
	if form == "" {
		form = "whsec_<base64>"
	}
	return fmt.Sprintf("secret %d is not %s", e.Index, form)
}
