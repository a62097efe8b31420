// Package service holds the entry points of the binaries in the
// idempotent-events image: receiver, worker, migrate and eventsctl. Each
// runs with the process's arguments and environment and returns the exit
// status: 0 done, 1 failed, 2 invalid configuration or arguments.
//
// It is the public door to the product, whose parts live under pkg/internal
// (the Go toolchain keeps them private to this module): cmd/ calls it, and
// so can a team's own binary that embeds the same pipeline.
package service

import (
	"context"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"syscall"

	"github.com/idempotent-events/idempotent-events/pkg/effects"
	"github.com/idempotent-events/idempotent-events/pkg/internal/app"
	"github.com/idempotent-events/idempotent-events/pkg/internal/eventsctl"
)

// Receiver runs the receiver: it takes webhooks and publishes them to
// RabbitMQ, answering 2xx only after the broker confirmed.
func Receiver() int { return app.Receiver(os.Args[1:], os.Stdout, os.Stderr) }

// Worker runs the worker with the effects fx: it consumes events.main and
// commits each event's effects exactly once, in the transaction of its
// ledger row. The stock worker runs payments.Effects(); a team's own worker
// binary adds its handlers to that registry (or starts from an empty one).
//
// It reads the stock worker's environment (docs/configuration.md). Its
// --help names the binary as it was invoked, its handler set and the
// variables it reads; --version the build (the stamped version, the main
// module's and idempotent-events' versions, Go, the VCS revision).
func Worker(fx *effects.Registry) int {
	return workerMain(fx, filepath.Base(os.Args[0]), os.Args[1:], os.Stdout, os.Stderr, debug.ReadBuildInfo)
}

// Migrate applies the database migrations ("migrate" or "migrate up"), or
// waits until another process has ("migrate wait").
func Migrate() int { return app.Migrate(os.Args[1:], os.Stdout, os.Stderr) }

// Eventsctl runs the operator's command line; SIGINT and SIGTERM cancel the
// command in progress.
func Eventsctl() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return eventsctl.Main(ctx, os.Args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr)
}
