package effectstest_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/effects"
	"github.com/idempotent-events/idempotent-events/pkg/effects/effectstest"
	"github.com/idempotent-events/idempotent-events/pkg/payments"
)

// lifecycle returns the events of one PaymentIntent that fails an
// asynchronous debit, is retried and succeeds, then is partly refunded.
func lifecycle(t *testing.T, n int) [][]byte {
	t.Helper()
	t0 := time.Unix(1_760_000_000, 0)
	pi := fmt.Sprintf("pi_eo_%d", n)
	ev := func(i int, typ string, at int, obj map[string]any) []byte {
		return effectstest.StripeEvent(t, fmt.Sprintf("evt_eo_%d_%d", n, i), typ, t0.Add(time.Duration(at)*time.Second), obj)
	}
	charge := func(refunded int64) map[string]any {
		return map[string]any{"id": "ch_" + pi, "object": "charge", "status": "succeeded", "payment_intent": pi, "captured": true,
			"amount": 2500, "amount_captured": 2500, "amount_refunded": refunded, "currency": "usd"}
	}
	return [][]byte{
		ev(0, "payment_intent.created", 0, effectstest.PaymentIntent(pi, "requires_payment_method", 2500)),
		ev(1, "payment_intent.processing", 1, effectstest.PaymentIntent(pi, "processing", 2500)),
		ev(2, "payment_intent.payment_failed", 9, effectstest.PaymentIntent(pi, "requires_payment_method", 2500)),
		ev(3, "payment_intent.succeeded", 20, effectstest.PaymentIntent(pi, "succeeded", 2500)),
		ev(4, "charge.succeeded", 20, charge(0)),
		ev(5, "charge.refunded", 40, charge(700)),
	}
}

// The built-in payment effect, under duplicates and crashes before and
// after COMMIT, ends with the tables of one clean run. Which event set the
// state, and how each event was decided (applied or superseded), depend on
// the order events are processed in, which no two runs share: those columns
// are not compared; the states, the amounts and one record per event are.
func TestTheBuiltInPaymentEffectIsExactlyOnce(t *testing.T) {
	t.Parallel()
	var fixtures [][]byte
	for n := range 4 {
		fixtures = append(fixtures, lifecycle(t, n)...)
	}
	effectstest.AssertExactlyOnce(t, effectstest.Options{
		Effects: payments.Effects(), Fixtures: fixtures,
		Tables: []string{"payments", "payment_intents", "charges", "payment_events"},
		Ignore: []string{"id", "created_at", "updated_at", "recorded_at", "status_event_id", "outcome", "from_status"},
	})
}

// poolWriter is a handler that breaks the contract: it writes its rows
// through a connection of its own instead of the transaction it is given.
func poolWriter(db func() *pgxpool.Pool) effects.HandlerFunc {
	return func(ctx context.Context, ev effects.Event, _ effects.Tx, _ effects.Outbox) error {
		_, err := db().Exec(ctx, `INSERT INTO audit_log (event_id) VALUES ($1)`, ev.Key)
		return err
	}
}

// AssertExactlyOnce must catch a handler that writes through the pool: the
// attempt killed before COMMIT keeps its row. Run in a child test process,
// which must fail with the assertion's message.
func TestAssertExactlyOnceCatchesAHandlerThatWritesThroughThePool(t *testing.T) {
	if os.Getenv("EFFECTSTEST_POOL_WRITER") == "1" {
		var pool *pgxpool.Pool
		reg := effects.NewRegistry()
		reg.Handle("pool-writer", "stripe", "*", poolWriter(func() *pgxpool.Pool { return pool }))
		effectstest.AssertExactlyOnce(t, effectstest.Options{
			Effects: reg,
			Fixtures: [][]byte{
				effectstest.StripeEvent(t, "evt_pw_1", "payment_intent.succeeded", time.Now(), effectstest.PaymentIntent("pi_pw_1", "succeeded", 100)),
				effectstest.StripeEvent(t, "evt_pw_2", "payment_intent.succeeded", time.Now(), effectstest.PaymentIntent("pi_pw_2", "succeeded", 100)),
			},
			Setup: func(ctx context.Context, db *pgxpool.Pool) error {
				p, err := pgxpool.New(ctx, db.Config().ConnString())
				if err != nil {
					return err
				}
				t.Cleanup(p.Close)
				pool = p
				_, err = db.Exec(ctx, `CREATE TABLE audit_log (event_id text)`)
				return err
			},
			Tables: []string{"audit_log"},
		})
		return
	}
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^TestAssertExactlyOnceCatchesAHandlerThatWritesThroughThePool$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "EFFECTSTEST_POOL_WRITER=1")
	out, err := cmd.CombinedOutput()
	require.Error(t, err, "AssertExactlyOnce passed a handler that writes through the pool:\n%s", out)
	require.Contains(t, string(out), "table audit_log differs between one clean run and the run with duplicates and crashes", "%s", out)
}

// The same change with a backfill: the old workers archive what they
// commit, and after the rollout receipts.send runs over the events sent
// before it, once each, so every event ends with exactly one receipt.
func TestAssertRolloutWithABackfillOfTheHandlerAdded(t *testing.T) {
	t.Parallel()
	write := func(table string) effects.HandlerFunc {
		return func(ctx context.Context, ev effects.Event, tx effects.Tx, _ effects.Outbox) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+table+` (event_id, origin) VALUES ($1, $2)`, ev.Key, string(ev.Origin))
			return err
		}
	}
	v1 := effects.NewRegistry()
	v1.Handle("orders.create", "stripe", "payment_intent.succeeded", write("bf_orders"))
	v2 := effects.NewRegistry()
	v2.Handle("orders.create", "stripe", "payment_intent.succeeded", write("bf_orders"))
	v2.Handle("receipts.send", "stripe", "payment_intent.succeeded", write("bf_receipts"))
	events := func(prefix string, n int) [][]byte {
		var bodies [][]byte
		for i := range n {
			bodies = append(bodies, effectstest.StripeEvent(t, fmt.Sprintf("evt_bf_%s_%d", prefix, i), "payment_intent.succeeded",
				time.Unix(1_760_000_000, 0), effectstest.PaymentIntent(fmt.Sprintf("pi_bf_%s_%d", prefix, i), "succeeded", 1000)))
		}
		return bodies
	}
	effectstest.AssertRollout(t, effectstest.RolloutOptions{
		Old: v1, New: v2, Before: events("before", 20), During: events("during", 30), Backfill: "receipts.send",
		Setup: func(ctx context.Context, db *pgxpool.Pool) error {
			// No key on the receipts: a second run would show as a second row.
			_, err := db.Exec(ctx, `CREATE TABLE bf_orders (event_id text PRIMARY KEY, origin text); CREATE TABLE bf_receipts (event_id text, origin text)`)
			return err
		},
		Check: func(t *testing.T, db *pgxpool.Pool, before, during []string) {
			var n, distinct, backfilled int
			require.NoError(t, db.QueryRow(context.Background(), `SELECT count(*), count(DISTINCT event_id), count(*) FILTER (WHERE origin = 'backfill') FROM bf_receipts`).
				Scan(&n, &distinct, &backfilled))
			require.Equal(t, len(before)+len(during), n, "one receipt per event")
			require.Equal(t, n, distinct)
			require.Equal(t, len(before), backfilled, "the events sent before the rollout got theirs from the backfill")
		},
	})
}

// A team adds a receipts handler to its handler set: AssertRollout runs
// the old set, then the old and the new together after the new release is
// announced. Every event sent during the rollout gets its receipt; none
// sent before does (those need a backfill).
func TestAssertRolloutOfAHandlerAdded(t *testing.T) {
	t.Parallel()
	orders := func(ctx context.Context, ev effects.Event, tx effects.Tx, _ effects.Outbox) error {
		_, err := tx.Exec(ctx, `INSERT INTO rollout_orders (event_id) VALUES ($1)`, ev.Key)
		return err
	}
	receipts := func(ctx context.Context, ev effects.Event, tx effects.Tx, _ effects.Outbox) error {
		_, err := tx.Exec(ctx, `INSERT INTO rollout_receipts (event_id) VALUES ($1)`, ev.Key)
		return err
	}
	v1 := effects.NewRegistry()
	v1.HandleFunc("orders.create", "stripe", "payment_intent.succeeded", orders)
	v2 := effects.NewRegistry()
	v2.HandleFunc("orders.create", "stripe", "payment_intent.succeeded", orders)
	v2.HandleFunc("receipts.send", "stripe", "payment_intent.succeeded", receipts)

	events := func(prefix string, n int) [][]byte {
		var bodies [][]byte
		for i := range n {
			bodies = append(bodies, effectstest.StripeEvent(t, fmt.Sprintf("evt_%s_%d", prefix, i), "payment_intent.succeeded",
				time.Unix(1_760_000_000, 0), effectstest.PaymentIntent(fmt.Sprintf("pi_%s_%d", prefix, i), "succeeded", 1000)))
		}
		return bodies
	}
	effectstest.AssertRollout(t, effectstest.RolloutOptions{
		Old: v1, New: v2, Before: events("before", 20), During: events("during", 60),
		Setup: func(ctx context.Context, db *pgxpool.Pool) error {
			_, err := db.Exec(ctx, `CREATE TABLE rollout_orders (event_id text PRIMARY KEY); CREATE TABLE rollout_receipts (event_id text PRIMARY KEY)`)
			return err
		},
		Check: func(t *testing.T, db *pgxpool.Pool, before, during []string) {
			count := func(q string, ids []string) int {
				var n int
				require.NoError(t, db.QueryRow(context.Background(), q, ids).Scan(&n))
				return n
			}
			require.Equal(t, len(before)+len(during), count(`SELECT count(*) FROM rollout_orders WHERE event_id = ANY($1)`, append(before, during...)))
			require.Equal(t, len(during), count(`SELECT count(*) FROM rollout_receipts WHERE event_id = ANY($1)`, during))
			require.Zero(t, count(`SELECT count(*) FROM rollout_receipts WHERE event_id = ANY($1)`, before))
		},
	})
}
