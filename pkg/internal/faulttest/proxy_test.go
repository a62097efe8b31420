package faulttest_test

import (
	"bytes"
	"crypto/rand"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/faulttest"
)

// echo serves an echo server until the test ends and returns its address.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); _ = c.Close() }()
		}
	}()
	return ln.Addr().String()
}

func TestDelayHoldsTheStreamWithoutSlowingIt(t *testing.T) {
	p, err := faulttest.Start(echo(t))
	require.NoError(t, err)
	t.Cleanup(p.Close)
	const d = 100 * time.Millisecond
	p.SetDelay(d)
	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })

	// One round trip is held d each way.
	start := time.Now()
	_, err = c.Write([]byte("ping"))
	require.NoError(t, err)
	got := make([]byte, 4)
	_, err = io.ReadFull(c, got)
	require.NoError(t, err)
	require.Equal(t, "ping", string(got))
	require.GreaterOrEqual(t, time.Since(start), 2*d)

	// 8 MiB in chunks of at most 32 KiB arrives whole and in order: were
	// each chunk delayed in turn (SetLatency), it would take 256 × d each
	// way; a long link takes d plus the copying.
	want := make([]byte, 8<<20)
	_, _ = rand.Read(want)
	go func() { _, _ = c.Write(want) }()
	got = make([]byte, len(want))
	require.NoError(t, c.SetReadDeadline(time.Now().Add(20*time.Second)))
	_, err = io.ReadFull(c, got)
	require.NoError(t, err)
	require.True(t, bytes.Equal(want, got), "the stream was reordered or corrupted")
}
