// Package outbox gets the messages of effects handlers to downstream
// services exactly as often as their events commit: once, with a key to
// dedupe on.
//
// A handler enqueues a message (Writer, the effects.Outbox the worker gives
// it) in its event's transaction: the row commits with the ledger row or
// not at all, so a handler that enqueues and then fails leaves nothing.
// Its idempotency key is "<event key>/<effect>", unique, so nothing can
// enqueue it twice, and it takes the next sequence number of its object
// (the ordering key) in the same transaction.
//
// The Relay publishes committed rows to RabbitMQ, persistent and mandatory
// with publisher confirms, MessageId the idempotency key, and marks a row
// published only after the broker acked it without returning it. Failure
// handling, in the order things go wrong:
//
//   - The relay dies after the confirm and before the row is marked: the
//     row is still unpublished and is published again. The consumer sees
//     the same MessageId twice and dedupes it (package consumer): at least
//     once on the wire, exactly once in the consumer's effect.
//   - The broker nacks or returns the message (no queue bound): the
//     attempt counts, the row waits with exponential backoff, and after
//     MaxAttempts it is parked: it and the later rows of its object wait
//     for an operator (eventsctl outbox retry). A metric and an alert say so.
//   - The broker or its connection is gone: nothing is counted against the
//     rows; the relay reconnects and tries again.
//
// Rows are claimed by state (unpublished, not parked, due), never by an
// id high-water mark, with FOR UPDATE SKIP LOCKED, so a transaction that
// commits after a later one is never skipped and several relays share the
// work. Per object only the lowest unpublished sequence number is ever
// claimed, so a downstream queue with one consumer sees each object's
// messages in order. LISTEN/NOTIFY wakes the relay early; polling is the
// truth.
package outbox
