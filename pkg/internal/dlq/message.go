package dlq

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
)

// Message is one message in events.dlq as operators see it.
type Message struct {
	// ID is x-ie-dlq-id, or for a message RabbitMQ dead-lettered itself an
	// id derived from its body and x-death (DerivedID is then true).
	ID        string `json:"id"`
	DerivedID bool   `json:"derived_id,omitempty"`
	// EventID is the AMQP message id, or the body's "id" when that is empty;
	// empty for a body that has none.
	EventID   string           `json:"event_id"`
	EventType string           `json:"event_type"`
	Source    string           `json:"source"`
	Reason    broker.DLQReason `json:"reason"`
	// Attempts is x-ie-attempt: the processing attempts the message had.
	Attempts       int       `json:"attempts"`
	FirstError     string    `json:"first_error,omitempty"`
	LastError      string    `json:"last_error,omitempty"`
	FirstFailedAt  time.Time `json:"first_failed_at,omitzero"`
	LastFailedAt   time.Time `json:"last_failed_at,omitzero"`
	DeadLetteredAt time.Time `json:"dead_lettered_at,omitzero"`
	ReceivedAt     time.Time `json:"received_at,omitzero"`
	// ReplayCount is how often the event was replayed before it came back;
	// ReplayOf is the DLQ id of the copy last replayed.
	ReplayCount        int    `json:"replay_count,omitempty"`
	ReplayOf           string `json:"replay_of,omitempty"`
	OriginalExchange   string `json:"original_exchange,omitempty"`
	OriginalRoutingKey string `json:"original_routing_key,omitempty"`
	ContentType        string `json:"content_type,omitempty"`
	Size               int    `json:"size"`
	// Headers and Body are filled by Show only.
	Headers map[string]any `json:"headers,omitempty"`
	Body    []byte         `json:"-"`
}

// Age is how long the message has been in the DLQ, 0 when unknown.
func (m Message) Age(now time.Time) time.Duration {
	if m.DeadLetteredAt.IsZero() {
		return 0
	}
	return now.Sub(m.DeadLetteredAt)
}

// BodyText returns the body for display: as is when it is UTF-8, else
// base64 with a prefix saying so.
func (m Message) BodyText() string {
	if utf8.Valid(m.Body) {
		return string(m.Body)
	}
	return "base64:" + base64.StdEncoding.EncodeToString(m.Body)
}

// PrettyBody returns the body indented when it is JSON, else BodyText.
func (m Message) PrettyBody() string {
	var v any
	if json.Unmarshal(m.Body, &v) == nil {
		if b, err := json.MarshalIndent(v, "", "  "); err == nil {
			return string(b)
		}
	}
	return m.BodyText()
}

// fromDelivery reads what operators need from a DLQ delivery.
func fromDelivery(d amqp.Delivery) Message {
	h := d.Headers
	m := Message{
		ID:                 broker.String(h, broker.HeaderDLQID),
		EventID:            d.MessageId,
		EventType:          d.Type,
		Source:             broker.String(h, broker.HeaderSource),
		Reason:             readReason(broker.String(h, broker.HeaderDLQReason)),
		Attempts:           broker.Attempt(h),
		FirstError:         broker.String(h, broker.HeaderFirstError),
		LastError:          broker.String(h, broker.HeaderLastError),
		FirstFailedAt:      parseTime(broker.String(h, broker.HeaderFirstFailedAt)),
		LastFailedAt:       parseTime(broker.String(h, broker.HeaderLastFailedAt)),
		DeadLetteredAt:     parseTime(broker.String(h, broker.HeaderDeadLetteredAt)),
		ReceivedAt:         broker.ReceivedAt(h),
		OriginalExchange:   broker.String(h, broker.HeaderOriginalExchange),
		OriginalRoutingKey: broker.String(h, broker.HeaderOriginalRoutingKey),
		ContentType:        d.ContentType,
		Size:               len(d.Body),
		Body:               d.Body,
	}
	if n, ok := broker.Int(h, broker.HeaderReplayCount); ok && n > 0 {
		m.ReplayCount = int(n)
	}
	m.ReplayOf = broker.String(h, broker.HeaderReplayOf)
	if m.EventID == "" || m.EventType == "" {
		// Messages published by other producers (and poison) may lack the
		// properties; the body may still say what it is.
		var probe struct {
			ID   any `json:"id"`
			Type any `json:"type"`
		}
		if json.Unmarshal(d.Body, &probe) == nil {
			if s, ok := probe.ID.(string); ok && m.EventID == "" {
				m.EventID = s
			}
			if s, ok := probe.Type.(string); ok && m.EventType == "" {
				m.EventType = s
			}
		}
	}
	death, deathAt := lastDeath(h)
	if m.ID == "" {
		m.ID, m.DerivedID = derivedID(d), true
	}
	if m.Reason == "" {
		m.Reason = broker.ReasonUnknown
		if death != "" {
			m.Reason = death
		}
	}
	if m.DeadLetteredAt.IsZero() {
		m.DeadLetteredAt = deathAt
	}
	if m.DeadLetteredAt.IsZero() && !d.Timestamp.IsZero() {
		m.DeadLetteredAt = d.Timestamp
	}
	return m
}

func parseTime(s string) time.Time {
	if s == "" {
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}
	}
	return t
}

// readReason is the DLQ reason a header names; "" for none, unknown for a
// value that is not a reason.
func readReason(s string) broker.DLQReason {
	if s == "" {
		return ""
	}
	if r, ok := broker.ParseDLQReason(s); ok {
		return r
	}
	return broker.ReasonUnknown
}

// lastDeath returns the reason and time of the most recent dead-lettering
// RabbitMQ recorded in x-death (most recent entry first).
func lastDeath(h amqp.Table) (broker.DLQReason, time.Time) {
	reason := broker.String(h, "x-last-death-reason")
	deaths, _ := h["x-death"].([]any)
	var at time.Time
	if len(deaths) > 0 {
		if first, ok := deaths[0].(amqp.Table); ok {
			if reason == "" {
				reason, _ = first["reason"].(string)
			}
			at, _ = first["time"].(time.Time)
		}
	}
	if reason == "" {
		reason = broker.String(h, "x-first-death-reason")
	}
	return readReason(reason), at
}

// derivedID identifies a message that has no x-ie-dlq-id (RabbitMQ
// dead-lettered it itself): the first 16 hex digits of a sha256 over the
// body, the message id and the x-death entries. None of these change while
// the message sits in the DLQ or is requeued by a browse, so the id is
// stable.
func derivedID(d amqp.Delivery) string {
	hash := sha256.New()
	hash.Write(d.Body)
	fmt.Fprintf(hash, "\x00%s\x00%s\x00%s", d.MessageId,
		broker.String(d.Headers, "x-first-death-queue"), broker.String(d.Headers, "x-first-death-reason"))
	deaths, _ := d.Headers["x-death"].([]any)
	for _, e := range deaths {
		t, ok := e.(amqp.Table)
		if !ok {
			continue
		}
		at, _ := t["time"].(time.Time)
		count, _ := broker.Int(t, "count")
		fmt.Fprintf(hash, "\x00%v|%v|%d|%d", t["queue"], t["reason"], at.Unix(), count)
	}
	return hex.EncodeToString(hash.Sum(nil))[:16]
}

// jsonHeaders turns AMQP header values into JSON-friendly ones: times as
// RFC3339, byte slices as text (or base64), nested tables and arrays
// recursively.
func jsonHeaders(h amqp.Table) map[string]any {
	out := make(map[string]any, len(h))
	for k, v := range h {
		if k == broker.HeaderPublishID {
			continue
		}
		out[k] = jsonValue(v)
	}
	return out
}

func jsonValue(v any) any {
	switch x := v.(type) {
	case amqp.Table:
		return jsonHeaders(x)
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = jsonValue(e)
		}
		return out
	case time.Time:
		return x.UTC().Format(time.RFC3339)
	case []byte:
		if utf8.Valid(x) {
			return string(x)
		}
		return "base64:" + base64.StdEncoding.EncodeToString(x)
	case amqp.Decimal:
		return strconv.FormatInt(int64(x.Value), 10) + "e-" + strconv.Itoa(int(x.Scale))
	}
	return v
}

// HeaderLines returns the headers as sorted "name: value" lines for display.
func (m Message) HeaderLines() []string {
	keys := make([]string, 0, len(m.Headers))
	for k := range m.Headers {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	lines := make([]string, len(keys))
	for i, k := range keys {
		v := m.Headers[k]
		var s string
		switch x := v.(type) {
		case string:
			s = x
		default:
			b, _ := json.Marshal(x)
			s = string(b)
		}
		lines[i] = k + ": " + strings.TrimSpace(s)
	}
	return lines
}

// replayCopy builds the message a replay publishes to events.replay: the
// original body and properties and the pipeline's headers, with a fresh
// attempt count, without the DLQ's own headers and RabbitMQ's x-death
// bookkeeping, and with who replayed it and when.
func replayCopy(d amqp.Delivery, m Message, operator string, now time.Time) amqp.Publishing {
	h := make(amqp.Table, len(d.Headers)+4)
	for k, v := range d.Headers {
		switch {
		case k == broker.HeaderPublishID,
			k == broker.HeaderDeadLetteredAt,
			strings.HasPrefix(k, "x-ie-dlq-"),
			k == "x-death", k == "x-delivery-count",
			strings.HasPrefix(k, "x-first-death-"), strings.HasPrefix(k, "x-last-death-"):
			continue
		}
		h[k] = v
	}
	h[broker.HeaderAttempt] = int64(1)
	h[broker.HeaderReplayedAt] = now.UTC().Format(time.RFC3339Nano)
	h[broker.HeaderReplayedBy] = operator
	h[broker.HeaderReplayOf] = m.ID
	h[broker.HeaderReplayCount] = int64(m.ReplayCount + 1)
	return amqp.Publishing{
		Headers:         h,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		MessageId:       d.MessageId,
		Timestamp:       d.Timestamp,
		Type:            d.Type,
		AppId:           d.AppId,
		Body:            d.Body,
	}
}
