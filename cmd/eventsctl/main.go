// Command eventsctl is the operator's tool for idempotent-events: sign and
// send test events (and, as the project grows, inspect the DLQ).
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/idempotent-events/idempotent-events/pkg/ctl"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := ctl.Main(ctx, os.Args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
