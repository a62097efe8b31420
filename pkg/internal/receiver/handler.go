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
//	stale signature, or an untrusted certificate · 400 malformed JSON or a
//	missing / ill-typed field
//
// A signature that cannot be checked for now (PayPal's certificate host
// down) is a 503, like a broker outage: the provider retries.
//
// Each source's provider (pkg/internal/provider) verifies the signature on
// the raw bytes before anything parses them, then says where the event's
// identity is and decodes the body, as the worker will decode the published
// message. A provider that batches has every event of a delivery decoded
// before any is published, and the delivery is answered 2xx only once every
// event is confirmed.
// An event that Redis or Postgres already records as committed is answered
// 200 {"status":"duplicate"} without a publish; if that lookup fails the
// event is published, and the worker's dedupe decides.
package receiver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/dedupe"
	"github.com/idempotent-events/idempotent-events/pkg/internal/event"
	"github.com/idempotent-events/idempotent-events/pkg/internal/httpserver"
	"github.com/idempotent-events/idempotent-events/pkg/internal/options"
	"github.com/idempotent-events/idempotent-events/pkg/internal/provider"
	"github.com/idempotent-events/idempotent-events/pkg/internal/telemetry"
	"github.com/idempotent-events/idempotent-events/pkg/internal/webhook"
)

// PaymentRoute is the Stripe webhook route.
const PaymentRoute = "/webhooks/payment"

// Publisher hands a message to the broker and returns nil only once the
// broker has confirmed it.
type Publisher interface {
	Publish(ctx context.Context, exchange, key string, msg amqp.Publishing) error
	Ready() bool
}

// DuplicateChecker tells whether an event has committed, and with which
// content digest; *dedupe.Checker is the real one.
type DuplicateChecker interface {
	Committed(ctx context.Context, id string) dedupe.Answer
}

// Source is one webhook sender: a route, a provider and its verifier.
type Source struct {
	// Name is the source's name: "stripe" for PaymentRoute, otherwise the
	// {source} of /webhooks/{source}. It qualifies the dedupe key.
	Name string
	// Route is the path the source posts to.
	Route string
	// Scheme is the provider's name (provider.Names), which says where the
	// event id is and how the worker reads the body.
	Scheme string
	// Provider identifies and decodes the source's deliveries (and splits
	// batches); nil means the registry's provider of Scheme.
	Provider provider.Provider
	// Verifier checks signatures, usually Provider itself; nil accepts
	// unsigned requests (INSECURE_SKIP_SIGNATURE_VERIFICATION).
	Verifier webhook.Verifier
}

// Options configures a Handler.
type Options struct {
	// Sources are the routes served; PaymentRoute with Stripe's scheme is
	// the default one.
	Sources   []Source
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

func (o *Options) validate() error {
	p := options.Check("receiver")
	need := p.Need
	need(len(o.Sources) > 0, "Sources", "must name at least one route")
	need(o.Publisher != nil, "Publisher", "is required")
	need(o.Duplicates == nil || o.DuplicateCheckTimeout > 0, "DuplicateCheckTimeout", "must be positive with Duplicates")
	need(o.MaxBodyBytes > 0, "MaxBodyBytes", "must be positive")
	need(o.PublishTimeout > 0, "PublishTimeout", "must be positive")
	need(o.RetryAfter >= time.Second, "RetryAfter", "must be at least 1s")
	need(o.MaxInFlight >= 1, "MaxInFlight", "must be at least 1")
	need(o.Metrics != nil, "Metrics", "is required")
	for i, src := range o.Sources {
		if src.Provider == nil {
			_, err := provider.New(src.Scheme, provider.Settings{})
			need(err == nil, fmt.Sprintf("Sources[%d].Scheme", i), fmt.Sprint(err))
		} else {
			need(src.Scheme == "" || src.Scheme == src.Provider.Scheme(), fmt.Sprintf("Sources[%d].Scheme", i), "must be its Provider's")
		}
	}
	if err := p.Err(); err != nil {
		return err
	}
	return nil
}

// NewHandler validates opts and returns the receiver's HTTP handler.
func NewHandler(opts Options) (*Handler, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
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
	for _, src := range opts.Sources {
		if src.Provider == nil {
			// Without secrets: only its Identify and Decode are used.
			src.Provider, _ = provider.New(src.Scheme, provider.Settings{})
		}
		if src.Scheme == "" {
			src.Scheme = src.Provider.Scheme()
		}
		h.mux.HandleFunc("POST "+src.Route, func(w http.ResponseWriter, r *http.Request) { h.webhook(w, r, src) })
	}
	h.mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		httpserver.WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	telemetry.HealthRoutes(h.mux, h.Ready)
	return h, nil
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
	// EventIDs are the events of a batched delivery, in its order.
	EventIDs []string `json:"event_ids,omitempty"`
	Error    string   `json:"error,omitempty"`
	Field    string   `json:"field,omitempty"`
	Message  string   `json:"message,omitempty"`
}

func (h *Handler) respond(w http.ResponseWriter, src Source, code int, a answer) {
	h.m.requests.WithLabelValues(src.Route, strconv.Itoa(code)).Inc()
	if code == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", h.retryAfter)
	}
	httpserver.WriteJSON(w, code, a)
}

func (h *Handler) webhook(w http.ResponseWriter, r *http.Request, src Source) {
	start := h.opts.Now()
	defer func() { h.m.duration.Observe(time.Since(start).Seconds()) }()

	if !isJSON(r.Header.Get("Content-Type")) {
		h.respond(w, src, http.StatusUnsupportedMediaType, answer{Error: "unsupported_media_type", Message: "Content-Type must be application/json"})
		return
	}
	tooBig := answer{Error: "body_too_large", Message: "body exceeds " + strconv.FormatInt(h.opts.MaxBodyBytes, 10) + " bytes"}
	if r.ContentLength > h.opts.MaxBodyBytes {
		h.respond(w, src, http.StatusRequestEntityTooLarge, tooBig)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.opts.MaxBodyBytes))
	if err != nil {
		var maxErr *http.MaxBytesError
		if errors.As(err, &maxErr) {
			h.respond(w, src, http.StatusRequestEntityTooLarge, tooBig)
			return
		}
		h.respond(w, src, http.StatusBadRequest, answer{Error: "unreadable_body", Message: "could not read the request body"})
		return
	}

	// The slot is taken only once the body is in: a client that trickles
	// its body (bounded by the server's read timeout) holds no slot, so slow
	// clients cannot crowd out the requests waiting on the broker.
	select {
	case h.slots <- struct{}{}:
		defer func() { <-h.slots }()
	default:
		// Shedding beats queueing: the provider retries, and memory stays bounded.
		h.respond(w, src, http.StatusServiceUnavailable, answer{Error: "overloaded", Message: "too many requests in flight; retry later"})
		return
	}

	if src.Verifier != nil {
		idx, err := src.Verifier.Verify(r.Header, body)
		if err != nil {
			h.rejectSignature(w, r, src, err)
			return
		}
		h.m.secretMatches.WithLabelValues(src.Name, strconv.Itoa(idx)).Inc()
	}

	d := src.Provider.Identify(r.Header)
	sp, batched := src.Provider.(provider.Splitter)
	items := []provider.Item{{Delivery: d, Body: body}}
	if batched {
		if items, err = sp.Split(r.Header, body); err == nil && len(items) == 0 {
			err = &event.FieldError{Field: "body", Problem: "the delivery holds no event"}
		}
		if err != nil {
			h.rejectEvent(w, src, "", err)
			return
		}
	}
	// Every item is decoded before any is published: a delivery with one
	// bad item publishes nothing.
	evs := make([]event.Event, len(items))
	for i, it := range items {
		if evs[i], err = src.Provider.Decode(it.Delivery, it.Body); err != nil {
			h.rejectEvent(w, src, it.Path, err)
			return
		}
	}
	if batched {
		h.publishBatch(w, r, src, d, items, evs)
		return
	}
	ev := evs[0]
	providerID, key := ev.ID, event.Key(src.Name, ev.ID)

	digest := ev.DigestHex()
	conflict := false
	if h.opts.Duplicates != nil {
		switch stored := h.committedDigest(r.Context(), key); {
		case stored == "":
		case event.SameContent(stored, digest):
			h.respond(w, src, http.StatusOK, answer{Status: "duplicate", EventID: providerID})
			return
		default:
			// Published all the same, so the worker records it in
			// event_conflicts; it is never processed.
			conflict = true
		}
	}

	if err := h.publish(r.Context(), src, ev, body); err != nil {
		h.respond(w, src, http.StatusServiceUnavailable, answer{Error: "broker_unavailable", EventID: providerID, Message: "event not accepted; retry later"})
		return
	}
	if conflict {
		h.conflicted(src, key)
		h.respond(w, src, http.StatusConflict, answer{Error: "event_id_conflict", EventID: providerID,
			Message: "this event id was already processed with different content; this delivery is recorded for inspection and will not be processed"})
		return
	}
	h.log.Debug("event accepted", zap.String("event_id", key), zap.String("type", ev.Type), zap.String("delivery_id", d.DeliveryID))
	h.respond(w, src, http.StatusAccepted, answer{Status: "accepted", EventID: providerID})
}

// publishBatch publishes the events of a batched delivery one by one and
// answers 202 only once every one is confirmed; 200 duplicate when every
// one is already committed. A failed publish is a 503 for the whole
// delivery: the provider sends it again, and the events published before
// the failure are duplicates then. An event whose id was committed with
// other content is published for event_conflicts as a single delivery's
// would be, but does not fail the batch: a 409 would have the provider
// resend the other events for ever.
func (h *Handler) publishBatch(w http.ResponseWriter, r *http.Request, src Source, d webhook.Delivery, items []provider.Item, evs []event.Event) {
	ids := make([]string, len(evs))
	published := 0
	for i, ev := range evs {
		ids[i] = ev.ID
		key := event.Key(src.Name, ev.ID)
		conflict := false
		if h.opts.Duplicates != nil {
			switch stored := h.committedDigest(r.Context(), key); {
			case stored == "":
			case event.SameContent(stored, ev.DigestHex()):
				continue
			default:
				conflict = true
			}
		}
		if err := h.publish(r.Context(), src, ev, items[i].Body); err != nil {
			h.respond(w, src, http.StatusServiceUnavailable, answer{Error: "broker_unavailable", Message: "delivery not accepted; retry later"})
			return
		}
		published++
		if conflict {
			h.conflicted(src, key)
		}
	}
	if published == 0 {
		h.respond(w, src, http.StatusOK, answer{Status: "duplicate", EventIDs: ids})
		return
	}
	h.log.Debug("batch accepted", zap.String("source", src.Name), zap.Int("events", len(evs)), zap.Int("published", published),
		zap.String("delivery_id", d.DeliveryID))
	h.respond(w, src, http.StatusAccepted, answer{Status: "accepted", EventIDs: ids})
}

// publish hands one event to the broker and returns once it is confirmed;
// a failure is counted and logged here, and answered 503 by the caller.
func (h *Handler) publish(ctx context.Context, src Source, ev event.Event, body []byte) error {
	key := event.Key(src.Name, ev.ID)
	now := h.opts.Now()
	msg := amqp.Publishing{
		ContentType: "application/json",
		MessageId:   key,
		Type:        ev.Type,
		Timestamp:   now,
		Body:        body,
		Headers: amqp.Table{
			broker.HeaderSource:     src.Name,
			broker.HeaderDigest:     ev.DigestHex(),
			broker.HeaderReceivedAt: now.UnixMilli(),
		},
	}
	if src.Scheme != event.DefaultScheme {
		// Without a scheme the worker reads the body as the default one's.
		msg.Headers[broker.HeaderScheme] = src.Scheme
		msg.Headers[broker.HeaderEventID] = ev.ID
		msg.Headers[broker.HeaderEventType] = ev.Type
	}
	ctx, cancel := context.WithTimeout(ctx, h.opts.PublishTimeout)
	defer cancel()
	pubStart := time.Now()
	err := h.opts.Publisher.Publish(ctx, broker.Exchange, broker.RoutingKey, msg)
	h.m.publishSeconds.Observe(time.Since(pubStart).Seconds())
	if err != nil {
		h.m.publishFailures.WithLabelValues(publishFailure(err)).Inc()
		h.log.Warn("publish failed; answering 503", zap.String("event_id", key), zap.Error(err))
	}
	return err
}

// conflicted counts and logs an event id reused with other content.
func (h *Handler) conflicted(src Source, key string) {
	h.m.conflicts.WithLabelValues(src.Name).Inc()
	h.log.Warn("event id reused with different content", zap.String("source", src.Name), zap.String("event_id", key))
}

// rejectEvent answers 400 for a delivery that does not decode; path, when
// set, is the JSON path of the batch item the field is in.
func (h *Handler) rejectEvent(w http.ResponseWriter, src Source, path string, err error) {
	a := answer{Error: "invalid_event", Field: "body", Message: "the event could not be decoded"}
	var fe *event.FieldError
	if errors.As(err, &fe) && fe != nil {
		a.Field, a.Message = fe.Field, fe.Problem
	} else {
		// Decoders promise a *FieldError; anything else is a bug there,
		// but the input is still refused, not served a panic.
		h.log.Warn("webhook rejected: event decoder failed without naming a field", zap.String("source", src.Name),
			zap.String("error_type", fmt.Sprintf("%T", err)))
	}
	if path != "" {
		a.Field = path + "." + a.Field
	}
	h.respond(w, src, http.StatusBadRequest, a)
}

// reasonUnclassified is the 401 answer and metric label of a verification
// error that is not a *webhook.Error.
const reasonUnclassified webhook.Reason = "verification_failed"

// rejectSignature answers 401 for a failed verification and logs it once;
// a verification that could not be done for now (ReasonUnavailable) is a
// 503 instead.
// A verifier that breaks its contract (a plain error, or a nil
// *webhook.Error in a non-nil error) has still not verified the request, so
// it gets the same answer with reasonUnclassified. Only such an error's type
// is logged, not its text: an error nobody classified may quote the
// signature header it failed on.
func (h *Handler) rejectSignature(w http.ResponseWriter, r *http.Request, src Source, err error) {
	reason, detail := reasonUnclassified, "the signature could not be verified"
	fields := []zap.Field{zap.String("source", src.Name), zap.String("remote", r.RemoteAddr)}
	var verr *webhook.Error
	if errors.As(err, &verr) && verr != nil && verr.Reason == webhook.ReasonUnavailable {
		// Our outage, not a bad request: the provider retries.
		h.log.Warn("webhook not verified for now: answering 503", append(fields, zap.String("reason", string(verr.Reason)),
			zap.String("detail", verr.Detail))...)
		h.respond(w, src, http.StatusServiceUnavailable, answer{Error: string(verr.Reason), Message: verr.Detail + "; retry later"})
		return
	}
	if errors.As(err, &verr) && verr != nil {
		reason, detail = verr.Reason, verr.Detail
		h.log.Info("webhook rejected: signature", append(fields, zap.String("reason", string(reason)))...)
	} else {
		h.log.Warn("webhook rejected: the verifier failed without a reason",
			append(fields, zap.String("reason", string(reason)), zap.String("error_type", fmt.Sprintf("%T", err)))...)
	}
	h.m.signatureFailures.WithLabelValues(src.Name, string(reason)).Inc()
	h.respond(w, src, http.StatusUnauthorized, answer{Error: string(reason), Message: detail})
}

// committedDigest returns the content digest of key's committed event, or
// "" when it has not committed or the lookup failed.
func (h *Handler) committedDigest(ctx context.Context, key string) string {
	ctx, cancel := context.WithTimeout(ctx, h.opts.DuplicateCheckTimeout)
	defer cancel()
	a := h.opts.Duplicates.Committed(ctx, key)
	if a.RedisErr != nil {
		h.m.dedupeErrors.WithLabelValues(string(dedupe.LayerRedis)).Inc()
	}
	if a.LedgerErr != nil {
		h.m.dedupeErrors.WithLabelValues(string(dedupe.LayerPostgres)).Inc()
	}
	if !a.Known {
		// Unknown is not "duplicate": publish and let the worker decide.
		h.log.Debug("duplicate check failed; publishing", zap.String("event_id", key),
			zap.NamedError("redis_error", a.RedisErr), zap.NamedError("ledger_error", a.LedgerErr))
		return ""
	}
	if a.Digest != "" {
		h.m.duplicates.WithLabelValues(string(a.Layer)).Inc()
	}
	return a.Digest
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
