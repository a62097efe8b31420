package app

import (
	"context"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/idempotent-events/idempotent-events/pkg/internal/config"
	"github.com/idempotent-events/idempotent-events/pkg/internal/store"
	"github.com/idempotent-events/idempotent-events/pkg/internal/worker"
)

// durabilityInterval is how often the worker reads the ledger database's
// replication settings again (Patroni and CloudNativePG change them at
// runtime).
const durabilityInterval = 30 * time.Second

// durability keeps the worker honest about the ledger's replication. A
// COMMIT acknowledged by a primary whose standbys are asynchronous can be
// lost by a failover after the worker acked the event: the event is then
// gone, and so is its effect. So the worker refuses to start on such a
// primary unless DURABILITY_ALLOW_ASYNC=true, and with a synchronous
// standby it makes duplicates wait for it too (store.SetSynchronous).
type durability struct {
	st         *store.Store
	allowAsync bool
	log        *zap.Logger
	m          *worker.Metrics
	last       string
}

func newDurability(cfg config.Worker, st *store.Store, log *zap.Logger, m *worker.Metrics) *durability {
	return &durability{st: st, allowAsync: cfg.DurabilityAllowAsync, log: log, m: m}
}

// refusal is the configuration error of a worker on a primary with only
// asynchronous standbys.
func refusal(got store.Durability) error {
	return &config.Error{Problems: []config.Problem{{Var: "DURABILITY_ALLOW_ASYNC",
		Msg: "the ledger database has " + strconv.Itoa(got.Standbys) + " standby(s) and none is synchronous (synchronous_standby_names='" +
			got.SynchronousStandbyNames + "', synchronous_commit=" + got.SynchronousCommit + "): a failover can lose events " +
			"the worker acked. Configure a synchronous standby (docs/operations.md#replicated-postgres), " +
			"or set DURABILITY_ALLOW_ASYNC=true to accept that"}}}
}

// check reads the settings once and applies them. It returns the refusal
// when the database is an asynchronous primary and that is not allowed.
func (d *durability) check(ctx context.Context) (bool, error) {
	got, err := d.st.ReadDurability(ctx)
	if err != nil {
		d.log.Debug("replication settings not read", zap.Error(err))
		return false, nil
	}
	mode := got.Mode()
	d.st.SetSynchronous(mode == store.DurabilitySync)
	d.m.SetDurability(mode, d.allowAsync)
	if mode != d.last {
		d.log.Info("ledger durability", zap.String("mode", mode), zap.Int("standbys", got.Standbys),
			zap.String("synchronous_standby_names", got.SynchronousStandbyNames), zap.String("synchronous_commit", got.SynchronousCommit))
		if mode == store.DurabilityAsync && d.last != "" {
			d.log.Error("the ledger's standbys are no longer synchronous: a failover now can lose acked events")
		}
	}
	first := d.last == ""
	d.last = mode
	if first && mode == store.DurabilityAsync && !d.allowAsync {
		return true, refusal(got)
	}
	return true, nil
}

// start makes the first check before the worker consumes, when the
// database answers within a few seconds (when it does not, the worker
// starts as it always does while Postgres is down, and the first check that
// succeeds decides). It returns the refusal, if any.
func (d *durability) start(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := d.check(cctx)
	return err
}

// run checks again every durabilityInterval (every 2 s until one
// succeeded) until ctx ends; stop is called with the refusal if the first
// successful check is one.
func (d *durability) run(ctx context.Context, stop func(error)) {
	for {
		wait := durabilityInterval
		if d.last == "" {
			wait = 2 * time.Second
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := d.check(cctx)
		cancel()
		if err != nil {
			stop(err)
			return
		}
	}
}
