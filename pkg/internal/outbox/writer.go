package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/idempotent-events/idempotent-events/pkg/effects"
)

// Exchange is the topic exchange messages go to when they name none;
// downstream consumers bind their queues to it.
const Exchange = "effects"

// Channel is the LISTEN/NOTIFY channel an enqueue notifies at COMMIT.
const Channel = "ie_outbox"

// enqueue takes the next sequence number of the object and writes the row,
// in one statement, and notifies the relay at COMMIT.
const enqueue = `
WITH seq AS (
	INSERT INTO outbox_sequences AS s (object_id, last_seq) VALUES ($4, 1)
	ON CONFLICT (object_id) DO UPDATE SET last_seq = s.last_seq + 1
	RETURNING last_seq
)
INSERT INTO outbox (idempotency_key, event_id, effect, object_id, seq, exchange, routing_key, headers, body)
SELECT $1, $2, $3, $4, seq.last_seq, $5, $6, $7, $8 FROM seq, (SELECT pg_notify('` + Channel + `', '')) n`

// Writer is the Outbox the worker gives handlers: it writes in the
// transaction of the event being processed.
type Writer struct{ Tx effects.Tx }

// Key is the idempotency key of the message effect of the event keyed key.
func Key(eventKey, effect string) string { return eventKey + "/" + effect }

// Enqueue implements effects.Outbox.
func (w Writer) Enqueue(ctx context.Context, ev effects.Event, m effects.Message) error {
	switch {
	case m.Effect == "":
		return effects.Permanent(errors.New("outbox: Message.Effect is required (it makes the idempotency key)"))
	case m.RoutingKey == "":
		return effects.Permanent(errors.New("outbox: Message.RoutingKey is required"))
	}
	key := Key(ev.Key, m.Effect)
	object := m.ObjectID
	if object == "" {
		object = key // no ordering asked for: a sequence of its own
	}
	exchange := m.Exchange
	if exchange == "" {
		exchange = Exchange
	}
	headers, err := json.Marshal(m.Headers)
	if err != nil {
		return effects.Permanent(fmt.Errorf("outbox: headers of %s: %w", key, err))
	}
	if m.Headers == nil {
		headers = []byte("{}")
	}
	if m.Body == nil {
		m.Body = []byte{}
	}
	if _, err := w.Tx.Exec(ctx, enqueue, key, ev.Key, m.Effect, object, exchange, m.RoutingKey, headers, m.Body); err != nil {
		return fmt.Errorf("outbox: enqueue %s: %w", key, err)
	}
	return nil
}
