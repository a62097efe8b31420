package eventsctl

import (
	"context"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/dlq"
	"github.com/idempotent-events/idempotent-events/pkg/internal/tlsconfig"
)

// eventsctl reads the binaries' TLS settings from the same variables
// (<PREFIX>_CA_FILE, _CERT_FILE, _KEY_FILE, _REQUIRED), so that a command run
// in a pod, or with the pod's environment, reaches the services as the
// binaries do.

// tlsOf reads service s's TLS settings from env and their files; nil when
// none is set. Its error names the variable.
func tlsOf(env Env, s tlsconfig.Service) (*tlsconfig.Client, error) {
	f := tlsconfig.Files{CAFile: env(s.Prefix + "_CA_FILE"), CertFile: env(s.Prefix + "_CERT_FILE"), KeyFile: env(s.Prefix + "_KEY_FILE")}
	if v := env(s.Prefix + "_REQUIRED"); v != "" {
		req, err := strconv.ParseBool(v)
		if err != nil {
			return nil, fmt.Errorf("%s_REQUIRED: %q is not a valid boolean (true or false)", s.Prefix, v)
		}
		f.Required = req
	}
	return tlsconfig.New(s, f)
}

// openPool opens a pool on dbURL with the DATABASE_TLS_* settings of env.
func openPool(ctx context.Context, env Env, dbURL string) (*pgxpool.Pool, error) {
	tc, err := tlsOf(env, tlsconfig.Postgres)
	if err != nil {
		return nil, err
	}
	pool, err := tc.NewPool(ctx, dbURL)
	return pool, tlsconfig.Postgres.Explain(err)
}

// connectDB connects one connection to dbURL with the DATABASE_TLS_*
// settings of env.
func connectDB(ctx context.Context, env Env, dbURL string) (*pgx.Conn, error) {
	tc, err := tlsOf(env, tlsconfig.Postgres)
	if err != nil {
		return nil, err
	}
	return tc.ConnectPgx(ctx, dbURL)
}

// dialer is the broker.Dialer of amqpURL with the AMQP_TLS_* settings of
// env.
func dialer(env Env, amqpURL, name string) (broker.Dialer, error) {
	tc, err := tlsOf(env, tlsconfig.RabbitMQ)
	return broker.Dialer{URL: amqpURL, Name: name, TLS: tc}, err
}

// openAudit is dlq.OpenAudit with the DATABASE_TLS_* settings of env.
func openAudit(ctx context.Context, env Env, dbURL string) (*dlq.Audit, error) {
	pool, err := openPool(ctx, env, dbURL)
	if err != nil {
		return nil, fmt.Errorf("connect to postgres: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to postgres: %w", tlsconfig.Postgres.Explain(err))
	}
	return dlq.NewAudit(pool), nil
}
