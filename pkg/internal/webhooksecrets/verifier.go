package webhooksecrets

import (
	"net/http"
	"sync/atomic"

	"github.com/idempotent-events/idempotent-events/pkg/internal/webhook"
)

// Verifier is a webhook.Verifier whose verifier can be replaced while
// requests are being verified: each Verify uses the one in force when it
// started, whole, so a rotation never lets a request be checked against a
// mix of two secret sets or against none.
type Verifier struct {
	cur atomic.Pointer[holder]
}

// holder boxes the interface value: atomic.Pointer needs a concrete type.
type holder struct{ v webhook.Verifier }

// NewVerifier returns a Verifier that verifies with v until Set replaces it.
func NewVerifier(v webhook.Verifier) *Verifier {
	s := &Verifier{}
	s.Set(v)
	return s
}

// Set makes v the verifier of every Verify that starts from now on.
func (s *Verifier) Set(v webhook.Verifier) { s.cur.Store(&holder{v: v}) }

// Current is the verifier in force.
func (s *Verifier) Current() webhook.Verifier { return s.cur.Load().v }

// Verify implements webhook.Verifier with the verifier in force.
func (s *Verifier) Verify(h http.Header, body []byte) (int, error) {
	return s.Current().Verify(h, body)
}

// Scheme implements webhook.Verifier.
func (s *Verifier) Scheme() string { return s.Current().Scheme() }
