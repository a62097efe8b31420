//go:build tools

// Package tools pins the Prometheus server's version in this module's
// go.mod.
package tools

import _ "github.com/prometheus/prometheus/cmd/prometheus"
