package payments

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idempotent-events/idempotent-events/pkg/effects"
)

// Object types whose state is kept.
const (
	PaymentIntent = "payment_intent"
	Charge        = "charge"
)

// observation is what one event says about one object: its state at the
// event's created time, and the cumulative amounts it reported.
type observation struct {
	ev     int // index of the event in its batch
	kind   string
	id     string
	status string
	at     time.Time
	// implied: a PaymentIntent state a charge event implies (a captured,
	// succeeded charge means a succeeded PaymentIntent); it is not the
	// event's own record.
	implied bool
	// refresh: the object as the provider returned it when fetched
	// (RefreshType); it is the truth as of its time.
	refresh bool

	amount, amountReceived, amountCaptured, amountRefunded int64
	currency, paymentIntent                                string
	livemode                                               bool
}

// observe returns what ev says about the objects whose state is kept:
// nothing for other objects, for the short form and for an event without
// a created time (it cannot be ordered).
func observe(i int, ev effects.Event, w *wireEvent) []observation {
	o := w.Data.Object
	if ev.Object.Type != PaymentIntent && ev.Object.Type != Charge || ev.Object.ID == "" || ev.Created.IsZero() ||
		o == nil || o.Status == nil || *o.Status == "" {
		return nil
	}
	obs := observation{ev: i, kind: o.Object, id: o.ID, status: *o.Status, at: ev.Created, refresh: ev.Type == RefreshType,
		amountReceived: o.AmountReceived, amountCaptured: o.AmountCaptured, amountRefunded: o.AmountRefunded, livemode: w.Livemode}
	if o.Amount != nil {
		obs.amount = *o.Amount
	}
	if o.Currency != nil {
		obs.currency = strings.ToLower(*o.Currency)
	}
	if o.PaymentIntent != nil {
		obs.paymentIntent = *o.PaymentIntent
	}
	out := []observation{obs}
	if obs.kind == Charge && obs.paymentIntent != "" && obs.status == "succeeded" && o.Captured {
		out = append(out, observation{ev: i, kind: PaymentIntent, id: obs.paymentIntent, status: "succeeded", at: ev.Created,
			implied: true, amount: obs.amount, amountReceived: obs.amountCaptured, currency: obs.currency, livemode: obs.livemode})
	}
	return out
}

// objectKey names an object across types.
type objectKey struct{ kind, id string }

// objectState is an object's current state as the tables hold it.
type objectState struct {
	known        bool
	status       string
	eventKey     string
	at           time.Time
	needsRefresh bool

	amount, amountReceived, amountCaptured, amountRefunded int64
	currency, paymentIntent                                string
	livemode                                               bool
	dirty                                                  bool
}

// eventRecord is one payment_events row.
type eventRecord struct {
	key, kind, id, eventType, status, outcome, from string
	at                                              time.Time
}

func graphOf(kind string) graph {
	if kind == Charge {
		return chargeGraph
	}
	return paymentIntentGraph
}

// lockObjects serialises the transactions that touch the same objects, in
// one order (so they cannot deadlock), whether or not the objects have a
// row yet. The locks end with the transaction.
const lockObjects = `
SELECT count(pg_advisory_xact_lock(k)) FROM (
	SELECT DISTINCT hashtextextended('payments:' || t || ':' || id, 0) AS k
	FROM unnest($1::text[], $2::text[]) AS o(t, id) ORDER BY 1) s`

// readStates reads the PaymentIntents and Charges asked for, and every
// charge of those PaymentIntents (a refund total needs them all). It runs
// with plan_cache_mode force_custom_plan: planned for its values every
// time. A lookup by "= ANY($1)" kept as a prepared statement gets a
// generic plan after five runs, and on a table that was nearly empty then
// (a new install, a bench) that plan is a sequential scan, kept for the
// connection's life while the table grows: seen reading payment_intents
// row by row, 18 ms a batch at 10,000 rows. Planning each time costs a
// fraction of a millisecond.
const readStates = `
SELECT 'payment_intent', id, status, status_event_id, status_created, needs_refresh,
	amount, amount_received, 0, amount_refunded, currency, '', livemode
FROM payment_intents WHERE id = ANY($1)
UNION ALL
SELECT 'charge', id, status, status_event_id, status_created, needs_refresh,
	amount, 0, amount_captured, amount_refunded, currency, payment_intent_id, false
FROM charges WHERE id = ANY($2) OR payment_intent_id = ANY($1)`

// writeStates writes the changed states, the event records and the
// payments rows ($29…) in one statement.
const writeStates = `
WITH pi AS (
	INSERT INTO payment_intents AS p (id, status, status_event_id, status_created, needs_refresh, amount,
		amount_received, amount_refunded, currency, livemode)
	SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::timestamptz[], $5::bool[], $6::bigint[],
		$7::bigint[], $8::bigint[], $9::text[], $10::bool[])
	ON CONFLICT (id) DO UPDATE SET status = excluded.status, status_event_id = excluded.status_event_id,
		status_created = excluded.status_created, needs_refresh = excluded.needs_refresh, amount = excluded.amount,
		amount_received = excluded.amount_received, amount_refunded = excluded.amount_refunded,
		currency = excluded.currency, livemode = excluded.livemode, updated_at = now()
), ch AS (
	INSERT INTO charges AS c (id, status, status_event_id, status_created, needs_refresh, amount,
		amount_captured, amount_refunded, currency, payment_intent_id)
	SELECT * FROM unnest($11::text[], $12::text[], $13::text[], $14::timestamptz[], $15::bool[], $16::bigint[],
		$17::bigint[], $18::bigint[], $19::text[], $20::text[])
	ON CONFLICT (id) DO UPDATE SET status = excluded.status, status_event_id = excluded.status_event_id,
		status_created = excluded.status_created, needs_refresh = excluded.needs_refresh, amount = excluded.amount,
		amount_captured = excluded.amount_captured, amount_refunded = excluded.amount_refunded,
		currency = excluded.currency, payment_intent_id = excluded.payment_intent_id, updated_at = now()
), pay AS (
	INSERT INTO payments (event_id, payment_intent_id, event_type, amount_cents, currency, status, livemode, event_created_at)
	SELECT p.* FROM unnest($29::text[], $30::text[], $31::text[], $32::bigint[], $33::text[], $34::text[], $35::bool[], $36::timestamptz[])
		AS p(event_id, payment_intent_id, event_type, amount_cents, currency, status, livemode, event_created_at)
	ORDER BY 1
)
INSERT INTO payment_events (event_id, object_type, object_id, event_type, event_created, status, outcome, from_status)
SELECT * FROM unnest($21::text[], $22::text[], $23::text[], $24::text[], $25::timestamptz[], $26::text[], $27::text[], $28::text[])`

// keep applies the observations of evs to the objects' states, in order,
// writes the states and one payment_events row per event that described
// an object, and runs the transition handlers of every change of state.
// It reports which events described an object.
func (h *handler) keep(ctx context.Context, evs []effects.Event, obs []observation, payments []paymentRow, tx effects.Tx, out effects.Outbox) ([]bool, error) {
	described := make([]bool, len(evs))
	states, err := readLocked(ctx, tx, obs)
	if err != nil {
		return nil, err
	}
	var records []eventRecord
	var transitions []effects.Transition
	for _, o := range obs {
		k := objectKey{o.kind, o.id}
		s := states[k]
		if s == nil {
			s = &objectState{}
			states[k] = s
		}
		from := s.status
		outcome := graphOf(o.kind).guard(s.known, s.status, s.at, o.status, o.at)
		if o.refresh {
			// The provider's own current state needs no graph to be
			// believed; only a state newer than the fetch supersedes it.
			outcome = Applied
			if s.known && o.at.Before(s.at) {
				outcome = Superseded
			}
		}
		if graphOf(o.kind).knows(o.status) || o.refresh {
			// A status the graph does not know is no state, and its
			// amounts are not taken either: on an object never seen they
			// could not be written, so taking them on a known one would
			// make the amounts depend on the order.
			s.snapshot(o)
		}
		switch outcome {
		case Applied:
			s.known, s.status, s.eventKey, s.at = true, o.status, evs[o.ev].Key, o.at
			if o.refresh {
				s.needsRefresh = false
			}
			s.amount = o.amount // not cumulative: the current state's
			if from != o.status {
				transitions = append(transitions, effects.Transition{Object: effects.Object{Type: o.kind, ID: o.id},
					From: from, To: o.status, Event: evs[o.ev]})
			}
		case NeedsRefresh:
			s.needsRefresh = true
		}
		if !o.implied {
			described[o.ev] = true
			records = append(records, eventRecord{key: evs[o.ev].Key, kind: o.kind, id: o.id, eventType: evs[o.ev].Type,
				status: o.status, outcome: outcome, from: from, at: o.at})
		}
	}
	refundTotals(states)
	if err := writeLocked(ctx, tx, states, records, payments); err != nil {
		return nil, err
	}
	for _, t := range transitions {
		if err := h.reg.Transition(ctx, t, tx, out); err != nil {
			return nil, err
		}
	}
	return described, nil
}

// snapshot takes the cumulative amounts an observation reported: the
// largest ever reported wins, whatever the order the events came in.
func (s *objectState) snapshot(o observation) {
	s.amountReceived = max(s.amountReceived, o.amountReceived)
	s.amountCaptured = max(s.amountCaptured, o.amountCaptured)
	s.amountRefunded = max(s.amountRefunded, o.amountRefunded)
	if o.currency != "" {
		s.currency = o.currency
	}
	if o.paymentIntent != "" {
		s.paymentIntent = o.paymentIntent
	}
	s.livemode = s.livemode || o.livemode
	s.dirty = true
}

// refundTotals sets each PaymentIntent's amount_refunded to the sum of its
// charges' (each a snapshot), where its charges are known.
func refundTotals(states map[objectKey]*objectState) {
	totals := map[string]int64{}
	for k, s := range states {
		if k.kind == Charge && s.paymentIntent != "" {
			totals[s.paymentIntent] += s.amountRefunded
		}
	}
	for pi, total := range totals {
		if s := states[objectKey{PaymentIntent, pi}]; s != nil && s.amountRefunded != total {
			s.amountRefunded = max(s.amountRefunded, total)
			s.dirty = true
		}
	}
}

// readLocked locks the objects obs name (and their PaymentIntents) and
// reads their states.
func readLocked(ctx context.Context, tx effects.Tx, obs []observation) (map[objectKey]*objectState, error) {
	var kinds, ids, pis, chs []string
	for _, o := range obs {
		kinds, ids = append(kinds, o.kind), append(ids, o.id)
		if o.kind == PaymentIntent {
			pis = append(pis, o.id)
		} else {
			chs = append(chs, o.id)
			if o.paymentIntent != "" {
				kinds, ids, pis = append(kinds, PaymentIntent), append(ids, o.paymentIntent), append(pis, o.paymentIntent)
			}
		}
	}
	// One round trip: the read is its own statement after the lock's, so
	// under READ COMMITTED it sees what the lock waited for. A batch runs
	// its statements prepared (pgx takes no exec mode per statement), so
	// the read is planned for its values by plan_cache_mode, set for it
	// alone (see readStates).
	b := &pgx.Batch{}
	b.Queue(lockObjects, kinds, ids)
	b.Queue("SET LOCAL plan_cache_mode = force_custom_plan")
	b.Queue(readStates, pis, chs)
	b.Queue("SET LOCAL plan_cache_mode TO DEFAULT")
	br := tx.SendBatch(ctx, b)
	states, err := readStatesOf(br)
	if cerr := br.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("read payment objects: %w", cerr)
	}
	if err != nil {
		return nil, err
	}
	return states, nil
}

func readStatesOf(br pgx.BatchResults) (map[objectKey]*objectState, error) {
	if _, err := br.Exec(); err != nil {
		return nil, fmt.Errorf("lock payment objects: %w", err)
	}
	if _, err := br.Exec(); err != nil {
		return nil, fmt.Errorf("read payment objects: %w", err)
	}
	rows, err := br.Query()
	if err != nil {
		return nil, fmt.Errorf("read payment objects: %w", err)
	}
	states := map[objectKey]*objectState{}
	var kind, id string
	var s objectState
	_, err = pgx.ForEachRow(rows, []any{&kind, &id, &s.status, &s.eventKey, &s.at, &s.needsRefresh, &s.amount,
		&s.amountReceived, &s.amountCaptured, &s.amountRefunded, &s.currency, &s.paymentIntent, &s.livemode}, func() error {
		st := s
		st.known = true
		states[objectKey{kind, id}] = &st
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read payment objects: %w", err)
	}
	if _, err := br.Exec(); err != nil {
		return nil, fmt.Errorf("read payment objects: %w", err)
	}
	return states, nil
}

// writeLocked writes the changed states, the event records and the
// payments rows, in one statement.
func writeLocked(ctx context.Context, tx effects.Tx, states map[objectKey]*objectState, records []eventRecord, payments []paymentRow) error {
	keys := make([]objectKey, 0, len(states))
	for k, s := range states {
		if s.dirty && s.known {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, func(a, b objectKey) int { return strings.Compare(a.kind+a.id, b.kind+b.id) })
	var pi, ch stateColumns
	for _, k := range keys {
		if k.kind == PaymentIntent {
			pi.add(k.id, states[k])
		} else {
			ch.add(k.id, states[k])
		}
	}
	n := len(records)
	ek, kinds, ids, types, statuses, outcomes, froms := make([]string, n), make([]string, n), make([]string, n),
		make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	at := make([]time.Time, n)
	for i, r := range records {
		ek[i], kinds[i], ids[i], types[i], statuses[i], outcomes[i], froms[i], at[i] = r.key, r.kind, r.id, r.eventType, r.status, r.outcome, r.from, r.at
	}
	args := append([]any{
		pi.ids, pi.statuses, pi.events, pi.at, pi.refresh, pi.amount, pi.received, pi.refunded, pi.currency, pi.livemode,
		ch.ids, ch.statuses, ch.events, ch.at, ch.refresh, ch.amount, ch.captured, ch.refunded, ch.currency, ch.paymentIntent,
		ek, kinds, ids, types, at, statuses, outcomes, froms}, paymentColumns(payments)...)
	_, err := tx.Exec(ctx, writeStates, args...)
	if err != nil {
		return fmt.Errorf("write payment objects: %w", err)
	}
	return nil
}

// stateColumns are the columns of the rows of one object type to write.
type stateColumns struct {
	ids, statuses, events, currency, paymentIntent []string
	at                                             []time.Time
	refresh, livemode                              []bool
	amount, received, captured, refunded           []int64
}

func (c *stateColumns) add(id string, s *objectState) {
	c.ids, c.statuses, c.events, c.currency = append(c.ids, id), append(c.statuses, s.status), append(c.events, s.eventKey), append(c.currency, s.currency)
	c.paymentIntent, c.at = append(c.paymentIntent, s.paymentIntent), append(c.at, s.at)
	c.refresh, c.livemode = append(c.refresh, s.needsRefresh), append(c.livemode, s.livemode)
	c.amount, c.received = append(c.amount, s.amount), append(c.received, s.amountReceived)
	c.captured, c.refunded = append(c.captured, s.amountCaptured), append(c.refunded, s.amountRefunded)
}
