package redissentinel_test

import (
	"context"
	"errors"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idempotent-events/idempotent-events/pkg/internal/redissentinel"
)

// Every goroutine a test starts must be stopped by the time it ends.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// The master killed, the replica is promoted by the sentinels and a client
// of URL follows it with what the replica had; the old master, restarted,
// is made the new master's replica and catches up; Close leaves nothing
// running.
func TestFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("a failover and the old master's rejoin take about 20 s; make test runs it")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s, err := redissentinel.Start(ctx)
	if errors.Is(err, redissentinel.ErrNotInstalled) {
		skipOrFail(t, err.Error())
	}
	require.NoError(t, err)
	t.Cleanup(s.Close)

	opts, err := redis.ParseFailoverURL(s.URL())
	require.NoError(t, err)
	require.Len(t, opts.SentinelAddrs, 3)
	rdb := redis.NewFailoverClient(opts)
	defer rdb.Close()
	require.NoError(t, rdb.Set(ctx, "before", "1", 0).Err())
	old, err := s.Master(ctx)
	require.NoError(t, err)
	require.Equal(t, s.Addr(0), old)
	require.Equal(t, "1", get(ctx, t, s.Addr(0), "before"), "the client wrote to server 1, the master")
	require.NoError(t, s.AwaitReplica(ctx, 1))
	require.Equal(t, "1", get(ctx, t, s.Addr(1), "before"), "server 2 replicates server 1")

	// While the master lives there is no failover to wait for.
	wctx, wcancel := context.WithTimeout(ctx, 3*time.Second)
	_, err = s.AwaitFailover(wctx, old)
	wcancel()
	require.Error(t, err)

	killed, err := s.KillMaster(ctx)
	require.NoError(t, err)
	require.Equal(t, 0, killed)
	require.False(t, s.Running(0))
	promoted, err := s.AwaitFailover(ctx, old)
	require.NoError(t, err, "%s", s.Logs(15))
	require.Equal(t, s.Addr(1), promoted)
	r, err := s.Role(ctx, 1)
	require.NoError(t, err)
	require.Equal(t, "master", r.Role)
	// The client finds the new master by itself, with what the replica had.
	require.Eventually(t, func() bool {
		v, err := rdb.Get(ctx, "before").Result()
		return err == nil && v == "1"
	}, time.Minute, 50*time.Millisecond)
	require.NoError(t, rdb.Set(ctx, "after", "2", 0).Err())

	require.NoError(t, s.Restart(ctx, 0))
	require.NoError(t, s.AwaitReplica(ctx, 0), "%s", s.Logs(15))
	r, err = s.Role(ctx, 0)
	require.NoError(t, err)
	require.Equal(t, "slave", r.Role)
	require.Equal(t, s.Addr(1), r.Master)
	require.Equal(t, "2", get(ctx, t, s.Addr(0), "after"), "the old master copied the new one's data")

	pids, dir := s.Pids(), s.Dir()
	require.Len(t, pids, 5, "two servers and three sentinels run")
	s.Close()
	for _, pid := range pids {
		// Each process group: the server and anything it forked.
		require.Eventually(t, func() bool { return errors.Is(syscall.Kill(-pid, 0), syscall.ESRCH) }, 10*time.Second, 50*time.Millisecond,
			"process group %d is left running", pid)
	}
	_, err = os.Stat(dir)
	require.ErrorIs(t, err, os.ErrNotExist)
}

// get reads key on the server at addr itself (a replica answers reads).
func get(ctx context.Context, t *testing.T, addr, key string) string {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	v, err := c.Get(ctx, key).Result()
	if errors.Is(err, redis.Nil) {
		return ""
	}
	require.NoError(t, err)
	return v
}

// skipOrFail fails in CI, where redis-server is installed, and skips
// elsewhere.
func skipOrFail(t *testing.T, msg string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip("SKIPPED: " + msg)
}
