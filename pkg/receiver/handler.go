// Package receiver is the HTTP front of idempotent-events: it takes provider
// webhooks, checks them, and hands them to RabbitMQ.
//
// The rule it keeps: no 2xx for an event the broker has not confirmed. A
// request is answered 202 only after the publish was confirmed by the broker
// and not returned as unroutable; any broker trouble (disconnected, flow
// control, nack, return, timeout) is a 503 with Retry-After, so the provider
// delivers again later. Bad input gets its documented 4xx with a JSON body
// that says what is wrong, and nothing is published for it:
//
//	415 not JSON · 413 body too large · 401 missing, malformed, wrong or
//	stale signature · 400 malformed JSON or a missing / ill-typed field
//
// The signature is verified on the raw bytes before anything parses them.
// An event that Redis or Postgres already records as committed is answered
// 200 {"status":"duplicate"} without a publish; if that lookup fails the
// event is published, and the worker's dedupe decides.
package receiver

import (
	"context"
	"errors"
	"io"
	"mime"
	"net/http"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/idempotent-events/idempotent-events/pkg/broker"
	"github.com/idempotent-events/idempotent-events/pkg/dedupe"
	"github.com/idempotent-events/idempotent-events/pkg/event"
	"github.com/idempotent-events/idempotent-events/pkg/telemetry"
	"github.com/idempotent-events/idempotent-events/pkg/webhook"
)

// PaymentRoute is the Stripe webhook route.
const PaymentRoute = "/webhooks/payment"

// Publisher hands a message to the broker and returns nil only once the
// broker has confirmed it.
type Publisher interface {
	Publish(ctx context.Context, exchange, key string, msg amqp.Publishing) error
	Ready() bool
}

// DuplicateChecker says whether an event has already committed.
type DuplicateChecker interface {
	Committed(ctx context.Context, id string) (ok bool, layer dedupe.Layer, redisErr, err error)
}

// Options configures a Handler.
type Options struct {
	// Verifier checks Stripe signatures; nil accepts unsigned requests
	// (INSECURE_SKIP_SIGNATURE_VERIFICATION).
	Verifier  *webhook.StripeVerifier
	Publisher Publisher
	// Duplicates, when set, answers already-committed events without a
	// publish.
	Duplicates            DuplicateChecker
	DuplicateCheckTimeout time.Duration
	MaxBodyBytes          int64
	PublishTimeout        time.Duration
	RetryAfter            time.Duration
	MaxInFlight           int
	Logger                *zap.Logger
	Metrics               *Metrics
	Now                   func() time.Time
}

// Handler serves the receiver's routes.
type Handler struct {
	opts       Options
	log        *zap.Logger
	m          *Metrics
	slots      chan struct{}
	retryAfter string
	mux        *http.ServeMux
}

// NewHandler returns the receiver's HTTP handler.
func NewHandler(opts Options) *Handler {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	h := &Handler{
		opts:       opts,
		log:        opts.Logger,
		m:          opts.Metrics,
		slots:      make(chan struct{}, opts.MaxInFlight),
		retryAfter: strconv.Itoa(int((opts.RetryAfter + time.Second - 1) / time.Second)),
		mux:        http.NewServeMux(),
	}
	h.mux.HandleFunc("POST "+PaymentRoute, h.payment)
	h.mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		telemetry.WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	telemetry.HealthRoutes(h.mux, h.Ready)
	return h
}

// Ready is nil when the receiver can accept webhooks: the broker is
// connected and not flow-controlled.
func (h *Handler) Ready() error {
	if !h.opts.Publisher.Ready() {
		return errors.New("broker not connected or blocked")
	}
	return nil
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mux.ServeHTTP(w, r)
}

// answer is the JSON body of every webhook response.
type answer struct {
	Status  string `json:"status,omitempty"`
	EventID string `json:"event_id,omitempty"`
	Error   string `json:"error,omitempty"`
	Field   string `json:"field,omitempty"`
	Message string `json:"message,omitempty"`
}

func (h *Handler) respond(w http.ResponseWriter, code int, a answer) {
	h.m.requests.WithLabelValues(PaymentRoute, strconv.Itoa(code)).Inc()
	if code == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", h.retryAfter)
	}
	telemetry.WriteJSON(w, code, a)
}

func (h *Handler) payment(w http.ResponseWriter, r *http.Request) {
	select {
	case h.slots <- struct{}{}:
		defer func() { <-h.slots }()
	default:
		// Shedding beats queueing: the provider retries, and memory stays bounded.
		h.respond(w, http.StatusServiceUnavailable, answer{Error: "overloaded", Message: "too many requests in flight; retry later"})
		return
	}
	start := h.opts.Now()
	defer func() { h.m.duration.Observe(time.Since(start).Seconds()) }()

	if !isJSON(r.Header.Get("Content-Type")) {
		h.respond(w, http.StatusUnsupportedMediaType, answer{Error: "unsupported_media_type", Message: "Content-Type must be application/json"})
		return
	}
	if r.ContentLength > h.opts.MaxBodyBytes {
		h.respond(w, http.StatusRequestEntityTooLarge, answer{Error: "body_too_large", Message: "body exceeds " + strconv.FormatInt(h.opts.MaxBodyBytes, 10) + " bytes"})
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.opts.MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			h.respond(w, http.StatusRequestEntityTooLarge, answer{Error: "body_too_large", Message: "body exceeds " + strconv.FormatInt(h.opts.MaxBodyBytes, 10) + " bytes"})
			return
		}
		h.respond(w, http.StatusBadRequest, answer{Error: "unreadable_body", Message: "could not read the request body"})
		return
	}

	if h.opts.Verifier != nil {
		idx, err := h.opts.Verifier.Verify(r.Header.Get(webhook.StripeHeader), body)
		if err != nil {
			var verr *webhook.Error
			errors.As(err, &verr)
			h.m.signatureFailures.WithLabelValues(string(verr.Reason)).Inc()
			h.log.Info("webhook rejected: signature", zap.String("reason", string(verr.Reason)), zap.String("remote", r.RemoteAddr))
			h.respond(w, http.StatusUnauthorized, answer{Error: string(verr.Reason), Message: verr.Detail})
			return
		}
		h.m.secretMatches.WithLabelValues(strconv.Itoa(idx)).Inc()
	}

	ev, err := event.Decode(body)
	if err != nil {
		var fe *event.FieldError
		errors.As(err, &fe)
		h.respond(w, http.StatusBadRequest, answer{Error: "invalid_event", Field: fe.Field, Message: fe.Problem})
		return
	}

	if h.opts.Duplicates != nil && h.isDuplicate(r.Context(), ev.ID) {
		h.respond(w, http.StatusOK, answer{Status: "duplicate", EventID: ev.ID})
		return
	}

	now := h.opts.Now()
	msg := amqp.Publishing{
		ContentType: "application/json",
		MessageId:   ev.ID,
		Type:        ev.Type,
		Timestamp:   now,
		Body:        body,
		Headers: amqp.Table{
			broker.HeaderSource:     "stripe",
			broker.HeaderReceivedAt: now.UnixMilli(),
		},
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.opts.PublishTimeout)
	defer cancel()
	pubStart := time.Now()
	err = h.opts.Publisher.Publish(ctx, broker.Exchange, broker.RoutingKey, msg)
	h.m.publishSeconds.Observe(time.Since(pubStart).Seconds())
	if err != nil {
		h.m.publishFailures.WithLabelValues(publishFailure(err)).Inc()
		h.log.Warn("publish failed; answering 503", zap.String("event_id", ev.ID), zap.Error(err))
		h.respond(w, http.StatusServiceUnavailable, answer{Error: "broker_unavailable", EventID: ev.ID, Message: "event not accepted; retry later"})
		return
	}
	h.log.Debug("event accepted", zap.String("event_id", ev.ID), zap.String("type", ev.Type))
	h.respond(w, http.StatusAccepted, answer{Status: "accepted", EventID: ev.ID})
}

func (h *Handler) isDuplicate(ctx context.Context, id string) bool {
	ctx, cancel := context.WithTimeout(ctx, h.opts.DuplicateCheckTimeout)
	defer cancel()
	ok, layer, redisErr, err := h.opts.Duplicates.Committed(ctx, id)
	if redisErr != nil {
		h.m.dedupeErrors.WithLabelValues(string(dedupe.LayerRedis)).Inc()
	}
	if err != nil {
		// Unknown is not "duplicate": publish and let the worker decide.
		if err != redisErr {
			h.m.dedupeErrors.WithLabelValues(string(dedupe.LayerPostgres)).Inc()
		}
		h.log.Debug("duplicate check failed; publishing", zap.String("event_id", id), zap.Error(err))
		return false
	}
	if ok {
		h.m.duplicates.WithLabelValues(string(layer)).Inc()
	}
	return ok
}

func publishFailure(err error) string {
	switch {
	case errors.Is(err, broker.ErrReturned):
		return "returned"
	case errors.Is(err, broker.ErrNacked):
		return "nacked"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return "timeout"
	}
	return "unavailable"
}

func isJSON(contentType string) bool {
	if contentType == "" {
		return false
	}
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return false
	}
	return mt == "application/json" || (len(mt) > 5 && mt[len(mt)-5:] == "+json")
}
