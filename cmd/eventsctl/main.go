// Command eventsctl is the operator's tool for idempotent-events: sign and
// send test events, check that they took effect once, read queue status,
// and list, show, replay or discard messages in the DLQ.
package main

import (
	"os"

	"github.com/idempotent-events/idempotent-events/pkg/service"
)

func main() { os.Exit(service.Eventsctl()) }
