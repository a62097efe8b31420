// Command migrate creates the database if needed and applies the embedded
// schema migrations. It is safe to run from several pods at once and to run
// again: a second run finds nothing pending.
//
//	migrate         apply pending migrations (same as "migrate up")
//	migrate wait    block until the schema is current (for init containers)
package main

import (
	"os"

	"github.com/idempotent-events/idempotent-events/pkg/service"
)

func main() { os.Exit(service.Migrate()) }
