package config

import (
	"net/http"
	"time"
)

// ReceiverLimits bound what a sender without the signing secret can make
// the receiver do: read bodies slowly, and read and verify bodies that
// fail (httpserver.Guard, docs/security.md).
type ReceiverLimits struct {
	// WebhookBodyTimeout bounds reading a webhook body once its headers
	// are in.
	WebhookBodyTimeout time.Duration `envconfig:"WEBHOOK_BODY_TIMEOUT" default:"10s"`
	// FailureRate and FailureBurst are the budget of failed webhook
	// requests (401, 413, 415, a body not read whole) of one client on one
	// route: FailureBurst at once, then FailureRate a second. Past it the
	// client is answered 429 before its body is read. 0 turns it off.
	FailureRate  float64 `envconfig:"RECEIVER_FAILURE_RATE" default:"2"`
	FailureBurst int     `envconfig:"RECEIVER_FAILURE_BURST" default:"20"`
	// ClientIPHeader is the header a proxy in front of the receiver writes
	// the client's address in (X-Forwarded-For behind an Ingress
	// controller); "" counts failures by the connection's address.
	ClientIPHeader string `envconfig:"RECEIVER_CLIENT_IP_HEADER"`
}

func (l *ReceiverLimits) validate(p *problems) {
	checkPositive(p, "WEBHOOK_BODY_TIMEOUT", l.WebhookBodyTimeout)
	if l.FailureRate < 0 || l.FailureRate > 1e6 {
		p.add("RECEIVER_FAILURE_RATE", "must be 0 (off) to 1000000 failures per second, got %g", l.FailureRate)
	}
	if l.FailureRate > 0 {
		checkRange(p, "RECEIVER_FAILURE_BURST", int64(l.FailureBurst), 1, 1<<20)
	}
	if l.ClientIPHeader != "" && http.CanonicalHeaderKey(l.ClientIPHeader) == "" {
		p.add("RECEIVER_CLIENT_IP_HEADER", "must be a header name, got %q", l.ClientIPHeader)
	}
}
