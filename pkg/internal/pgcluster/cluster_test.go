package pgcluster_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/migrate"
	"github.com/idempotent-events/idempotent-events/pkg/internal/pgcluster"
)

func ctxFor(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctxFor(t, 10*time.Second), url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// rows counts the rows of t on n, a standby or the primary.
func rows(t *testing.T, n *pgcluster.Node) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, n.URL("postgres"))
	if err != nil {
		return -1
	}
	defer func() { _ = conn.Close(ctx) }()
	var count int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&count); err != nil {
		return -1 // the table has not reached n yet
	}
	return count
}

func TestSynchronousCommitWaitsForAStandby(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 5*time.Minute)
	c := pgcluster.New(t, pgcluster.Options{})
	primary, standby := c.Primary(), c.Standbys()[0]
	db := connect(t, primary.URL("postgres"))
	_, err := db.Exec(ctx, "CREATE TABLE t (id int PRIMARY KEY)")
	require.NoError(t, err)
	_, err = db.Exec(ctx, "INSERT INTO t VALUES (1)")
	require.NoError(t, err)
	// Flushed on the standby before the commit returned; replayed soon after.
	require.Eventually(t, func() bool { return rows(t, standby) == 1 }, 30*time.Second, 50*time.Millisecond)

	// Without a standby a commit waits, holding its transaction open.
	standby.Kill()
	committed := make(chan error, 1)
	go func() {
		_, err := db.Exec(context.Background(), "INSERT INTO t VALUES (2)")
		committed <- err
	}()
	watch := connect(t, primary.URL("postgres"))
	require.Eventually(t, func() bool {
		var waiting int
		err := watch.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'").Scan(&waiting)
		return err == nil && waiting == 1
	}, 30*time.Second, 50*time.Millisecond, "the commit does not wait for a standby")
	select {
	case err := <-committed:
		t.Fatalf("the commit returned without a standby: %v", err)
	default:
	}
	// A standby rebuilt from the primary releases it.
	require.NoError(t, c.Rejoin(ctx, standby))
	select {
	case err := <-committed:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("the commit still waits with a standby streaming")
	}
	require.Eventually(t, func() bool { return rows(t, standby) == 2 }, 30*time.Second, 50*time.Millisecond)
}

func TestAsynchronousCommitDoesNotWait(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 5*time.Minute)
	c := pgcluster.New(t, pgcluster.Options{Async: true})
	primary, standby := c.Primary(), c.Standbys()[0]
	db := connect(t, primary.URL("postgres"))
	var state string
	require.NoError(t, db.QueryRow(ctx, "SELECT sync_state FROM pg_stat_replication").Scan(&state))
	require.Equal(t, "async", state)
	_, err := db.Exec(ctx, "CREATE TABLE t (id int PRIMARY KEY)")
	require.NoError(t, err)
	require.Eventually(t, func() bool { return rows(t, standby) == 0 }, 30*time.Second, 50*time.Millisecond)

	standby.Kill()
	insert, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = db.Exec(insert, "INSERT INTO t VALUES (1)")
	require.NoError(t, err, "an asynchronous commit waited for the dead standby")
}

// TestFailoverThroughTheMultiHostURL fails the primary over twice; one
// pool on the multi-host URL with target_session_attrs=read-write follows
// it, and the migrations apply on the promoted node and replicate.
func TestFailoverThroughTheMultiHostURL(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 10*time.Minute)
	c := pgcluster.New(t, pgcluster.Options{})
	pool, err := pgxpool.New(ctx, c.URL("postgres"))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = pool.Exec(ctx, "CREATE TABLE t (id int PRIMARY KEY)")
	require.NoError(t, err)

	// primaryPort is the port of the node the pool writes to, once it
	// writes again.
	primaryPort := func() int {
		var port int
		require.Eventually(t, func() bool {
			err := pool.QueryRow(ctx, "SELECT inet_server_port() FROM (SELECT 1) x WHERE NOT pg_is_in_recovery()").Scan(&port)
			return err == nil
		}, 30*time.Second, 50*time.Millisecond, "the pool does not reach a primary")
		return port
	}
	require.Equal(t, c.Primary().Port, primaryPort())

	for i := 1; i <= 2; i++ {
		_, err := pool.Exec(ctx, "INSERT INTO t VALUES ($1)", i)
		require.NoError(t, err)
		old, next := c.Primary(), c.Standbys()[0]
		old.Kill()
		require.NoError(t, c.Promote(ctx, next))
		require.NoError(t, c.Rejoin(ctx, old))
		require.Equal(t, next, c.Primary())
		require.Equal(t, next.Port, primaryPort(), "failover %d", i)
		var count int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&count))
		require.Equal(t, i, count, "a committed row did not survive failover %d", i)
		require.Eventually(t, func() bool { return rows(t, old) == i }, 30*time.Second, 50*time.Millisecond,
			"the old primary does not replicate from the new one")
	}

	dbURL := c.URL("idempotent_events")
	res, err := migrate.Up(ctx, dbURL, time.Minute)
	require.NoError(t, err)
	require.True(t, res.CreatedDatabase)
	require.NotEmpty(t, res.Applied)
	standby := connect(t, c.Standbys()[0].URL("postgres"))
	require.Eventually(t, func() bool {
		conn, err := pgx.Connect(ctx, c.Standbys()[0].URL("idempotent_events"))
		if err != nil {
			return false
		}
		defer func() { _ = conn.Close(ctx) }()
		var table *string
		return conn.QueryRow(ctx, "SELECT to_regclass('processed_events')::text").Scan(&table) == nil && table != nil
	}, 30*time.Second, 50*time.Millisecond, "the migrations did not replicate")
	var inRecovery bool
	require.NoError(t, standby.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&inRecovery))
	require.True(t, inRecovery)
}

// TestPromoteRepointsTheOtherStandbys: with two standbys, the one not
// promoted streams from the new primary.
func TestPromoteRepointsTheOtherStandbys(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 5*time.Minute)
	c := pgcluster.New(t, pgcluster.Options{Standbys: 2})
	nodes := c.Nodes()
	_, err := connect(t, nodes[0].URL("postgres")).Exec(ctx, "CREATE TABLE t (id int PRIMARY KEY)")
	require.NoError(t, err)
	require.Eventually(t, func() bool { return rows(t, nodes[2]) == 0 }, 30*time.Second, 50*time.Millisecond)

	nodes[0].Kill()
	require.NoError(t, c.Promote(ctx, nodes[1]))
	require.Equal(t, []*pgcluster.Node{nodes[2]}, c.Standbys())
	_, err = connect(t, nodes[1].URL("postgres")).Exec(ctx, "INSERT INTO t VALUES (1)")
	require.NoError(t, err)
	require.Eventually(t, func() bool { return rows(t, nodes[2]) == 1 }, 30*time.Second, 50*time.Millisecond)
}
