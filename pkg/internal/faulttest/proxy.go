// Package faulttest is a TCP proxy that breaks on command, for tests that
// need a dependency to fail the way networks do: connections cut mid-stream,
// a service refusing connections for a while, added latency.
//
// It sits on 127.0.0.1 in front of a real service; the component under test
// is pointed at the proxy's address instead of the service's.
//
// It is for tests only: no product package imports it
// (pkg/internal/app/layers_test.go checks).
package faulttest

import (
	"net"
	"sync"
	"time"
)

// Proxy forwards TCP connections to a target address.
type Proxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	conns   map[net.Conn]struct{}
	down    bool
	latency time.Duration
	delay   time.Duration
	closed  bool
	wg      sync.WaitGroup
}

// Start listens on a free 127.0.0.1 port and forwards to target.
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept)
	return p, nil
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Cut closes every open connection; new ones are still accepted.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.Close()
	}
}

// SetDown cuts every connection and, while down, closes new ones at once,
// as a service that refuses connections would look to a client.
func (p *Proxy) SetDown(down bool) {
	p.mu.Lock()
	p.down = down
	p.mu.Unlock()
	if down {
		p.Cut()
	}
}

// SetLatency delays every chunk forwarded in either direction by d.
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	p.latency = d
	p.mu.Unlock()
}

// SetDelay holds every chunk forwarded in either direction for d before
// it is written, without slowing the stream down: what is read meanwhile
// queues behind it, as on a long link. (SetLatency waits d before reading
// on, as on a slow link.)
func (p *Proxy) SetDelay(d time.Duration) {
	p.mu.Lock()
	p.delay = d
	p.mu.Unlock()
}

// Close stops the proxy and waits for its goroutines.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	_ = p.ln.Close()
	p.Cut()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.down || p.closed {
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		p.conns[c] = struct{}{}
		p.mu.Unlock()
		p.wg.Go(func() { p.serve(c) })
	}
}

func (p *Proxy) serve(client net.Conn) {
	defer p.forget(client)
	upstream, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		return
	}
	p.mu.Lock()
	if p.down || p.closed {
		p.mu.Unlock()
		_ = upstream.Close()
		return
	}
	p.conns[upstream] = struct{}{}
	p.mu.Unlock()
	defer p.forget(upstream)

	var wg sync.WaitGroup
	wg.Go(func() { p.pipe(upstream, client) })
	wg.Go(func() { p.pipe(client, upstream) })
	wg.Wait()
}

// chunk is what one read got, to be written at due.
type chunk struct {
	b   []byte
	due time.Time
}

// pipe copies src to dst until either side fails, then closes both so the
// other direction ends too. A writer takes the chunks in order from a
// queue and holds each until it is due (SetDelay).
func (p *Proxy) pipe(dst, src net.Conn) {
	defer func() { _ = dst.Close(); _ = src.Close() }()
	queue := make(chan chunk, 64)
	var writer sync.WaitGroup
	defer writer.Wait()
	defer close(queue)
	writer.Go(func() {
		for c := range queue {
			if d := time.Until(c.due); d > 0 {
				time.Sleep(d)
			}
			if _, err := dst.Write(c.b); err != nil {
				_ = src.Close() // ends the reader
				for range queue {
				}
				return
			}
		}
	})
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			latency, delay := p.latency, p.delay
			p.mu.Unlock()
			if latency > 0 {
				time.Sleep(latency)
			}
			queue <- chunk{b: append([]byte(nil), buf[:n]...), due: time.Now().Add(delay)}
		}
		if err != nil {
			return
		}
	}
}

func (p *Proxy) forget(c net.Conn) {
	_ = c.Close()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}
