// Package pgcluster runs a private PostgreSQL cluster for tests: a primary
// and standbys that stream from it over physical replication slots,
// synchronously (every commit waits until one standby has flushed it:
// synchronous_standby_names = 'ANY 1 (…)', synchronous_commit = on) or
// asynchronously. It is how the tests and the chaos suite fail the ledger
// over the way a clustered Postgres does: SIGKILL the primary, promote a
// standby, rebuild the old primary as a standby of the new one, and reach
// whichever node is primary through one multi-host DATABASE_URL with
// target_session_attrs=read-write.
//
// Every node is the machine's own binaries (initdb, postgres,
// pg_basebackup; PGCLUSTER_BIN or /usr/lib/postgresql/15/bin) on free
// 127.0.0.1 ports, with its data in a temporary directory that Close
// removes, so tests run in parallel and can be re-run. PostgreSQL refuses
// to run as root: when the tests do, the nodes run as the postgres OS user,
// which owns the directories.
//
// How failure is modelled:
//
//   - Kill is a crashed machine. The crash is the moment the node's
//     replication link is cut, so WAL the node had sent but a standby had
//     not yet read is gone with it (without the cut, the kernel would
//     still deliver it after the "crash"); then the postmaster is stopped
//     (so it starts no new backend) and every process of the node and the
//     postmaster are SIGKILLed, within milliseconds.
//   - The replication link is a faulttest proxy in front of each node:
//     standbys stream from the primary through the primary's proxy, which
//     can delay the stream (SetReplicationDelay), a network between
//     machines.
//     Clients connect to the nodes' own ports.
//   - Rejoin rebuilds a dead node as a standby of the current primary with
//     a fresh pg_basebackup, not pg_rewind: a base backup has no
//     precondition (pg_rewind needs wal_log_hints or checksums, the old
//     WAL since the fork, and a clean or recoverable target) and it
//     discards whatever the old primary committed that never reached the
//     new one, as a failover must. The ledgers here are small, so the copy
//     takes seconds.
//   - fsync is off: the faults are process kills, after which the kernel's
//     page cache survives, so fsync would change nothing but the disk load
//     of a shared machine. A node that was killed is always rebuilt from a
//     base backup, never restarted on its old files.
//
// It is for tests only: no product package imports it
// (pkg/internal/app/layers_test.go checks).
package pgcluster
