package worker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
)

// maxErrorLen keeps error headers small.
const maxErrorLen = 1024

// settle carries out m's Result, short of the ack (handle acks the batch).
// An error means the message could not be moved where it must go.
func (w *Worker) settle(ctx context.Context, s *session, m *message) error {
	res := m.res
	switch res.Outcome {
	case Processed, Duplicate:
		if res.Outcome == Duplicate {
			w.m.duplicates.WithLabelValues(string(res.Layer)).Inc()
			w.log.Debug("duplicate acked", zap.String("event_id", m.key), zap.String("layer", string(res.Layer)))
		}
	case Conflict:
		w.log.Warn("event id reused with different content: recorded in event_conflicts, not processed",
			zap.String("event_id", m.key), zap.String("stored_digest", m.stored), zap.String("digest", m.digest))
	case Retry:
		queue := broker.RetryQueue(res.Delay)
		if err := w.publishCopy(ctx, s, queue, m, nil); err != nil {
			return fmt.Errorf("publish to %s: %w", queue, err)
		}
		w.m.retries.WithLabelValues(broker.FormatDelay(res.Delay)).Inc()
		w.log.Warn("event sent to retry tier", zap.String("event_id", m.key), zap.Int("attempt", m.attempt),
			zap.String("queue", queue), zap.Error(res.Err))
	case DeadLetter:
		extra := amqp.Table{
			broker.HeaderDLQID:          newDLQID(),
			broker.HeaderDLQReason:      string(res.Reason),
			broker.HeaderDeadLetteredAt: time.Now().UTC().Format(time.RFC3339Nano),
		}
		if err := w.publishCopy(ctx, s, broker.DLQ, m, extra); err != nil {
			return fmt.Errorf("publish to %s: %w", broker.DLQ, err)
		}
		w.m.deadLetters.WithLabelValues(string(res.Reason)).Inc()
		w.log.Error("event dead-lettered", zap.String("event_id", m.key), zap.String("message_id", m.d.MessageId),
			zap.String("reason", string(res.Reason)), zap.Int("attempts", m.attempt), zap.Error(res.Err))
	default:
		return fmt.Errorf("no outcome decided for delivery %d", m.d.DeliveryTag)
	}
	w.m.events.WithLabelValues(res.Outcome.String()).Inc()
	return nil
}

// publishCopy publishes m to queue (through the default exchange) with the
// failure bookkeeping headers, and waits for the broker's confirm.
func (w *Worker) publishCopy(ctx context.Context, s *session, queue string, m *message, extra amqp.Table) error {
	h := make(amqp.Table, len(m.d.Headers)+8)
	for k, v := range m.d.Headers {
		h[k] = v
	}
	now := time.Now().UTC().Format(time.RFC3339Nano)
	errText := "unknown error"
	if m.res.Err != nil {
		errText = truncate(m.res.Err.Error(), maxErrorLen)
	}
	if broker.String(h, broker.HeaderFirstError) == "" {
		h[broker.HeaderFirstError] = errText
		h[broker.HeaderFirstFailedAt] = now
	}
	h[broker.HeaderLastError] = errText
	h[broker.HeaderLastFailedAt] = now
	if broker.String(h, broker.HeaderOriginalExchange) == "" && broker.String(h, broker.HeaderOriginalRoutingKey) == "" {
		h[broker.HeaderOriginalExchange] = m.d.Exchange
		h[broker.HeaderOriginalRoutingKey] = m.d.RoutingKey
	}
	next := m.attempt
	if m.res.Outcome == Retry {
		next++
	}
	h[broker.HeaderAttempt] = int64(next)
	for k, v := range extra {
		h[k] = v
	}
	msg := amqp.Publishing{
		Headers:         h,
		ContentType:     m.d.ContentType,
		ContentEncoding: m.d.ContentEncoding,
		MessageId:       m.d.MessageId,
		Timestamp:       m.d.Timestamp,
		Type:            m.d.Type,
		Body:            m.d.Body,
	}
	pctx, cancel := context.WithTimeout(ctx, w.opts.PublishTimeout)
	defer cancel()
	return s.pub.Publish(pctx, "", queue, msg)
}

func newDLQID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
