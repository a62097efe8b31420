package broker

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Errors a publish can end with. Every one means: the broker has not taken
// responsibility for the message.
var (
	// ErrUnavailable: no open channel, the channel closed before the confirm
	// arrived, or the connection is flow-controlled by the broker.
	ErrUnavailable = errors.New("broker unavailable")
	// ErrNacked: the broker refused the message (basic.nack).
	ErrNacked = errors.New("broker nacked the message")
	// ErrReturned: the message reached no queue (basic.return).
	ErrReturned = errors.New("broker returned the message as unroutable")
)

// ConfirmChannel is one AMQP channel in confirm mode that many goroutines
// may publish on at once.
type ConfirmChannel struct {
	ch     *amqp.Channel
	nextID atomic.Int64
	done   chan struct{}

	mu       sync.Mutex
	waiters  map[int64]chan error // publish id -> result
	byTag    map[uint64]int64     // delivery tag -> publish id
	early    map[uint64]bool      // confirms that overtook their registration
	returned map[int64]string     // publish ids the broker returned, with its reply text
	closed   error
}

// OpenConfirmChannel opens a channel on conn and puts it in confirm mode.
func OpenConfirmChannel(conn *amqp.Connection) (*ConfirmChannel, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("enable publisher confirms: %w", err)
	}
	c := &ConfirmChannel{
		ch:       ch,
		done:     make(chan struct{}),
		waiters:  map[int64]chan error{},
		byTag:    map[uint64]int64{},
		early:    map[uint64]bool{},
		returned: map[int64]string{},
	}
	// Unbuffered on purpose: the connection's reader hands over a return and
	// the following ack one at a time to the single dispatcher, which keeps
	// their order.
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation))
	returns := ch.NotifyReturn(make(chan amqp.Return))
	go c.dispatch(confirms, returns)
	return c, nil
}

// Done is closed once the channel has closed and every waiter was failed.
func (c *ConfirmChannel) Done() <-chan struct{} { return c.done }

// Close closes the channel; publishes still waiting fail with ErrUnavailable.
func (c *ConfirmChannel) Close() error {
	err := c.ch.Close()
	<-c.done
	return err
}

func (c *ConfirmChannel) dispatch(confirms <-chan amqp.Confirmation, returns <-chan amqp.Return) {
	defer close(c.done)
	for confirms != nil || returns != nil {
		select {
		case conf, ok := <-confirms:
			if !ok {
				confirms = nil
				c.fail(ErrUnavailable)
				continue
			}
			c.mu.Lock()
			if id, ok := c.byTag[conf.DeliveryTag]; ok {
				delete(c.byTag, conf.DeliveryTag)
				c.resolveLocked(id, conf.Ack)
			} else {
				c.early[conf.DeliveryTag] = conf.Ack
			}
			c.mu.Unlock()
		case ret, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			if id, err := strconv.ParseInt(ret.CorrelationId, 36, 64); err == nil {
				c.mu.Lock()
				c.returned[id] = fmt.Sprintf("%d %s", ret.ReplyCode, ret.ReplyText)
				c.mu.Unlock()
			}
		}
	}
	c.fail(ErrUnavailable)
}

// fail ends every waiting publish and refuses new ones.
func (c *ConfirmChannel) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed == nil {
		c.closed = fmt.Errorf("%w: channel closed before the confirm arrived", err)
	}
	for id, w := range c.waiters {
		w <- c.closed
		delete(c.waiters, id)
	}
	clear(c.byTag)
	clear(c.early)
	clear(c.returned)
}

func (c *ConfirmChannel) resolveLocked(id int64, ack bool) {
	reply, returned := c.returned[id]
	delete(c.returned, id)
	w, ok := c.waiters[id]
	if !ok {
		return // the publisher gave up waiting
	}
	delete(c.waiters, id)
	switch {
	case returned:
		w <- fmt.Errorf("%w: %s", ErrReturned, reply)
	case !ack:
		w <- ErrNacked
	default:
		w <- nil
	}
}

// Publish sends msg as persistent and mandatory and waits for the broker's
// confirm. It returns nil only if the broker acked the message and did not
// return it. msg.CorrelationId is overwritten: it carries the per-channel
// publish id that matches a basic.return to its publish.
func (c *ConfirmChannel) Publish(ctx context.Context, exchange, key string, msg amqp.Publishing) error {
	id := c.nextID.Add(1)
	w := make(chan error, 1)
	c.mu.Lock()
	if c.closed != nil {
		err := c.closed
		c.mu.Unlock()
		return err
	}
	c.waiters[id] = w
	c.mu.Unlock()

	msg.CorrelationId = strconv.FormatInt(id, 36)
	msg.DeliveryMode = amqp.Persistent
	dc, err := c.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, true, false, msg)
	if err != nil {
		c.forget(id)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	c.mu.Lock()
	if ack, ok := c.early[dc.DeliveryTag]; ok {
		delete(c.early, dc.DeliveryTag)
		c.resolveLocked(id, ack)
	} else if c.closed == nil {
		c.byTag[dc.DeliveryTag] = id
	}
	c.mu.Unlock()

	select {
	case err := <-w:
		return err
	case <-ctx.Done():
		c.forget(id)
		return fmt.Errorf("wait for publisher confirm: %w", ctx.Err())
	}
}

// forget drops a waiter whose publisher is no longer listening; a late
// confirm for it is then discarded.
func (c *ConfirmChannel) forget(id int64) {
	c.mu.Lock()
	delete(c.waiters, id)
	c.mu.Unlock()
}

// Publisher publishes over a set of confirm channels that belong to the
// current connection. Between connections it refuses with ErrUnavailable
// rather than queueing: a caller that waited would hold a webhook request
// open for as long as the broker is gone.
type Publisher struct {
	mu      sync.RWMutex
	chans   []*ConfirmChannel
	next    atomic.Uint64
	blocked atomic.Bool
}

// Ready reports whether a publish can be attempted now.
func (p *Publisher) Ready() bool {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return len(p.chans) > 0 && !p.blocked.Load()
}

// Serve opens n confirm channels on conn, publishes over them until conn
// closes or ctx is done, then detaches them. It is meant to be called from a
// ServeFunc after the topology is declared.
func (p *Publisher) Serve(ctx context.Context, conn *amqp.Connection, n int) error {
	chans := make([]*ConfirmChannel, 0, n)
	defer func() {
		p.mu.Lock()
		p.chans = nil
		p.mu.Unlock()
		for _, c := range chans {
			_ = c.Close()
		}
	}()
	for i := 0; i < n; i++ {
		c, err := OpenConfirmChannel(conn)
		if err != nil {
			return err
		}
		chans = append(chans, c)
	}
	blocked := conn.NotifyBlocked(make(chan amqp.Blocking, 4))
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	p.blocked.Store(false)
	p.mu.Lock()
	p.chans = chans
	p.mu.Unlock()
	for {
		select {
		case <-ctx.Done():
			return nil
		case b, ok := <-blocked:
			if ok {
				// The broker stops reading from a blocked connection: a publish
				// would hang, so refuse fast until it is unblocked.
				p.blocked.Store(b.Active)
			}
		case err, ok := <-closed:
			if ok && err != nil {
				return err
			}
			return errors.New("connection closed")
		}
	}
}

// Publish sends msg on one of the current channels; see
// ConfirmChannel.Publish.
func (p *Publisher) Publish(ctx context.Context, exchange, key string, msg amqp.Publishing) error {
	if p.blocked.Load() {
		return fmt.Errorf("%w: connection blocked by the broker (resource alarm)", ErrUnavailable)
	}
	p.mu.RLock()
	n := len(p.chans)
	var c *ConfirmChannel
	if n > 0 {
		c = p.chans[p.next.Add(1)%uint64(n)]
	}
	p.mu.RUnlock()
	if c == nil {
		return fmt.Errorf("%w: not connected", ErrUnavailable)
	}
	return c.Publish(ctx, exchange, key, msg)
}
