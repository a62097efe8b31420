// Package redissentinel starts a private Sentinel-managed Redis on loopback
// ports with the machine's own redis-server, for tests and the chaos suite
// to fail its master over: the master SIGKILLed, the replica promoted by
// the sentinels, the old master restarted and turned into the new one's
// replica by them.
//
// A Setup is two redis-servers, a master and a replica of it (replicaof),
// and three sentinels that monitor the master under MasterName with a
// quorum of 2, each a separate process on a free 127.0.0.1 port with its
// configuration, log and working directory in a temporary directory. The
// servers keep nothing on disk (save "", appendonly no): a killed server
// comes back empty, as a cache node without persistence does, and whatever
// its replica had not received when it died is gone. That is the failover
// the fast path must survive: the promoted replica may lack the last
// entries, which costs Postgres lookups and nothing else.
//
// Failures are detected and failed over by the sentinels themselves, not
// by this package: down-after-milliseconds is 1 s and failover-timeout 3 s
// (the defaults are 30 s and 3 min), so a failover takes seconds. Restart
// starts a killed server again on its configuration file as Redis and the
// sentinels last rewrote it: an old master comes back as a master, empty,
// and the sentinels turn it into a replica of the new master once they have
// seen it up for 8 s (Sentinel's own wait); it then takes a full copy
// (diskless, with no delay: repl-diskless-sync-delay 0).
//
// The servers and sentinels each run in a process group of their own, so
// that Kill and Close also stop what a server forked (the child that
// streams a full copy to a replica: a crashed machine takes it along), and
// with a parent-death signal, so a test binary that dies without Close
// takes them with it. Close kills every process and removes the directory.
//
// It is for tests only: no product package imports it
// (pkg/internal/app/layers_test.go checks).
package redissentinel
