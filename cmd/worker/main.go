// Command worker consumes events.main and commits each event's effect
// exactly once. Configuration is environment variables only; see
// docs/configuration.md.
package main

import (
	"os"

	"github.com/idempotent-events/idempotent-events/pkg/payments"
	"github.com/idempotent-events/idempotent-events/pkg/service"
)

func main() { os.Exit(service.Worker(payments.Effects())) }
