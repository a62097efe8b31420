// Package migrations embeds the versioned SQL migrations of idempotent-events.
// Files are named NNNNN_description.sql and use goose annotations; the migrate
// binary applies them (see pkg/migrate).
package migrations

import "embed"

// FS holds every migration file.
//
//go:embed *.sql
var FS embed.FS
