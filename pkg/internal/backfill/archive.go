// Package backfill runs a handler added to the worker over the events that
// were committed without it, exactly once per (event, handler).
//
// A handler set committed every event of the ledger (processed_events
// records the generation, handler_generations the handlers of each); an
// event whose ledger row exists never runs again, so a handler deployed
// later never sees the events before it. A backfill is how it does:
//
//   - the worker keeps the body and identity of every event it commits in
//     event_archive, in the event's own transaction, while EVENT_ARCHIVE is
//     on (Archive). Off by default: it costs about the body's size per
//     event (docs/effects.md#backfill);
//   - eventsctl effects backfill plans (Plan) and queues (Queue) the events
//     committed in a window by handler sets without the handler, one
//     backfill_items row per (handler, event): unique, so a second run, or
//     one run twice, queues nothing again;
//   - the current workers that run the handler take the items (Runner), at
//     most the backfill's rate between them, and run the handler alone
//     (not the event's other handlers) in a transaction fenced as their
//     commits are, which also marks the item done: the effect and the mark
//     commit together or not at all, whatever is killed when.
//
// Transition handlers cannot be backfilled: a transition is a change of an
// object's state at the moment an event applied, not something an event
// can be run through again. Events without an archived body (committed
// while the archive was off, or pruned) cannot be either; Plan counts them.
package backfill

import (
	"context"
	"fmt"
	"time"

	"github.com/idempotent-events/idempotent-events/pkg/effects"
)

// Archive writes evs to event_archive in tx, the transaction of their
// ledger rows. An event archived before (its ledger row pruned and the
// event committed again) keeps its first copy.
func Archive(ctx context.Context, tx effects.Tx, evs []effects.Event) error {
	n := len(evs)
	if n == 0 {
		return nil
	}
	keys := make([]string, n)
	sources := make([]string, n)
	ids := make([]string, n)
	types := make([]string, n)
	created := make([]*time.Time, n)
	objTypes := make([]string, n)
	objIDs := make([]string, n)
	bodies := make([][]byte, n)
	for i := range evs {
		ev := &evs[i]
		keys[i], sources[i], ids[i], types[i] = ev.Key, ev.Source, ev.ID, ev.Type
		if !ev.Created.IsZero() {
			created[i] = &ev.Created
		}
		objTypes[i], objIDs[i], bodies[i] = ev.Object.Type, ev.Object.ID, ev.Raw
	}
	_, err := tx.Exec(ctx, `
INSERT INTO event_archive (event_id, source, provider_id, event_type, created, object_type, object_id, body)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::timestamptz[], $6::text[], $7::text[], $8::bytea[])
ON CONFLICT (event_id) DO NOTHING`, keys, sources, ids, types, created, objTypes, objIDs, bodies)
	if err != nil {
		return fmt.Errorf("archive %d events: %w", n, err)
	}
	return nil
}
