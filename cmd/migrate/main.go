// Command migrate creates the database if needed and applies the embedded
// schema migrations. It is safe to run from several pods at once and to run
// again: a second run finds nothing pending.
package main

import (
	"context"
	"os"

	"go.uber.org/zap"

	"github.com/idempotent-events/idempotent-events/pkg/cli"
	"github.com/idempotent-events/idempotent-events/pkg/config"
	"github.com/idempotent-events/idempotent-events/pkg/migrate"
)

func main() {
	var cfg config.Migrate
	os.Exit(cli.Main("migrate", &cfg, func() config.Logging { return cfg.Logging }, func(ctx context.Context, log *zap.Logger) error {
		res, err := migrate.Up(ctx, cfg.DatabaseURL, cfg.LockTimeout)
		if err != nil {
			return err
		}
		log.Info("schema up to date", zap.Bool("created_database", res.CreatedDatabase),
			zap.Int64s("applied", res.Applied), zap.Int64("version", res.Version))
		return nil
	}))
}
