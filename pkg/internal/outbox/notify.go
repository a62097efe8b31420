package outbox

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/idempotent-events/idempotent-events/pkg/effects"
	"github.com/idempotent-events/idempotent-events/pkg/internal/backoff"
)

// notifyGap is the least time between two NOTIFYs of one Notifier: a relay
// in another process learns of a commit this much later at most.
const notifyGap = 20 * time.Millisecond

// Notifier tells the relays that messages committed, after the COMMIT and
// outside the event's transaction. A pg_notify inside it would serialise
// every commit that enqueued: PostgreSQL holds one lock per database from
// a notifying transaction's pre-commit to the end of its commit, so that
// notifications queue in commit order, so each commit waits for the one
// before it, WAL flush included. Instead the relay of this process is woken directly and, when
// this process runs none, one NOTIFY every notifyGap at most reaches the
// relays of the others. Polling stays the truth either way.
type Notifier struct {
	pool    *pgxpool.Pool
	local   *Relay
	pending chan struct{}
	log     *zap.Logger
}

// NewNotifier returns a Notifier waking local, or, when local is nil, the
// relays listening on pool's database (Run sends their NOTIFYs).
func NewNotifier(pool *pgxpool.Pool, local *Relay, log *zap.Logger) *Notifier {
	if log == nil {
		log = zap.NewNop()
	}
	return &Notifier{pool: pool, local: local, pending: make(chan struct{}, 1), log: log}
}

// Outbox returns the outbox of one transaction (a Batch) that tells the
// relays once it committed; it is the worker's Options.Outbox.
func (n *Notifier) Outbox(tx effects.Tx) effects.Outbox {
	b := NewBatch(tx)
	b.notifier = n
	return b
}

// Committed says that a transaction that enqueued committed.
func (n *Notifier) Committed() {
	if n.local != nil {
		n.local.Wake()
		return
	}
	select {
	case n.pending <- struct{}{}:
	default: // one is due already
	}
}

// Run sends the NOTIFYs Committed asks for, until ctx is done; with a
// local relay there are none.
func (n *Notifier) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.pending:
		}
		nctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if _, err := n.pool.Exec(nctx, `SELECT pg_notify('`+Channel+`', '')`); err != nil && ctx.Err() == nil {
			n.log.Debug("outbox NOTIFY failed; the relays poll", zap.Error(err))
		}
		cancel()
		if !backoff.Sleep(ctx, notifyGap) {
			return
		}
	}
}
