// Command worker consumes events.main and commits each event's effect
// exactly once. Configuration is environment variables only; see README.
package main

import (
	"context"
	"os"

	"go.uber.org/zap"

	"github.com/idempotent-events/idempotent-events/pkg/cli"
	"github.com/idempotent-events/idempotent-events/pkg/config"
	"github.com/idempotent-events/idempotent-events/pkg/telemetry"
	"github.com/idempotent-events/idempotent-events/pkg/worker"
)

func main() {
	var cfg config.Worker
	os.Exit(cli.Main("worker", &cfg, func() config.Logging { return cfg.Logging }, func(ctx context.Context, log *zap.Logger) error {
		return worker.Run(ctx, cfg, log, telemetry.NewRegistry("worker"))
	}))
}
