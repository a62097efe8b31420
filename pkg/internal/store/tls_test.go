package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/store"
	"github.com/idempotent-events/idempotent-events/pkg/internal/tlsconfig"
	"github.com/idempotent-events/idempotent-events/pkg/internal/tlsconfig/tlstest"
)

// TLS to a private PostgreSQL that takes TLS connections only, each with a
// client certificate of the test's CA: the matrix, then a rotation of the
// files of one pool, whose next connection (after Reset) uses them.
func TestTLS(t *testing.T) {
	t.Parallel()
	ca := tlstest.NewCA(t, "postgres test CA")
	pg := tlstest.StartPostgres(t, ca)
	open := func(t *testing.T, f tlsconfig.Files) func() error {
		tc, err := tlsconfig.New(tlsconfig.Postgres, f)
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		t.Cleanup(cancel)
		st, err := store.OpenTLS(ctx, pg.URL("127.0.0.1", "postgres"), 2, tc)
		require.NoError(t, err)
		t.Cleanup(st.Close)
		return func() error {
			st.Pool().Reset() // the next query dials anew
			return tlsconfig.Postgres.Explain(st.Pool().Ping(ctx))
		}
	}
	t.Run("matrix", func(t *testing.T) { tlstest.RunMatrix(t, pg, ca, tlsconfig.Postgres, open) })
	t.Run("rotation", func(t *testing.T) { tlstest.RunRotation(t, ca, tlsconfig.Postgres, open) })
}
