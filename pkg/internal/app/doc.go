// Package app is the composition root of the idempotent-events binaries:
// it turns a configuration into running parts, and it is the only package
// that imports them all. Every binary does the same around its work (main.go):
// parse its one optional argument, load and validate the configuration
// (exit 2 naming the variable), build the logger, turn SIGINT and SIGTERM
// into context cancellation, run, and exit once.
//
// Receiver, Worker and Migrate are the binaries' entry points, reached from
// cmd/ through the public package pkg/service. RunReceiver and RunWorker run
// the same wiring in-process for tests.
//
// Each run function opens its parts in order and releases each with a
// deferred call as soon as it is open, so a failure half-way through closes
// what was opened before it (listeners, pools, clients) and leaks nothing.
// Parts that run until shutdown are started together and joined before the
// function returns: no goroutine outlives it.
package app
