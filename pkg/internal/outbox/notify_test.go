package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/idempotent-events/idempotent-events/pkg/effects"
	"github.com/idempotent-events/idempotent-events/pkg/internal/outbox"
)

// An enqueue does not NOTIFY inside its transaction (that serialises the
// commits): after COMMIT the worker tells a Notifier, which wakes the relay
// of its process, or, when the process runs none, NOTIFYs the others. The
// relays here poll once an hour, so only the Notifier can get the second
// message out in time.
func TestANotifierWakesTheRelaysAfterCommit(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		local bool
	}{{"the relay of its process", true}, {"relays elsewhere, by NOTIFY", false}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.consume("notify")
			// The first message is there before the relay starts: its first
			// round publishes it, then it waits for the next poll (an hour).
			e.enqueue("evt_nf_first", "e", "")
			opts := e.relayOptions(e.amqpURL, 10)
			opts.PollInterval = time.Hour
			if c.local {
				opts.DatabaseURL = "" // no LISTEN: only a Wake gets it going
			}
			r := e.relayWith(opts)
			published := func(key string) bool {
				return e.count(`SELECT count(*) FROM outbox WHERE idempotency_key = $1 AND published_at IS NOT NULL`, key) == 1
			}
			require.Eventually(t, func() bool { return published("evt_nf_first/e") }, 30*time.Second, 20*time.Millisecond)

			var local *outbox.Relay
			if c.local {
				local = r
			}
			n := outbox.NewNotifier(e.pool, local, zaptest.NewLogger(t))
			if !c.local {
				e.run(func(ctx context.Context) error { n.Run(ctx); return nil })
			}
			ctx := context.Background()
			var b interface{ Committed() }
			require.NoError(t, pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
				out := n.Outbox(tx)
				b = out.(interface{ Committed() })
				if err := out.Enqueue(ctx, effects.Event{Key: "evt_nf_second"}, effects.Message{Effect: "e", RoutingKey: "test.message"}); err != nil {
					return err
				}
				return out.(interface{ Flush(context.Context) error }).Flush(ctx)
			}))
			// A NOTIFY before the relay's LISTEN is in place is lost:
			// commits go on telling it until one is heard.
			require.Eventuallyf(t, func() bool {
				b.Committed()
				return published("evt_nf_second/e")
			}, 30*time.Second, 50*time.Millisecond, "woken: %s", c.name)
			require.Eventually(t, func() bool { return e.count(`SELECT count(DISTINCT id) FROM received`) == 2 }, 30*time.Second, 50*time.Millisecond)
		})
	}
}

// The enqueue itself sends no notification: a listener that hears a probe
// NOTIFYed after the enqueue committed heard nothing before it
// (notifications arrive in commit order).
func TestAnEnqueueDoesNotNotify(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	l, err := pgx.Connect(ctx, e.dbURL)
	require.NoError(t, err)
	defer func() { _ = l.Close(ctx) }()
	_, err = l.Exec(ctx, "LISTEN "+outbox.Channel)
	require.NoError(t, err)
	e.enqueue("evt_quiet", "e", "")
	_, err = e.pool.Exec(ctx, `SELECT pg_notify($1, 'probe')`, outbox.Channel)
	require.NoError(t, err)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	got, err := l.WaitForNotification(wctx)
	require.NoError(t, err)
	require.Equal(t, "probe", got.Payload, "the enqueue notified in its transaction")
}
