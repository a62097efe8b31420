package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/effects"
	"github.com/idempotent-events/idempotent-events/pkg/effects/effectstest"
)

// The handler alone, in a rolled-back transaction: one order per
// succeeded PaymentIntent, and its receipt.
func TestASucceededPaymentMakesAnOrder(t *testing.T) {
	t.Parallel()
	db := effectstest.DB(t, setup)
	ev := effectstest.Event(t, effectstest.StripeEvent(t, "evt_order_1", "payment_intent.succeeded", time.Now(),
		effectstest.PaymentIntent("pi_order_1", "succeeded", 2500)))
	require.NoError(t, effectstest.Handle(t, db, handlers(), ev, func(tx effects.Tx) {
		var pi string
		require.NoError(t, tx.QueryRow(context.Background(), `SELECT payment_intent_id FROM orders WHERE event_id = 'evt_order_1'`).Scan(&pi))
		require.Equal(t, "pi_order_1", pi)
		var receiptEvent, currency string
		var amount int64
		require.NoError(t, tx.QueryRow(context.Background(), `SELECT event_id, amount, currency FROM receipts WHERE payment_intent_id = 'pi_order_1'`).
			Scan(&receiptEvent, &amount, &currency))
		require.Equal(t, "evt_order_1", receiptEvent)
		require.Equal(t, int64(2500), amount)
		require.Equal(t, "usd", currency)
	}))
}

// A captured charge.succeeded says its PaymentIntent succeeded: the
// receipt is written then (the transition handler runs on the state, not
// on one event type), while orders.create, which takes
// payment_intent.succeeded only, writes no order.
func TestACapturedChargeMakesTheReceipt(t *testing.T) {
	t.Parallel()
	db := effectstest.DB(t, setup)
	ev := effectstest.Event(t, chargeSucceeded(t, "evt_charge_1", "pi_charge_1", 1800))
	require.NoError(t, effectstest.Handle(t, db, handlers(), ev, func(tx effects.Tx) {
		var orders int
		require.NoError(t, tx.QueryRow(context.Background(), `SELECT count(*) FROM orders`).Scan(&orders))
		require.Zero(t, orders)
		var receiptEvent string
		var amount int64
		require.NoError(t, tx.QueryRow(context.Background(), `SELECT event_id, amount FROM receipts WHERE payment_intent_id = 'pi_charge_1'`).
			Scan(&receiptEvent, &amount))
		require.Equal(t, "evt_charge_1", receiptEvent)
		require.Equal(t, int64(1800), amount)
	}))
}

// A PaymentIntent that has not succeeded has neither.
func TestAProcessingPaymentMakesNothing(t *testing.T) {
	t.Parallel()
	db := effectstest.DB(t, setup)
	ev := effectstest.Event(t, effectstest.StripeEvent(t, "evt_proc_1", "payment_intent.processing", time.Now(),
		effectstest.PaymentIntent("pi_proc_1", "processing", 2500)))
	require.NoError(t, effectstest.Handle(t, db, handlers(), ev, func(tx effects.Tx) {
		var n int
		require.NoError(t, tx.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM orders) + (SELECT count(*) FROM receipts)`).Scan(&n))
		require.Zero(t, n)
	}))
}

// Under duplicates and crashes, the orders and receipts tables end as after
// one clean run.
func TestOrdersAreWrittenExactlyOnce(t *testing.T) {
	t.Parallel()
	var fixtures [][]byte
	for _, id := range []string{"1", "2", "3", "4", "5"} {
		fixtures = append(fixtures, effectstest.StripeEvent(t, "evt_o_"+id, "payment_intent.succeeded", time.Now(),
			effectstest.PaymentIntent("pi_o_"+id, "succeeded", 2500)))
	}
	// Receipts of PaymentIntents only their charge said succeeded.
	fixtures = append(fixtures, chargeSucceeded(t, "evt_o_ch_6", "pi_o_6", 700), chargeSucceeded(t, "evt_o_ch_7", "pi_o_7", 900))
	effectstest.AssertExactlyOnce(t, effectstest.Options{
		Effects: handlers(), Fixtures: fixtures, Setup: setup,
		Tables: []string{"orders", "receipts", "payments", "payment_intents", "outbox"},
		Ignore: []string{"id", "created_at", "updated_at", "status_event_id", "next_attempt_at"},
	})
}

// The README's snippet of a worker of one's own is this example: every
// line of it is a line of main.go, in the same order (the snippet may
// leave lines out, such as the table creation, but says nothing the
// example does not do).
func TestTheREADMESnippetIsThisExample(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	main, err := os.ReadFile("main.go")
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(readme), "## Your effects, exactly once")
	require.True(t, ok, "README has no section \"Your effects, exactly once\"")
	_, snippet, ok := strings.Cut(section, "```go\n")
	require.True(t, ok, "no Go snippet in the README's section")
	snippet, _, ok = strings.Cut(snippet, "```")
	require.True(t, ok)
	lines := strings.Split(string(main), "\n")
	next := 0
	for _, want := range strings.Split(snippet, "\n") {
		want = strings.TrimSpace(want)
		if want == "" {
			continue
		}
		found := false
		for next < len(lines) && !found {
			found = strings.TrimSpace(lines[next]) == want
			next++
		}
		require.True(t, found, "README snippet line %q is not in examples/orders/main.go (after the snippet's previous line)", want)
	}
}

// The built binary's --help names it and its handlers, and a --help (or
// --version) touches no database: main creates its tables only on a start.
func TestTheBinaryDescribesItself(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "orders")
	build := exec.Command("go", "build", "-o", bin, ".")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)
	unreachable := []string{"DATABASE_URL=postgres://postgres@127.0.0.1:1/x?sslmode=disable", "PATH=" + os.Getenv("PATH")}

	help := exec.Command(bin, "--help")
	help.Env = unreachable
	out, err = help.Output()
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(out), "orders: a worker built on idempotent-events"), "%s", out)
	require.Contains(t, string(out), "usage: orders [")
	set := handlers().Set()
	require.Contains(t, string(out), "Handler set "+set.ID)
	for _, h := range set.Handlers {
		require.Contains(t, string(out), "  "+h.Name+" ")
	}
	require.Contains(t, string(out), "source stripe, type payment_intent.succeeded")
	require.Contains(t, string(out), "transition  payment_intent -> succeeded")

	version := exec.Command(bin, "--version")
	version.Env = unreachable
	out, err = version.Output()
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(out), "orders "), "%s", out)
	require.Contains(t, string(out), "orders.create, orders.receipt, payments")
}

// chargeSucceeded is a charge.succeeded event of a captured charge of
// intent, for amount.
func chargeSucceeded(t *testing.T, id, intent string, amount int64) []byte {
	return effectstest.StripeEvent(t, id, "charge.succeeded", time.Now(), map[string]any{
		"id": "ch_" + strings.TrimPrefix(intent, "pi_"), "object": "charge", "status": "succeeded", "amount": amount,
		"amount_captured": amount, "captured": true, "currency": "usd", "payment_intent": intent,
	})
}

// setup creates the example's tables in a test's schema, as main does.
func setup(ctx context.Context, db *pgxpool.Pool) error {
	return createTables(ctx, db.Config().ConnString())
}
