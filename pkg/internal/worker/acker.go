package worker

import (
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
)

// acker turns the settling of individual deliveries on one channel into as
// few acks as possible. Delivery tags on a channel are consecutive from 1;
// once every tag up to some n is settled, one ack with multiple=true
// acknowledges them all. A tag that is not settled holds back the acks of
// the tags after it, never the other way round, so nothing is acked before
// it was settled.
type acker struct {
	ch interface {
		Ack(tag uint64, multiple bool) error
	}
	mu      sync.Mutex
	next    uint64          // lowest tag not acked yet
	settled map[uint64]bool // settled tags above next
}

func newAcker(ch *amqp.Channel) *acker {
	return &acker{ch: ch, next: 1, settled: map[uint64]bool{}}
}

// settle marks tags as done and acks the longest settled run from the
// lowest unacked tag, in one frame.
func (a *acker) settle(tags ...uint64) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, t := range tags {
		if t >= a.next {
			a.settled[t] = true
		}
	}
	upto := a.next
	for a.settled[upto] {
		delete(a.settled, upto)
		upto++
	}
	if upto == a.next {
		return nil
	}
	a.next = upto
	return a.ch.Ack(upto-1, true)
}
