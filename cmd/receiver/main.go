// Command receiver takes payment-provider webhooks and publishes them to
// RabbitMQ, answering 2xx only after the broker confirmed. Configuration is
// environment variables only; see docs/configuration.md.
package main

import (
	"os"

	"github.com/idempotent-events/idempotent-events/pkg/service"
)

func main() { os.Exit(service.Receiver()) }
