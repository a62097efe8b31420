package payments_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/effects"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
	"github.com/idempotent-events/idempotent-events/pkg/payments"
)

// The read of the objects' states is planned for its values every time,
// never from a generic plan: a prepared lookup gets a generic plan after
// five runs, and one made while payment_intents was nearly empty is a
// sequential scan the connection keeps while the table grows (a bench run
// read 10,800 rows a batch so). The connection here runs more batches than
// that; no statement of it reading the states may have used a generic plan.
func TestTheStateReadNeverUsesAGenericPlan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := servicetest.Conn(t, servicetest.Schema(t))
	fx := payments.Effects()
	for b := range 8 {
		var evs []effects.Event
		for i := range 3 {
			id, pi := fmt.Sprintf("evt_plan_%d_%d", b, i), fmt.Sprintf("pi_plan_%d_%d", b, i)
			body := fmt.Sprintf(`{"id":%q,"object":"event","type":"payment_intent.succeeded","created":1700000000,"livemode":false,`+
				`"data":{"object":{"id":%q,"object":"payment_intent","amount":100,"currency":"usd","status":"succeeded","amount_received":100}}}`, id, pi)
			evs = append(evs, effects.Event{Source: "stripe", ID: id, Key: id, Type: "payment_intent.succeeded",
				Created: time.Unix(1700000000, 0), Object: effects.Object{Type: payments.PaymentIntent, ID: pi}, Raw: []byte(body),
				Attempt: 1, Origin: effects.OriginWebhook})
		}
		require.NoError(t, pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			applied, err := fx.Apply(ctx, evs, tx, effects.NoOutbox{})
			assert.Equal(t, []bool{true, true, true}, applied)
			return err
		}))
	}
	var states int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM payment_intents`).Scan(&states))
	require.Equal(t, 24, states, "every batch kept its PaymentIntents")
	// The connection's prepared statements reading payment_intents by id,
	// and how many times they ran from a generic plan.
	plans := func() (reads, generic int) {
		require.NoError(t, conn.QueryRow(ctx, `SELECT count(*), coalesce(sum(generic_plans), 0) FROM pg_prepared_statements
			WHERE statement LIKE '%FROM payment_intents WHERE id = ANY%' AND statement NOT LIKE '%pg_prepared_statements%'`).Scan(&reads, &generic))
		return reads, generic
	}
	reads, generic := plans()
	require.Equal(t, 1, reads, "the state read is not the connection's prepared statement: the check would see nothing")
	assert.Zero(t, generic, "the state read ran from a generic plan")
	// A generic plan of it, outside the handler's transaction, is counted
	// (the check can fail).
	if t.Failed() {
		return
	}
	_, err := conn.Exec(ctx, `PREPARE plan_probe AS SELECT id FROM payment_intents WHERE id = ANY($1)`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `SET plan_cache_mode = force_generic_plan`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `EXECUTE plan_probe('{pi_plan_0_0}')`)
	require.NoError(t, err)
	_, generic = plans()
	assert.Equal(t, 1, generic, "the probe's generic plan is not seen")
}
