// Package worker consumes events.main and turns each event into its effect
// exactly once.
//
// For every batch of deliveries (up to WORKER_BATCH_SIZE, or what arrived
// within WORKER_BATCH_WAIT):
//
//  1. Identify: the dedupe key and content digest come from the message's
//     MessageId and x-ie-digest, which the receiver sets; a message without
//     them is decoded here.
//  2. Redis fast path: one MGET. A hit with the same digest means the event's
//     transaction committed earlier (keys are written only after COMMIT): ack
//     it as a duplicate, without decoding its body. A miss or any Redis error
//     means "ask Postgres"; the fast path never skips an event.
//  3. Decode the rest. A body that is not a valid event can never succeed: it
//     goes to events.dlq at once with reason invalid_payload, as does one
//     whose MessageId names another event. The body's digest decides
//     between duplicate and conflict.
//  4. One Postgres transaction: processed_events (primary key event_id) with
//     ON CONFLICT DO NOTHING RETURNING, then the payments rows of the events
//     that insert returned. Events it did not return were committed before:
//     duplicates.
//  5. After COMMIT: remember the ids in Redis (best effort), then ack.
//
// Failures, decided in one place (decide):
//
//   - a transient error (Postgres down, timeout, deadlock) sends the message
//     to the next retry tier: a copy is published, with our attempt header
//     raised, to the tier's queue, whose queue-level TTL dead-letters it back
//     to main_exchange; only after the broker confirmed the copy is the
//     original acked. After the last tier it goes to events.dlq with reason
//     retries_exhausted.
//   - a permanent error (Postgres rejects the data) sends it to events.dlq
//     with reason rejected_by_database. In a batch, the batch is first retried
//     one message at a time, so only the bad message is affected.
//   - a panic while processing one message sends it to events.dlq with reason
//     panic.
//
// Every DLQ copy carries the reason, the attempts, the first and last error
// and the original exchange and routing key in x-ie-* headers.
//
// If a retry or DLQ copy cannot be published, nothing is acked and the
// session is torn down: the broker redelivers every unacked message on the
// next connection, and the dedupe makes the redelivery harmless. The same
// holds for a lost connection or a killed process at any instruction: before
// COMMIT, the message is redelivered and processed; after COMMIT, it is
// redelivered and found to be a duplicate.
//
// Shutdown (ctx done): the consumer is cancelled, deliveries already
// received are finished and acked, and Run returns, all within
// SHUTDOWN_TIMEOUT; what is not finished by then is left unacked and is
// redelivered to another worker.
package worker
