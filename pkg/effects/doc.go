// Package effects is how a team's own business logic gets the same
// exactly-once guarantee as the ledger: a handler registered here runs
// inside the Postgres transaction that writes the event's ledger row.
//
// # The contract
//
//   - A handler runs inside the transaction of its event's ledger row, and
//     writes through the Tx it is given. Its writes commit together with the
//     ledger row, or not at all.
//   - Its effect is committed at most once per event: an event whose ledger
//     row exists is a duplicate, and no handler runs for it again.
//   - It is retried until it commits: a redelivery, a retry tier or an
//     operator's replay runs it again, in a new transaction, until one
//     commits or the event is dead-lettered. So a handler must be safe to
//     run again after a rollback: everything it did outside the Tx is not
//     rolled back.
//   - Side effects outside the database (an email, a call to another
//     service) go through the Outbox, written in the same transaction and
//     published after COMMIT, never inline: inline, a rollback after the
//     call, or a crash before COMMIT, would repeat it.
//   - Writing through another connection (a pool, a second transaction)
//     breaks all of the above; effectstest.AssertExactlyOnce catches it.
//
// # Results
//
// A handler returns nil when its effect is written. Otherwise:
//
//   - Skip(reason): nothing to do for this event; the ledger row commits
//     with outcome skipped (writes made before the Skip commit too).
//   - Permanent(err): no retry can help; the event goes to the DLQ at once
//     (reason rejected_by_handler). An operator can replay it after a fix.
//   - RetryAfter(d, err): try again later, through the retry tier of at
//     least d (the DLQ once the tiers are used up).
//   - any other error: the worker's usual policy (the next retry tier; an
//     unreachable Postgres pauses consumption instead).
//   - a panic: a permanent error; its stack is logged.
//
// Events are processed in batches, all in one transaction: when a handler
// fails, the batch is rolled back and its events are committed one by one,
// so only the failing event is retried or dead-lettered.
//
// # Registering
//
// A Registry maps (source, event type) to handlers, and object transitions
// to transition handlers. Several handlers may take the same event; they
// run in the order they were registered, in the same transaction.
// Handlers that can write many events at once implement BatchHandler.
//
// A worker binary is a Registry and one call:
//
//	reg := payments.Effects() // the built-in payment state (optional)
//	reg.HandleFunc("orders.create", "stripe", "payment_intent.succeeded", createOrder)
//	os.Exit(service.Worker(reg))
package effects
