//go:build tools

// Package tools pins golangci-lint's version in this module's go.mod.
package tools

import _ "github.com/golangci/golangci-lint/v2/cmd/golangci-lint"
