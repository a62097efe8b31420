// Package cli holds what every idempotent-events binary does the same way
// around its Run: load the configuration (exit 2 when it is invalid), build
// the logger, turn SIGINT/SIGTERM into context cancellation, and exit once.
package cli

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"go.uber.org/zap"

	"github.com/idempotent-events/idempotent-events/pkg/config"
	"github.com/idempotent-events/idempotent-events/pkg/logging"
	"github.com/idempotent-events/idempotent-events/pkg/telemetry"
)

// Main loads cfg from the environment, then calls run with a context that is
// cancelled on SIGINT or SIGTERM. It returns the process exit status: 0 on a
// clean stop, 1 when run failed, 2 for invalid configuration.
//
// With the single argument --check-config it only loads and validates the
// configuration, exactly as a start would, and exits 0 or 2 without touching
// any service: how the chart's rendered environment is checked against the
// binary that will run with it.
func Main(name string, cfg config.Validator, logCfg func() config.Logging, run func(ctx context.Context, log *zap.Logger) error) int {
	if len(os.Args) > 1 && (os.Args[1] == "--version" || os.Args[1] == "version") {
		fmt.Println(name, telemetry.Version)
		return 0
	}
	checkOnly := len(os.Args) > 1 && os.Args[1] == "--check-config"
	if err := config.Load(cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return config.ExitCode
	}
	lc := logCfg()
	log, err := logging.New(lc.LogLevel, lc.LogFormat)
	if err != nil {
		fmt.Fprintln(os.Stderr, "invalid configuration: LOG_LEVEL/LOG_FORMAT:", err)
		return config.ExitCode
	}
	if checkOnly {
		fmt.Println(name + ": configuration ok")
		return 0
	}
	defer func() { _ = log.Sync() }()
	log = log.Named(name).With(zap.String("version", telemetry.Version))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, log); err != nil {
		log.Error("stopped with error", zap.Error(err))
		return 1
	}
	log.Info("stopped")
	return 0
}
