package dedupe_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/dedupe"
	"github.com/idempotent-events/idempotent-events/pkg/internal/tlsconfig"
	"github.com/idempotent-events/idempotent-events/pkg/internal/tlsconfig/tlstest"
)

// TLS to a private redis-server that listens with TLS only and requires a
// client certificate of the test's CA: the matrix, then a rotation of the
// files of one Cache, whose next connection (its connections killed by
// the server) uses them.
func TestTLS(t *testing.T) {
	t.Parallel()
	ca := tlstest.NewCA(t, "redis test CA")
	srv := tlstest.StartRedis(t, ca)
	open := func(t *testing.T, f tlsconfig.Files) func() error {
		tc, err := tlsconfig.New(tlsconfig.Redis, f)
		require.NoError(t, err)
		c, err := dedupe.OpenTLS(srv.URL("127.0.0.1"), "tls:", time.Minute, tc)
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		return func() error {
			srv.KillClients() // the next command dials anew
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			return c.Client().Ping(ctx).Err()
		}
	}
	t.Run("matrix", func(t *testing.T) { tlstest.RunMatrix(t, srv, ca, tlsconfig.Redis, open) })
	t.Run("rotation", func(t *testing.T) { tlstest.RunRotation(t, ca, tlsconfig.Redis, open) })
}
