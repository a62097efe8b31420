package service

import (
	"bytes"
	"context"
	"reflect"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/effects"
	"github.com/idempotent-events/idempotent-events/pkg/internal/config"
	"github.com/idempotent-events/idempotent-events/pkg/internal/telemetry"
	"github.com/idempotent-events/idempotent-events/pkg/payments"
)

// teamRegistry is a team's handler set: the built-in payment state, an
// event handler and a transition handler.
func teamRegistry() *effects.Registry {
	reg := payments.Effects()
	reg.HandleFunc("orders.create", "stripe", "payment_intent.succeeded",
		func(context.Context, effects.Event, effects.Tx, effects.Outbox) error { return nil })
	reg.OnTransitionFunc("orders.receipt", payments.PaymentIntent, "succeeded",
		func(context.Context, effects.Transition, effects.Tx, effects.Outbox) error { return nil })
	return reg
}

func noBuildInfo() (*debug.BuildInfo, bool) { return nil, false }

func callWorker(reg *effects.Registry, name string, info func() (*debug.BuildInfo, bool), args ...string) (int, string, string) {
	var stdout, stderr bytes.Buffer
	code := workerMain(reg, name, args, &stdout, &stderr, info)
	return code, stdout.String(), stderr.String()
}

// lineWith is the one line of out that contains every part.
func lineWith(t *testing.T, out string, parts ...string) string {
	t.Helper()
	var found []string
	for _, l := range strings.Split(out, "\n") {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(l, p)
		}
		if all {
			found = append(found, l)
		}
	}
	require.Len(t, found, 1, "one line with %q in:\n%s", parts, out)
	return found[0]
}

// configVariables are the variables config.Worker loads, read from its
// struct tags as envconfig reads them.
func configVariables(t reflect.Type) []string {
	var names []string
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if f.Anonymous {
			names = append(names, configVariables(f.Type)...)
		} else if n := f.Tag.Get("envconfig"); n != "" {
			names = append(names, n)
		}
	}
	return names
}

// A team's worker's --help names the binary as it was invoked (not
// "worker"), says what it is, lists its handler set as Registry.Set has
// it (names, routes, id), and names every variable it reads, pointing at
// their documentation.
func TestWorkerHelpNamesTheBinaryItsHandlersAndItsEnvironment(t *testing.T) {
	t.Parallel()
	reg := teamRegistry()
	set := reg.Set()
	for _, arg := range []string{"-h", "--help", "help"} {
		code, out, stderr := callWorker(reg, "orders", noBuildInfo, arg)
		require.Equal(t, 0, code, stderr)
		assert.Empty(t, stderr)
		assert.True(t, strings.HasPrefix(out, "orders: a worker built on idempotent-events ("+module+")"), out)
		assert.Contains(t, out, "usage: orders [--check-config | --version | --help]")
		assert.NotContains(t, out, "usage: worker")
		assert.Contains(t, out, "Handler set "+set.ID)
		require.Len(t, set.Handlers, 3)
		for _, h := range set.Handlers {
			if h.ObjectType != "" {
				lineWith(t, out, "  "+h.Name+" ", "transition", h.ObjectType+" -> "+h.To)
			} else {
				lineWith(t, out, "  "+h.Name+" ", "event", "source "+h.Source+", type "+h.EventType)
			}
		}
		assert.Contains(t, out, "docs/configuration.md")
		for _, name := range configVariables(reflect.TypeOf(config.Worker{})) {
			assert.Contains(t, out, name, "%s: the worker reads it", arg)
		}
		lineWith(t, out, "DATABASE_URL", "the handlers' own tables live in this database")
		assert.Contains(t, out, "default "+workerVariables()["DATABASE_URL"]+"\n")
		assert.Contains(t, out, "default :9091\n", "METRICS_ADDR's")
	}
}

// The stock worker's help is the same text under its own name, with the
// built-in payment effect as its handler set.
func TestStockWorkerHelp(t *testing.T) {
	t.Parallel()
	code, out, _ := callWorker(payments.Effects(), "worker", noBuildInfo, "--help")
	require.Equal(t, 0, code)
	assert.Contains(t, out, "usage: worker [--check-config | --version | --help]")
	lineWith(t, out, "  "+payments.HandlerName+" ", "source *, type *")
	assert.Contains(t, out, "Handler set "+payments.Effects().Set().ID)
}

// --version starts with "<name> <stamped version>" (the line the image
// tests and the logs rely on), then names the build: the main package and
// module, the version of idempotent-events it was built with (or that it
// is the main module), Go, the VCS state, and the handler set.
func TestWorkerVersionNamesTheBuild(t *testing.T) {
	t.Parallel()
	reg := teamRegistry()
	team := func() (*debug.BuildInfo, bool) {
		return &debug.BuildInfo{
			GoVersion: "go1.26.8", Path: "example.com/team/payments/cmd/orders",
			Main: debug.Module{Path: "example.com/team/payments", Version: "v1.4.0"},
			Deps: []*debug.Module{{Path: "github.com/jackc/pgx/v5", Version: "v5.7.0"}, {Path: module, Version: "v0.9.1"}},
			Settings: []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: "0123abcd"},
				{Key: "vcs.time", Value: "2026-12-07T10:00:00Z"}, {Key: "vcs.modified", Value: "true"}},
		}, true
	}
	code, out, stderr := callWorker(reg, "orders", team, "--version")
	require.Equal(t, 0, code, stderr)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	assert.Equal(t, "orders "+telemetry.Version, lines[0])
	lineWith(t, out, "main package", "example.com/team/payments/cmd/orders")
	lineWith(t, out, "main module", "example.com/team/payments v1.4.0")
	lineWith(t, out, "idempotent-events", module+" v0.9.1")
	lineWith(t, out, "go ", "go1.26.8")
	lineWith(t, out, "vcs", "git 0123abcd 2026-12-07T10:00:00Z (modified)")
	lineWith(t, out, "handler set", reg.Set().ID, "orders.create, orders.receipt, payments")

	replaced := func() (*debug.BuildInfo, bool) {
		bi, _ := team()
		bi.Deps[1].Replace = &debug.Module{Path: "../idempotent-events"}
		bi.Settings = nil
		return bi, true
	}
	_, out, _ = callWorker(reg, "orders", replaced, "version")
	lineWith(t, out, "idempotent-events", module+" v0.9.1 => ../idempotent-events")
	assert.NotContains(t, out, "vcs")

	// This test binary is built in the idempotent-events module itself,
	// as cmd/worker and examples/orders are.
	_, out, _ = callWorker(reg, "worker", debug.ReadBuildInfo, "--version")
	lineWith(t, out, "main module", module+" ")
	lineWith(t, out, "idempotent-events", "the main module")

	_, out, _ = callWorker(reg, "orders", noBuildInfo, "--version")
	lineWith(t, out, "build info", "none")
}

// Any other argument is refused with the binary's own usage, exit 2,
// before any configuration is read.
func TestWorkerRefusesOtherArguments(t *testing.T) {
	t.Parallel()
	code, out, stderr := callWorker(teamRegistry(), "orders", noBuildInfo, "--bogus")
	assert.Equal(t, 2, code)
	assert.Empty(t, out)
	assert.True(t, strings.HasPrefix(stderr, "orders: unknown argument \"--bogus\"\n\nusage: orders ["), stderr)
	code, _, stderr = callWorker(teamRegistry(), "orders", noBuildInfo, "--help", "--version")
	assert.Equal(t, 2, code)
	assert.True(t, strings.HasPrefix(stderr, "orders: one argument at most"), stderr)
}
