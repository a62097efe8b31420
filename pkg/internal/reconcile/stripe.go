package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/stripe/stripe-go/v82"
	"github.com/stripe/stripe-go/v82/form"
	"golang.org/x/time/rate"

	"github.com/idempotent-events/idempotent-events/pkg/internal/backoff"
)

// StripeAPIURL is Stripe's API.
const StripeAPIURL = "https://api.stripe.com"

// StripeOptions configures a StripeLog.
type StripeOptions struct {
	// APIKey is a secret or restricted key; a restricted key needs only
	// the read permission on Events.
	APIKey string
	// URL is the API's address: StripeAPIURL, or stripe-mock's in tests.
	URL string
	// Rate is the most requests per second the log makes (Stripe allows
	// 100 read requests/s in live mode and 25 in test mode, shared with
	// everything else that uses the account's keys).
	Rate float64
	// MaxWait bounds how long a request keeps being retried on 429 and
	// network errors before the run fails (and resumes next time).
	MaxWait time.Duration
	// FirstBackoff is the first wait after a 429 (default 1 s); it doubles
	// with each one up to 30 s.
	FirstBackoff time.Duration
	HTTPClient   *http.Client
}

// StripeLog reads a Stripe account's events with stripe-go, keeping each
// event's JSON as Stripe sent it. Stripe keeps 30 days of events.
type StripeLog struct {
	backend stripe.Backend
	key     string
	limit   *rate.Limiter
	maxWait time.Duration
	// firstDelay is the first backoff after a 429 or a network error; it
	// doubles up to 30 s.
	firstDelay time.Duration
	// Calls counts the requests made, 429s included.
	Calls int
	// Throttled counts the 429 answers.
	Throttled int
}

// NewStripeLog returns a StripeLog. stripe-go's own retries are off: 429s
// and network errors are retried here, with backoff, within MaxWait.
func NewStripeLog(o StripeOptions) *StripeLog {
	if o.URL == "" {
		o.URL = StripeAPIURL
	}
	if o.Rate <= 0 {
		o.Rate = 20
	}
	if o.MaxWait <= 0 {
		o.MaxWait = 2 * time.Minute
	}
	if o.FirstBackoff <= 0 {
		o.FirstBackoff = time.Second
	}
	url := o.URL
	cfg := &stripe.BackendConfig{
		URL:               &url,
		MaxNetworkRetries: stripe.Int64(0),
		EnableTelemetry:   stripe.Bool(false),
		HTTPClient:        o.HTTPClient,
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	}
	return &StripeLog{
		backend:    stripe.GetBackendWithConfig(stripe.APIBackend, cfg),
		key:        o.APIKey,
		limit:      rate.NewLimiter(rate.Limit(o.Rate), 1),
		maxWait:    o.MaxWait,
		firstDelay: o.FirstBackoff,
	}
}

// eventPage is one page of GET /v1/events with each event's JSON kept.
type eventPage struct {
	stripe.APIResource
	Data    []json.RawMessage `json:"data"`
	HasMore bool              `json:"has_more"`
}

// eventHead is what the reconciler reads of an event itself.
type eventHead struct {
	ID      string `json:"id"`
	Type    string `json:"type"`
	Created int64  `json:"created"`
}

// ListParams returns the parameters of one page of a window's listing: the
// events created in [q.From, q.To], newest first, after q.After.
func ListParams(q PageQuery) *stripe.EventListParams {
	p := &stripe.EventListParams{
		CreatedRange: &stripe.RangeQueryParams{
			GreaterThanOrEqual: q.From.Unix(),
			LesserThanOrEqual:  q.To.Unix(),
		},
	}
	p.Limit = stripe.Int64(int64(q.limit()))
	if q.After != "" {
		p.StartingAfter = stripe.String(q.After)
	}
	for _, t := range q.Types {
		p.Types = append(p.Types, stripe.String(t))
	}
	if q.UndeliveredOnly {
		p.DeliverySuccess = stripe.Bool(false)
	}
	return p
}

// Page lists one page of events, retrying 429 answers and network errors
// with backoff.
func (s *StripeLog) Page(ctx context.Context, q PageQuery) (Page, error) {
	params := ListParams(q)
	params.Context = ctx
	values := &form.Values{}
	form.AppendTo(values, params)
	var raw eventPage
	if err := s.call(ctx, "/v1/events", []byte(values.Encode()), params.GetParams(), &raw); err != nil {
		return Page{}, fmt.Errorf("list stripe events: %w", err)
	}
	return decodePage(raw)
}

// objectPaths are the API paths of the objects whose state the payment
// effect keeps.
var objectPaths = map[string]string{"payment_intent": "/v1/payment_intents/%s", "charge": "/v1/charges/%s"}

// Object fetches an object's current JSON: a PaymentIntent or a Charge.
func (s *StripeLog) Object(ctx context.Context, kind, id string) ([]byte, error) {
	path, ok := objectPaths[kind]
	if !ok {
		return nil, fmt.Errorf("fetch stripe %s %s: not a kind the payment effect keeps", kind, id)
	}
	var raw stripe.APIResource
	if err := s.call(ctx, stripe.FormatURLPath(path, id), nil, &stripe.Params{Context: ctx}, &raw); err != nil {
		return nil, fmt.Errorf("fetch stripe %s %s: %w", kind, id, err)
	}
	return raw.LastResponse.RawJSON, nil
}

// call makes one GET, retrying 429 answers, 5xx and network errors with
// backoff for at most MaxWait.
func (s *StripeLog) call(ctx context.Context, path string, query []byte, params *stripe.Params, v stripe.LastResponseSetter) error {
	deadline := time.Now().Add(s.maxWait)
	delay := s.firstDelay
	for {
		if err := s.limit.Wait(ctx); err != nil {
			return err
		}
		s.Calls++
		err := s.backend.CallRaw(http.MethodGet, path, s.key, query, params, v)
		if err == nil || !retryable(err) {
			return err
		}
		var se *stripe.Error
		if errors.As(err, &se) && se.HTTPStatusCode == http.StatusTooManyRequests {
			s.Throttled++
		}
		wait := backoff.Jitter(delay)
		if time.Now().Add(wait).After(deadline) {
			return fmt.Errorf("still failing after %s: %w", s.maxWait, err)
		}
		if !backoff.Sleep(ctx, wait) {
			return ctx.Err()
		}
		delay = min(2*delay, 30*time.Second)
	}
}

// retryable: a 429, a 5xx, or no answer at all. Any other answer (a bad
// key, a refused parameter) fails the run at once.
func retryable(err error) bool {
	var se *stripe.Error
	if errors.As(err, &se) {
		return se.HTTPStatusCode == http.StatusTooManyRequests || se.HTTPStatusCode >= 500
	}
	return !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}

func decodePage(raw eventPage) (Page, error) {
	p := Page{HasMore: raw.HasMore, Events: make([]ProviderEvent, 0, len(raw.Data))}
	for i, body := range raw.Data {
		var h eventHead
		if err := json.Unmarshal(body, &h); err != nil {
			return Page{}, fmt.Errorf("list stripe events: item %d is not an event: %w", i, err)
		}
		if h.ID == "" {
			return Page{}, fmt.Errorf("list stripe events: item %d has no id", i)
		}
		p.Events = append(p.Events, ProviderEvent{ID: h.ID, Type: h.Type, Created: time.Unix(h.Created, 0).UTC(), Raw: body})
	}
	return p, nil
}
