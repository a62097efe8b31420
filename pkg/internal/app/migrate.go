package app

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/idempotent-events/idempotent-events/pkg/internal/config"
	"github.com/idempotent-events/idempotent-events/pkg/internal/migrate"
	"github.com/idempotent-events/idempotent-events/pkg/internal/store"
	"github.com/idempotent-events/idempotent-events/pkg/internal/tlsconfig"
)

const migrateUsage = `migrate: creates the database if needed and applies the embedded schema
migrations. Safe to run from several pods at once and to run again.
Configuration is environment variables only (docs/configuration.md).

usage: migrate [up | wait | --check-config | --version | --help]
  up     apply pending migrations (the default); with WORKER_RELEASE,
         then announce that release of the workers as the newest generation
         (workers of other handler sets stop committing)
  wait   block until the schema is current (for init containers)
`

// Migrate is the migrate binary: it runs with args (without the program
// name) and returns the exit status.
func Migrate(args []string, stdout, stderr io.Writer) int {
	var cfg config.Migrate
	return binary{
		name: "migrate", usage: migrateUsage, commands: []string{"up", "wait"}, cfg: &cfg,
		run: func(ctx context.Context, command string, log *zap.Logger, _ *prometheus.Registry) error {
			tc, err := newTLS(tlsconfig.Postgres, cfg.DatabaseTLSSettings())
			if err != nil {
				return err
			}
			target := migrate.Target{URL: cfg.DatabaseURL, TLS: tc}
			switch command {
			case "up":
				res, err := target.Up(ctx, cfg.LockTimeout)
				if err != nil {
					return err
				}
				log.Info("schema up to date", zap.Bool("created_database", res.CreatedDatabase),
					zap.Int64s("applied", res.Applied), zap.Int64("schema_version", res.Version))
				if cfg.Release != "" {
					return announce(ctx, cfg, tc, log)
				}
				return nil
			case "wait":
				ctx, cancel := context.WithTimeout(ctx, cfg.WaitTimeout)
				defer cancel()
				err := target.Wait(ctx, 2*time.Second, func(err error) {
					log.Info("waiting for the schema", zap.Error(err))
				})
				if err == nil {
					log.Info("schema is current")
				}
				return err
			}
			return fmt.Errorf("unknown command %q", command)
		},
	}.main(args, stdout, stderr)
}

// announce makes cfg.Release the newest generation of the workers
// (store.Announce).
func announce(ctx context.Context, cfg config.Migrate, tc *tlsconfig.Client, log *zap.Logger) error {
	st, err := store.OpenTLS(ctx, cfg.DatabaseURL, 1, tc)
	if err != nil {
		return err
	}
	defer st.Close()
	gen, err := st.Announce(ctx, cfg.Release)
	if err != nil {
		return err
	}
	log.Info("release announced: no worker commits until one of it registers its handler set; those of its set then go on",
		zap.String("release", cfg.Release), zap.Int64("generation", gen))
	return nil
}
