// Command migrate creates the database if needed and applies the embedded
// schema migrations. It is safe to run from several pods at once and to run
// again: a second run finds nothing pending.
//
//	migrate         apply pending migrations (same as "migrate up")
//	migrate wait    block until the schema is current (for init containers)
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"go.uber.org/zap"

	"github.com/idempotent-events/idempotent-events/pkg/cli"
	"github.com/idempotent-events/idempotent-events/pkg/config"
	"github.com/idempotent-events/idempotent-events/pkg/migrate"
)

func main() {
	cmd := "up"
	if len(os.Args) > 1 {
		cmd = os.Args[1]
	}
	var cfg config.Migrate
	os.Exit(cli.Main("migrate", &cfg, func() config.Logging { return cfg.Logging }, func(ctx context.Context, log *zap.Logger) error {
		switch cmd {
		case "up":
			res, err := migrate.Up(ctx, cfg.DatabaseURL, cfg.LockTimeout)
			if err != nil {
				return err
			}
			log.Info("schema up to date", zap.Bool("created_database", res.CreatedDatabase),
				zap.Int64s("applied", res.Applied), zap.Int64("schema_version", res.Version))
			return nil
		case "wait":
			ctx, cancel := context.WithTimeout(ctx, cfg.WaitTimeout)
			defer cancel()
			err := migrate.Wait(ctx, cfg.DatabaseURL, 2*time.Second, func(err error) {
				log.Info("waiting for the schema", zap.Error(err))
			})
			if err == nil {
				log.Info("schema is current")
			}
			return err
		}
		return fmt.Errorf("unknown command %q: want up or wait", cmd)
	}))
}
