package dedupe_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/dedupe"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
)

// privateRedis starts a redis-server of the test's own on a free loopback
// port, with a config file (or none: "") and extra arguments, and returns
// its port.
func privateRedis(t *testing.T, conf string, args ...string) string {
	t.Helper()
	_, port, err := net.SplitHostPort(servicetest.FreeAddr())
	require.NoError(t, err)
	dir := t.TempDir()
	var first []string
	if conf != "" {
		first = []string{conf}
	}
	cmd := exec.Command("redis-server", append(append(first, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--logfile", filepath.Join(dir, "redis.log")), args...)...)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	awaitRedis(t, port)
	return port
}

func awaitRedis(t *testing.T, port string) {
	t.Helper()
	require.Eventually(t, func() bool {
		out, err := exec.Command("redis-cli", "-p", port, "ping").Output()
		return err == nil && strings.TrimSpace(string(out)) == "PONG"
	}, 10*time.Second, 20*time.Millisecond, "redis on port %s", port)
}

// roundTrip vouches, marks ids committed and reads them back.
func roundTrip(t *testing.T, c *dedupe.Cache, n int) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, c.Vouch(ctx, "e1", time.Minute))
	var entries []dedupe.Entry
	var ids []string
	for i := range n {
		id := fmt.Sprintf("evt_topology_%d", i)
		ids = append(ids, id)
		entries = append(entries, dedupe.Entry{ID: id, Digest: "d" + id})
	}
	require.NoError(t, c.MarkCommitted(ctx, entries))
	hits, err := c.Committed(ctx, append(ids, "evt_never"))
	require.NoError(t, err)
	for i, id := range ids {
		assert.Equal(t, "d"+id, hits[i])
	}
	assert.Empty(t, hits[n], "an id never marked is a miss")
}

// REDIS_URL in go-redis's failover form reaches the master the sentinels
// name.
func TestASentinelManagedMaster(t *testing.T) {
	t.Parallel()
	master := privateRedis(t, "")
	conf := filepath.Join(t.TempDir(), "sentinel.conf")
	require.NoError(t, os.WriteFile(conf, []byte(fmt.Sprintf("sentinel monitor ie 127.0.0.1 %s 1\nsentinel down-after-milliseconds ie 1000\n", master)), 0o600))
	sentinel := privateRedis(t, conf, "--sentinel")
	c, err := dedupe.Open(fmt.Sprintf("redis://127.0.0.1:%s?master_name=ie", sentinel), servicetest.RedisPrefix(t), time.Minute)
	require.NoError(t, err)
	defer c.Close()
	roundTrip(t, c, 20)
	keys, err := exec.Command("redis-cli", "-p", master, "dbsize").Output()
	require.NoError(t, err)
	assert.Equal(t, "21", strings.TrimSpace(string(keys)), "the entries and the epoch key are on the master")
}

// REDIS_URL in go-redis's cluster form reads entries that live on several
// nodes (one MGET would fail with CROSSSLOT).
func TestARedisCluster(t *testing.T) {
	t.Parallel()
	var nodes []string
	for range 3 {
		dir := t.TempDir()
		nodes = append(nodes, privateRedis(t, "", "--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(dir, "nodes.conf")))
	}
	args := []string{"--cluster", "create"}
	for _, p := range nodes {
		args = append(args, "127.0.0.1:"+p)
	}
	out, err := exec.Command("redis-cli", append(args, "--cluster-yes")...).CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Eventually(t, func() bool {
		for _, p := range nodes {
			info, err := exec.Command("redis-cli", "-p", p, "cluster", "info").Output()
			if err != nil || !strings.Contains(string(info), "cluster_state:ok") {
				return false
			}
		}
		return true
	}, 20*time.Second, 50*time.Millisecond, "the cluster is up")

	c, err := dedupe.Open(fmt.Sprintf("redis://127.0.0.1:%s?addr=127.0.0.1:%s", nodes[0], nodes[1]), servicetest.RedisPrefix(t), time.Minute)
	require.NoError(t, err)
	defer c.Close()
	roundTrip(t, c, 50)
	spread := 0
	for _, p := range nodes {
		keys, err := exec.Command("redis-cli", "-p", p, "dbsize").Output()
		require.NoError(t, err)
		if strings.TrimSpace(string(keys)) != "0" {
			spread++
		}
	}
	assert.Equal(t, 3, spread, "the entries live on every node")
}
