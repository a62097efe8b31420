// Package broker owns everything idempotent-events does with RabbitMQ: the
// topology, the connection supervisor and the confirming publisher.
//
// Failure handling, in the order things go wrong:
//
//   - Connections are dialed and redialed by Supervise, with jittered
//     exponential backoff. Each connection is handed to a serve function for
//     its whole life; when it dies, everything that belonged to it (channels,
//     delivery tags, unconfirmed publishes) dies with it. Nothing is carried
//     over: a delivery that was not acked before the connection died will be
//     redelivered, and the worker's dedupe makes that harmless.
//   - Topology is declared on every connection, idempotently, so a broker that
//     lost its definitions (or a fresh vhost) is repaired by any receiver or
//     worker that connects.
//   - Publish is persistent and mandatory, on a channel in confirm mode. It
//     returns nil only after the broker acked the message and did not return
//     it as unroutable. The broker sends basic.return before the basic.ack of
//     the same message; one dispatcher goroutine reads returns and confirms
//     from unbuffered channels, so a return is always recorded before the ack
//     it precedes is looked at. A nack, a return, a closed channel, a
//     flow-controlled connection or a timeout is an error: the caller must not
//     claim the message was accepted.
package broker
