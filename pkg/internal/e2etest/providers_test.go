package e2etest_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
)

// Every provider through the real binaries (migrate, receiver, worker,
// eventsctl send signing as the provider does) and the real RabbitMQ,
// Redis and PostgreSQL, the receiver configured as a team would:
// WEBHOOK_SOURCES with a Standard Webhooks, a GitHub and a PayPal source
// beside Stripe's default route, PayPal's certificate served by eventsctl's
// stand-in (-paypal-dev) that the receiver trusts through
// PAYPAL_CERT_HOSTS and PAYPAL_CA_FILE, as docs/providers.md shows for
// make dev. For each provider:
//   - an event sent three times at once, then again once it is
//     committed, has one ledger row and one effect (its payments row, its
//     payment_events row; a GitHub delivery's effect is its ledger row),
//     and the late resend is answered 200 duplicate;
//   - a delivery signed with a wrong secret, and one without its
//     signature, are refused 401 and publish nothing: a valid event sent
//     after them is committed, and the ledger holds it and nothing of
//     theirs.
//
// Then PayPal captures, each a lifecycle (pending, completed, two partial
// refunds) sent shuffled with every event three times, end refunded with
// the refunded total, unmarked, every event recorded once; the DLQ is
// empty.
//
// What this does not show: PayPal's live certificates and hosts (the
// stand-in is ours; see docs/providers.md).
func TestEachProviderThroughTheBinaries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	amqpURL := servicetest.VHost(t)
	schema := servicetest.Name("t_prov")
	dbURL := servicetest.WithSearchPath(servicetest.DatabaseURL, schema)
	conn := servicetest.Conn(t, servicetest.DatabaseURL)
	_, err := conn.Exec(ctx, "CREATE SCHEMA "+schema)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = conn.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") })
	db := servicetest.Conn(t, dbURL)

	// The stand-in for PayPal's certificate host, and what the receiver
	// needs to trust it, as the docs have make dev do.
	dir := filepath.Join(t.TempDir(), "paypal-dev")
	code, exports, stderr := run(t, "eventsctl", cleanEnv(), "send", "-source", "paypal", "-paypal-dev", dir,
		"-paypal-cert-addr", servicetest.FreeAddr(), "-paypal-dev-env")
	require.Equal(t, 0, code, stderr)
	var paypalEnv []string
	for _, m := range regexp.MustCompile(`(?m)^export (PAYPAL_[A-Z_]+)='([^']*)'$`).FindAllStringSubmatch(exports, -1) {
		paypalEnv = append(paypalEnv, m[1]+"="+m[2])
	}
	require.Len(t, paypalEnv, 2, exports)

	httpAddr := servicetest.FreeAddr()
	env := cleanEnv(append(paypalEnv, "AMQP_URL="+amqpURL, "DATABASE_URL="+dbURL, "REDIS_URL="+servicetest.RedisURL,
		"REDIS_KEY_PREFIX="+servicetest.RedisPrefix(t), "HTTP_ADDR="+httpAddr, "LOG_LEVEL=debug", "SHUTDOWN_TIMEOUT=10s",
		"WEBHOOK_SECRETS=whsec_e2e_providers", "WEBHOOK_SOURCES=acme:standard,gh:github,paypal:paypal",
		"WEBHOOK_SECRETS_ACME=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "WEBHOOK_SECRETS_GH=gh-e2e-secret",
		"WEBHOOK_SECRETS_PAYPAL=WHE2EPROVIDERS1")...)
	code, _, stderr = run(t, "migrate", env)
	require.Equal(t, 0, code, stderr)
	receiver := startProc(t, "receiver", append(env, "METRICS_ADDR="+servicetest.FreeAddr()))
	wMetrics := servicetest.FreeAddr()
	worker := startProc(t, "worker", append(env, "METRICS_ADDR="+wMetrics))
	waitReady(t, "http://"+httpAddr+"/readyz")
	waitReady(t, "http://"+wMetrics+"/readyz")

	send := func(t *testing.T, args ...string) (int, []string, string) {
		t.Helper()
		code, out, stderr := run(t, "eventsctl", env, append([]string{"send", "-url", "http://" + httpAddr, "-paypal-dev", dir}, args...)...)
		return code, strings.Split(strings.TrimSpace(out), "\n"), stderr
	}
	count := func(t *testing.T, sql string, args ...any) int {
		t.Helper()
		var n int
		require.NoError(t, db.QueryRow(ctx, sql, args...).Scan(&n))
		return n
	}
	ledger := func(t *testing.T) int { return count(t, `SELECT count(*) FROM processed_events`) }
	committed := func(t *testing.T, key string) {
		t.Helper()
		require.Eventually(t, func() bool { return count(t, `SELECT count(*) FROM processed_events WHERE event_id = $1`, key) == 1 },
			20*time.Second, 50*time.Millisecond, "%s committed", key)
	}

	files := t.TempDir()
	push := filepath.Join(files, "push.json")
	require.NoError(t, os.WriteFile(push, []byte(`{"ref":"refs/heads/main","after":"6113728f27ae82c7b1a177c8d03f9e96e0adf246"}`), 0o600))
	capture := filepath.Join(files, "capture.json")
	require.NoError(t, os.WriteFile(capture, []byte(`{"id":"WH-E2E-SINGLE-1","event_version":"1.0","create_time":"2026-12-07T10:00:01Z",`+
		`"resource_type":"capture","event_type":"PAYMENT.CAPTURE.COMPLETED","summary":"Payment completed for $ 12.34 USD",`+
		`"resource":{"id":"CAPE2ESINGLE","status":"COMPLETED","amount":{"currency_code":"USD","value":"12.34"},`+
		`"create_time":"2026-12-07T10:00:00Z","update_time":"2026-12-07T10:00:00Z"}}`), 0o600))
	const ghDelivery = "72d3162e-cc78-11e3-81ab-4c9367dc0958"
	const paymentsOf = `SELECT count(*) FROM payments WHERE event_id = $1`
	for _, c := range []struct {
		name, source, id, key, wrong, effect string
		args                                 []string
	}{
		{"stripe", "stripe", "evt_e2e_prov_1", "evt_e2e_prov_1", "whsec_wrong", paymentsOf, []string{"-id", "evt_e2e_prov_1"}},
		{"standard", "acme", "msg_e2e_prov_1", "acme:msg_e2e_prov_1", "whsec_QUJDREVGR0hJSktMTU5PUA==", paymentsOf, []string{"-id", "msg_e2e_prov_1"}},
		{"github", "gh", ghDelivery, "gh:" + ghDelivery, "gh-wrong", `SELECT count(*) FROM processed_events WHERE event_id = $1`,
			[]string{"-id", ghDelivery, "-type", "push", "-file", push}},
		{"paypal", "paypal", "WH-E2E-SINGLE-1", "paypal:WH-E2E-SINGLE-1", "WHWRONG", `SELECT count(*) FROM payment_events WHERE event_id = $1`,
			[]string{"-file", capture}},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := ledger(t)
			code, lines, stderr := send(t, append([]string{"-source", c.source, "-times", "3"}, c.args...)...)
			require.Equal(t, 0, code, "%v %s", lines, stderr)
			require.Len(t, lines, 3)
			for _, l := range lines {
				assert.Regexp(t, `^(202 \{"status":"accepted","event_id":"`+regexp.QuoteMeta(c.id)+`"\}|200 \{"status":"duplicate","event_id":"`+
					regexp.QuoteMeta(c.id)+`"\})$`, l)
			}
			committed(t, c.key)
			code, lines, stderr = send(t, append([]string{"-source", c.source}, c.args...)...)
			require.Equal(t, 0, code, stderr)
			assert.Equal(t, []string{`200 {"status":"duplicate","event_id":"` + c.id + `"}`}, lines, "a resend once committed")
			assert.Equal(t, 1, count(t, c.effect, c.key), "one effect")
			assert.Equal(t, before+1, ledger(t), "one ledger row")

			for _, bad := range [][]string{{"-secret", c.wrong}, {"-unsigned"}} {
				code, lines, _ := send(t, append([]string{"-source", c.source, "-id", "bad_" + c.name}, bad...)...)
				assert.Equal(t, 1, code, "%v", bad)
				require.Len(t, lines, 1)
				assert.True(t, strings.HasPrefix(lines[0], "401 "), "%v: %s", bad, lines[0])
			}
			// Whatever the refused deliveries had published would be
			// committed before an event published after them.
			sentinel := "evt_e2e_after_bad_" + c.name
			code, _, stderr = send(t, "-id", sentinel)
			require.Equal(t, 0, code, stderr)
			committed(t, sentinel)
			assert.Equal(t, before+2, ledger(t), "the refused deliveries published nothing")
		})
	}

	// PayPal captures, each a lifecycle sent shuffled with duplicates.
	types := "PAYMENT.CAPTURE.PENDING,PAYMENT.CAPTURE.COMPLETED,PAYMENT.CAPTURE.REFUNDED,PAYMENT.CAPTURE.REFUNDED"
	const captures = 4
	for k := range captures {
		code, lines, stderr := send(t, "-source", "paypal", "-types", types, "-object", fmt.Sprintf("CAPE2ESHUF%d", k),
			"-amount", "3000", "-step", "5s", "-shuffle", "-times", "3")
		require.Equal(t, 0, code, "%v %s", lines, stderr)
		require.Len(t, lines, 12)
	}
	require.Eventually(t, func() bool {
		return count(t, `SELECT count(*) FROM payment_events WHERE object_id LIKE 'CAPE2ESHUF%'`) == 4*captures
	}, 30*time.Second, 100*time.Millisecond, "every capture event recorded")
	rows, err := db.Query(ctx, `SELECT id, status, amount::text, amount_refunded::text, needs_refresh FROM paypal_captures
		WHERE id LIKE 'CAPE2ESHUF%' ORDER BY id`)
	require.NoError(t, err)
	var got []string
	for rows.Next() {
		var id, status, amount, refunded string
		var marked bool
		require.NoError(t, rows.Scan(&id, &status, &amount, &refunded, &marked))
		got = append(got, fmt.Sprintf("%s %s %s %s %t", id, status, amount, refunded, marked))
	}
	require.NoError(t, rows.Err())
	var want []string
	for k := range captures {
		want = append(want, fmt.Sprintf("CAPE2ESHUF%d REFUNDED 30.00 30.00 false", k))
	}
	assert.Equal(t, want, got)
	assert.Zero(t, count(t, `SELECT count(*) FROM payment_events WHERE object_id LIKE 'CAPE2ESHUF%' AND outcome NOT IN ('applied', 'superseded')`))
	assert.Equal(t, 4*captures, count(t, `SELECT count(*) FROM processed_events WHERE event_id IN
		(SELECT event_id FROM payment_events WHERE object_id LIKE 'CAPE2ESHUF%')`), "one ledger row per event")

	amqpConn, err := amqp.Dial(amqpURL)
	require.NoError(t, err)
	defer amqpConn.Close()
	ch, err := amqpConn.Channel()
	require.NoError(t, err)
	q, err := ch.QueueDeclarePassive(broker.DLQ, true, false, false, false, nil)
	require.NoError(t, err)
	assert.Zero(t, q.Messages, "nothing dead-lettered")

	assert.Equal(t, 0, receiver.term(t, 15*time.Second), "receiver exits 0 on SIGTERM")
	assert.Equal(t, 0, worker.term(t, 15*time.Second), "worker exits 0 on SIGTERM")
}
