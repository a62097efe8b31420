// Package dlq gives operators safe tools for events.dlq: list and show what
// landed there, replay it through the normal pipeline, or discard it, with
// every replay and discard written to the dlq_audit table in Postgres.
// eventsctl (pkg/ctl) and the admin API and page (pkg/admin) are thin layers
// over Client.
//
// # Reading without losing
//
// RabbitMQ has no "peek". A scan opens its own connection and takes up to
// ScanLimit messages with basic.get without auto-ack on one channel; each get
// returns the next ready message because the earlier ones are still unacked.
// When the scan is done, everything it did not act on is returned with one
// basic.nack (multiple, requeue). Whatever happens to the scanning process,
// the broker requeues every unacked message when the connection closes, so
// a scan can delay a message but never remove it. A cancelled context closes
// the connection, with the same effect.
//
// # Replay: confirmed first, removed second
//
// A replay publishes a copy of the DLQ message to events.replay through the
// default exchange, on a confirm channel with mandatory set
// (broker.ConfirmChannel), and acks the DLQ message only after the broker
// confirmed the copy and did not return it. The copy keeps the body, the
// AMQP properties and the pipeline's headers (x-ie-source,
// x-ie-received-at, the error history), starts a fresh set of retries
// (x-ie-attempt = 1), drops the x-ie-dlq-* headers, x-ie-dead-lettered-at and
// RabbitMQ's x-death bookkeeping, and says who replayed it (x-ie-replayed-by,
// x-ie-replayed-at, x-ie-replay-of, x-ie-replay-count). Workers consume
// events.replay beside events.main with their own small prefetch
// (WORKER_REPLAY_PREFETCH), through the same dedupe, and replays are rate
// limited (Options.Rate), so a replay never sits at the head of the live
// queue and never floods it.
//
// Where a crash can fall, and what it leaves:
//
//   - before the confirm: the DLQ message is unacked, so it is back in the
//     DLQ; a copy may or may not be in events.replay. If it is, it is
//     processed; a later replay of the DLQ message is then a duplicate.
//   - after the confirm, before the ack: the copy is in events.replay and the
//     message is back in the DLQ. Same as above: nothing lost, and the second
//     replay is recognised as a duplicate by the worker's ledger
//     (processed_events), never a second effect.
//   - after the ack: the message was replayed and removed; done.
//
// So a message is always in the DLQ, or replayed, or both, never neither.
// The audit row of a replay is written as "pending" before the publish and
// set to "replayed" (or "failed") after; a row left "pending" marks a replay
// whose operator died in between, and the DLQ tells which of the two states
// it ended in.
//
// # Discard: recorded first, removed second
//
// A discard inserts its audit row, which keeps the body, headers and
// properties of the message, and acks the DLQ message only after that insert
// committed. A crash before the commit leaves the message in the DLQ with no
// row; after it, the row exists and the message is in the DLQ until the ack.
// If the connection dies right after the ack frame was sent, the row can say
// "discarded" while the broker redelivers the message into the DLQ; a second
// discard then adds a second row. A discarded message can always be rebuilt
// from its row.
//
// # Selection and repeated passes
//
// Replay and discard need a selection: DLQ ids, a filter (event type,
// source, reason, event id, age), or an explicit "all". Within one operation
// a message is acted on at most once, and messages that reached the DLQ after
// the operation began are left alone, which is what keeps a replayed poison
// message that fails again from being replayed in a loop.
//
// A pass reads at most ScanLimit messages. When a pass acted on some of them
// and the queue holds more, the operation scans again: the messages it
// returned come first again (RabbitMQ requeues them at their old place), then
// the ones beyond. If ScanLimit messages in front do not match, later matches
// cannot be reached; the Report and Listing say so (Complete = false), and a
// larger scan limit or a narrower selection reaches them. A pass also acts on
// no more messages than the rate limit allows in ten minutes, to stay well
// inside RabbitMQ's consumer ack timeout.
//
// # Concurrent operators
//
// A message held unacked by one operator's scan is invisible to every other
// scan until it is returned, so two operators can never act on the same
// message twice at the same moment: only one of them gets it. The cost is
// that a list taken while another operator scans can miss the messages that
// operator holds, and a replay or discard by id may not find a message held
// by another scan for a moment (it looks twice more, 300 ms apart, before
// reporting it not found). Within one process, operations of a Client run
// one at a time for the same reason.
//
// # Quorum queues
//
// Returning a message with requeue counts as a delivery on quorum queues of
// RabbitMQ 4.0 to 4.2, whose default delivery limit is 20, and events.dlq
// has no dead-letter target. The topology (pkg/broker) therefore declares a
// quorum events.dlq with x-delivery-limit out of reach, so browsing cannot
// drop a message. From 4.3 on basic.nack (which the scans use) no longer
// counts, and RabbitMQ 3.x has no default limit.
package dlq
