package eventsctl_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/event"
	"github.com/idempotent-events/idempotent-events/pkg/internal/eventsctl"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
)

// eventsctl reconcile, end to end on the command line: a one-page Stripe
// listing of two events, one in the ledger, one missing; the missing one
// is in events.main afterwards, marked as the reconciler's.
func TestReconcileCommand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL, amqpURL := servicetest.Schema(t), servicetest.VHost(t)
	b := servicetest.NewBroker(t, amqpURL, broker.Topology{QueueType: broker.QueueClassic, RetryDelays: []time.Duration{time.Second}})
	db, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	defer db.Close()
	_, err = db.Exec(ctx, `INSERT INTO processed_events (event_id, event_type, payload_sha256) VALUES ('evt_there', 'payment_intent.succeeded', '\x00')`)
	require.NoError(t, err)

	var queries []string
	stripe := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer rk_test_cmd" {
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"error":{"message":"Invalid API Key provided"}}`))
			return
		}
		queries = append(queries, r.URL.RawQuery)
		data := []json.RawMessage{}
		for _, id := range []string{"evt_gone", "evt_there"} {
			var v map[string]any
			assert.NoError(t, json.Unmarshal(event.Example{ID: id, Type: "payment_intent.succeeded", AmountCents: 100, Currency: "eur", Status: "succeeded"}.JSON(), &v))
			v["created"] = time.Now().Add(-time.Hour).Unix()
			body, _ := json.Marshal(v)
			data = append(data, body)
		}
		out, _ := json.Marshal(map[string]any{"object": "list", "has_more": false, "data": data})
		_, _ = w.Write(out)
	}))
	defer stripe.Close()

	env := map[string]string{"DATABASE_URL": dbURL, "AMQP_URL": amqpURL, "STRIPE_API_URL": stripe.URL, "STRIPE_API_KEY": "rk_test_cmd", "LOG_LEVEL": "error"}
	run := func(args ...string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		code := eventsctl.Main(ctx, args, func(k string) string { return env[k] }, strings.NewReader(""), &stdout, &stderr)
		return code, stdout.String(), stderr.String()
	}

	code, out, errOut := run("reconcile", "-since", "24h", "-dry-run", "-types", "payment_intent.succeeded")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "1 in the ledger, 1 missing")
	assert.Contains(t, out, "missing evt_gone")
	assert.Zero(t, b.Depth(broker.MainQueue), "a dry run injects nothing")
	require.Len(t, queries, 1)
	assert.Contains(t, queries[0], "types[0]=payment_intent.succeeded")

	code, out, errOut = run("reconcile", "-since", "24h")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "injected 1")
	msgs := b.Drain(broker.MainQueue)
	require.Len(t, msgs, 1)
	assert.Equal(t, "evt_gone", msgs[0].MessageId)
	assert.Equal(t, "reconcile", broker.String(msgs[0].Headers, broker.HeaderOrigin))

	env["STRIPE_API_KEY"] = "rk_test_wrong"
	code, _, errOut = run("reconcile", "-since", "24h")
	assert.Equal(t, 1, code, "a refused key fails the run: %s", errOut)
	assert.Contains(t, errOut, "Invalid API Key")

	delete(env, "STRIPE_API_KEY")
	code, _, errOut = run("reconcile")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "STRIPE_API_KEY")

	env["STRIPE_API_KEY"] = "rk_test_cmd"
	code, _, errOut = run("reconcile", "-since", "800h")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "Since")
}

// -check-config makes every check a run makes before it calls a service,
// and calls none: the URLs below point nowhere. The Helm chart's tests run
// it with the CronJob's arguments and environment.
func TestReconcileCheckConfig(t *testing.T) {
	t.Parallel()
	base := map[string]string{
		"STRIPE_API_KEY": "rk_test_check",
		"DATABASE_URL":   "postgres://app:pw@db.invalid:5432/idempotent_events?sslmode=require",
		"AMQP_URL":       "amqps://app:pw@rabbitmq.invalid:5671/payments",
	}
	cases := []struct {
		name string
		env  map[string]string // merged over base; "" removes a variable
		args []string
		code int
		want string // in stdout on 0, in stderr otherwise
	}{
		{"the chart's defaults", nil, []string{"-since=72h", "-settle=5m", "-rate=20", "-undelivered-only=false"}, 0, "configuration ok"},
		{"types from the environment", map[string]string{"RECONCILE_TYPES": "payment_intent.succeeded,charge.refunded"}, nil, 0, "configuration ok"},
		{"window beyond Stripe's 30 days", nil, []string{"-since=800h"}, 2, "Since"},
		{"settle not inside the window", nil, []string{"-since=1h", "-settle=2h"}, 2, "Settle"},
		{"21 types", map[string]string{"RECONCILE_TYPES": strings.Repeat("charge.succeeded,", 21)}, nil, 2, "Types"},
		{"no key", map[string]string{"STRIPE_API_KEY": ""}, nil, 2, "STRIPE_API_KEY"},
		{"no database", map[string]string{"DATABASE_URL": ""}, nil, 2, "DATABASE_URL"},
		{"database URL that does not parse", map[string]string{"DATABASE_URL": "postgres://app:pw@db.invalid:notaport/x"}, nil, 2, "DATABASE_URL"},
		{"AMQP URL that does not parse", map[string]string{"AMQP_URL": "http://rabbitmq.invalid"}, nil, 2, "AMQP_URL"},
		{"API URL without a scheme", map[string]string{"STRIPE_API_URL": "api.stripe.com"}, nil, 2, "STRIPE_API_URL"},
		{"negative rate", nil, []string{"-rate=-1"}, 2, "-rate"},
		{"bad log level", map[string]string{"LOG_LEVEL": "loud"}, nil, 2, "loud"},
		{"a stray argument", nil, []string{"72h"}, 2, "unexpected argument"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			env := map[string]string{}
			for k, v := range base {
				env[k] = v
			}
			for k, v := range c.env {
				env[k] = v
			}
			var stdout, stderr bytes.Buffer
			args := append(append([]string{"reconcile"}, c.args...), "-check-config")
			code := eventsctl.Main(context.Background(), args, func(k string) string { return env[k] }, strings.NewReader(""), &stdout, &stderr)
			require.Equal(t, c.code, code, "stdout %q, stderr %q", stdout.String(), stderr.String())
			if c.code == 0 {
				assert.Contains(t, stdout.String(), c.want)
			} else {
				assert.Contains(t, stderr.String(), c.want)
			}
		})
	}
}
