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

// Channel is the LISTEN/NOTIFY channel that wakes the relays (see
// Notifier).
const Channel = "ie_outbox"

// enqueue writes messages in one statement: each object's next sequence
// numbers are taken in the order the messages were enqueued (sequences in
// object order, so two transactions cannot deadlock on them). It does not
// notify: see Notifier.
const enqueue = `
WITH m AS (
	SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::bytea[])
		WITH ORDINALITY AS m(key, event_id, effect, object_id, exchange, routing_key, headers, body, ord)
), counts AS (
	SELECT object_id, count(*) AS n FROM m GROUP BY object_id
), seq AS (
	INSERT INTO outbox_sequences AS s (object_id, last_seq)
	SELECT object_id, n FROM counts ORDER BY object_id
	ON CONFLICT (object_id) DO UPDATE SET last_seq = s.last_seq + excluded.last_seq
	RETURNING object_id, last_seq
)
INSERT INTO outbox (idempotency_key, event_id, effect, object_id, seq, exchange, routing_key, headers, body)
SELECT m.key, m.event_id, m.effect, m.object_id,
	seq.last_seq - counts.n + row_number() OVER (PARTITION BY m.object_id ORDER BY m.ord),
	m.exchange, m.routing_key, m.headers::jsonb, m.body
FROM m JOIN seq USING (object_id) JOIN counts USING (object_id)
ORDER BY m.ord`

// Key is the idempotency key of the message effect of the event keyed key.
func Key(eventKey, effect string) string { return eventKey + "/" + effect }

// Batch is the Outbox the worker gives the handlers of one transaction: it
// keeps their messages and writes them all in one statement (Flush) before
// COMMIT.
type Batch struct {
	tx                                             effects.Tx
	notifier                                       *Notifier // nil: the relays poll
	wrote                                          bool
	keys, events, effects, objects, exchanges, rks []string
	headers                                        []string
	bodies                                         [][]byte
}

// NewBatch returns a Batch writing in tx.
func NewBatch(tx effects.Tx) *Batch { return &Batch{tx: tx} }

// Enqueue implements effects.Outbox; the message is written by Flush.
func (b *Batch) Enqueue(_ context.Context, ev effects.Event, m effects.Message) error {
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
	headers := []byte("{}")
	if m.Headers != nil {
		var err error
		if headers, err = json.Marshal(m.Headers); err != nil {
			return effects.Permanent(fmt.Errorf("outbox: headers of %s: %w", key, err))
		}
	}
	body := m.Body
	if body == nil {
		body = []byte{}
	}
	b.keys, b.events, b.effects, b.objects = append(b.keys, key), append(b.events, ev.Key), append(b.effects, m.Effect), append(b.objects, object)
	b.exchanges, b.rks, b.headers, b.bodies = append(b.exchanges, exchange), append(b.rks, m.RoutingKey), append(b.headers, string(headers)), append(b.bodies, body)
	return nil
}

// Flush writes the messages enqueued since the last Flush.
func (b *Batch) Flush(ctx context.Context) error {
	if len(b.keys) == 0 {
		return nil
	}
	if _, err := b.tx.Exec(ctx, enqueue, b.keys, b.events, b.effects, b.objects, b.exchanges, b.rks, b.headers, b.bodies); err != nil {
		return fmt.Errorf("outbox: enqueue %d messages (%s…): %w", len(b.keys), b.keys[0], err)
	}
	*b = Batch{tx: b.tx, notifier: b.notifier, wrote: true}
	return nil
}

// Committed tells the relays, when Flush wrote messages and the Batch came
// from a Notifier; the worker calls it after COMMIT.
func (b *Batch) Committed() {
	if b.wrote && b.notifier != nil {
		b.notifier.Committed()
	}
}

// Writer is an Outbox that writes each message at once, in tx: for code
// that enqueues outside the worker (tools, tests).
type Writer struct{ Tx effects.Tx }

// Enqueue implements effects.Outbox.
func (w Writer) Enqueue(ctx context.Context, ev effects.Event, m effects.Message) error {
	b := NewBatch(w.Tx)
	if err := b.Enqueue(ctx, ev, m); err != nil {
		return err
	}
	return b.Flush(ctx)
}
