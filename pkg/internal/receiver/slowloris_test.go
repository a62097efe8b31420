package receiver_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/httpserver"
	"github.com/idempotent-events/idempotent-events/pkg/internal/receiver"
)

// Many clients that trickle their headers or their body cannot hold the
// receiver: a normal request is still answered 202 while they hang on, and
// the server drops the slow ones by its read timeouts.
func TestSlowClientsCannotHoldTheReceiver(t *testing.T) {
	if testing.Short() {
		t.Skip("-short (make check): it waits out the read timeouts; make test runs it")
	}
	t.Parallel()
	f := start(t, setup{inFlight: 16})
	// The handler behind the production server, with its timeouts shortened
	// so the test does not wait half a minute.
	srv, err := httpserver.New(httpserver.Options{Addr: "127.0.0.1:0", Handler: f.handler, ShutdownTimeout: 5 * time.Second,
		Timeouts: httpserver.Timeouts{ReadHeader: 2 * time.Second, Read: 4 * time.Second, Write: 10 * time.Second, Idle: 10 * time.Second}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Run(ctx) }()
	t.Cleanup(func() { cancel(); assert.NoError(t, <-served) })
	addr := srv.Addr().String()

	const slow = 200
	conns := make([]net.Conn, 0, slow)
	for i := 0; i < slow; i++ {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		conns = append(conns, c)
		if i%2 == 0 {
			// Headers, a byte at a time, never finished.
			_, err = fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nX-Slow: ", receiver.PaymentRoute)
		} else {
			// Complete headers, then a body that never arrives.
			_, err = fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{", receiver.PaymentRoute)
		}
		require.NoError(t, err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				for _, c := range conns {
					_, _ = c.Write([]byte("a"))
				}
			}
		}
	})

	body := sample(t, "evt_beside_slow_clients")
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+receiver.PaymentRoute, strings.NewReader(string(body)))
	require.NoError(t, err)
	for k, v := range signed(body) {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusAccepted, resp.StatusCode, "a normal request is served beside %d slow clients", slow)
	assert.Equal(t, 1, f.broker.Depth(broker.MainQueue))

	// The read timeouts end every slow connection; none is held forever.
	close(stop)
	wg.Wait()
	for i, c := range conns {
		require.NoError(t, c.SetReadDeadline(time.Now().Add(time.Minute)))
		// The server may answer (408 or 400) before it closes; read to EOF.
		_, err := io.Copy(io.Discard, c)
		require.NoError(t, err, "slow connection %d: the server closes it (EOF), not the one-minute deadline", i)
		_ = c.Close()
	}
}

// Headers beyond the server's limit are refused before the handler runs.
func TestOversizedHeadersAreRefused(t *testing.T) {
	t.Parallel()
	f := start(t, setup{})
	srv := httptest.NewUnstartedServer(f.handler)
	srv.Config = httpserver.HTTPServer(f.handler, httpserver.DefaultTimeouts)
	srv.Start()
	t.Cleanup(srv.Close)
	body := sample(t, "evt_big_headers")
	req, err := http.NewRequest(http.MethodPost, srv.URL+receiver.PaymentRoute, strings.NewReader(string(body)))
	require.NoError(t, err)
	for k, v := range signed(body) {
		req.Header.Set(k, v)
	}
	req.Header.Set("X-Padding", strings.Repeat("a", 64<<10))
	resp, err := client.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusRequestHeaderFieldsTooLarge, resp.StatusCode)
	assert.Equal(t, 0, f.broker.Depth(broker.MainQueue))
}
