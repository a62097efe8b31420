// Command receiver takes payment-provider webhooks and publishes them to
// RabbitMQ, answering 2xx only after the broker confirmed. Configuration is
// environment variables only; see README.
package main

import (
	"context"
	"os"

	"go.uber.org/zap"

	"github.com/idempotent-events/idempotent-events/pkg/cli"
	"github.com/idempotent-events/idempotent-events/pkg/config"
	"github.com/idempotent-events/idempotent-events/pkg/receiver"
	"github.com/idempotent-events/idempotent-events/pkg/telemetry"
)

func main() {
	var cfg config.Receiver
	os.Exit(cli.Main("receiver", &cfg, func() config.Logging { return cfg.Logging }, func(ctx context.Context, log *zap.Logger) error {
		return receiver.Run(ctx, cfg, log, telemetry.NewRegistry("receiver"))
	}))
}
