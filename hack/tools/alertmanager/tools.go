//go:build tools

// Package tools pins Alertmanager's version in this module's go.mod.
package tools

import _ "github.com/prometheus/alertmanager/cmd/alertmanager"
