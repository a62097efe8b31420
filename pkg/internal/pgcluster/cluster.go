package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/faulttest"
)

// DefaultBinDir is where Debian's PostgreSQL 15 keeps its server binaries.
const DefaultBinDir = "/usr/lib/postgresql/15/bin"

// Options configure a cluster.
type Options struct {
	// Standbys is the number of standbys; 0 means 1.
	Standbys int
	// Async streams asynchronously: a commit returns once the primary has
	// it, whether or not a standby does. Otherwise it waits for one
	// standby's flush.
	Async bool
	// BinDir holds initdb, postgres and pg_basebackup; empty means
	// PGCLUSTER_BIN, else DefaultBinDir.
	BinDir string
	// Settings are extra postgresql.conf lines for every node.
	Settings []string
}

// binDir resolves BinDir.
func (o Options) binDir() string {
	switch {
	case o.BinDir != "":
		return o.BinDir
	case os.Getenv("PGCLUSTER_BIN") != "":
		return os.Getenv("PGCLUSTER_BIN")
	}
	return DefaultBinDir
}

// Available reports why a cluster cannot run here (nil if it can): the
// binaries are missing, or the process is root and there is no postgres
// user to run them as.
func Available(opts Options) error {
	for _, b := range []string{"initdb", "postgres", "pg_basebackup"} {
		if _, err := os.Stat(filepath.Join(opts.binDir(), b)); err != nil {
			return fmt.Errorf("PostgreSQL server binaries: %w", err)
		}
	}
	_, err := credential()
	return err
}

// Cluster is a running primary and its standbys.
type Cluster struct {
	opts Options
	dir  string
	cred *syscall.Credential

	mu      sync.Mutex
	nodes   []*Node
	primary *Node
}

// New starts a cluster for t and closes it when t ends, logging the nodes'
// server logs first if t failed. It skips t when the cluster cannot run
// here (Available), unless CI is set: then that fails t.
func New(t testing.TB, opts Options) *Cluster {
	t.Helper()
	if err := Available(opts); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("pgcluster: %v", err)
		}
		t.Skipf("pgcluster: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := Start(ctx, opts)
	require.NoError(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(c.Logs(40))
		}
		c.Close()
	})
	return c
}

// Start initializes and starts a primary, then builds and starts each
// standby from a base backup, and returns once every standby streams.
func Start(ctx context.Context, opts Options) (c *Cluster, err error) {
	if opts.Standbys <= 0 {
		opts.Standbys = 1
	}
	cred, err := credential()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgcluster-")
	if err != nil {
		return nil, err
	}
	c = &Cluster{opts: opts, dir: dir, cred: cred}
	defer func() {
		if err != nil {
			err = fmt.Errorf("%w\n%s", err, c.Logs(20))
			c.Close()
		}
	}()
	if err := c.chown(dir); err != nil {
		return nil, err
	}
	for i := 0; i <= opts.Standbys; i++ {
		n := &Node{Name: fmt.Sprintf("n%d", i), Port: freePort(), c: c}
		n.dataDir = filepath.Join(dir, n.Name)
		n.logPath = filepath.Join(dir, n.Name+".log")
		if n.repl, err = faulttest.Start(net.JoinHostPort("127.0.0.1", strconv.Itoa(n.Port))); err != nil {
			return c, err
		}
		c.nodes = append(c.nodes, n)
	}
	primary := c.nodes[0]
	if err := c.initdb(ctx, primary); err != nil {
		return c, err
	}
	if err := primary.start(ctx); err != nil {
		return c, err
	}
	c.primary = primary
	for _, n := range c.nodes[1:] {
		if err := c.Rejoin(ctx, n); err != nil {
			return c, err
		}
	}
	return c, nil
}

// credential is whom the nodes run as: nil (this process's user) unless
// this process is root, which PostgreSQL refuses; then the postgres user.
func credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root, PostgreSQL needs another user: %w", err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, err
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, err
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func (c *Cluster) chown(path string) error {
	if c.cred == nil {
		return nil
	}
	return os.Chown(path, int(c.cred.Uid), int(c.cred.Gid))
}

// writeFile writes a file the nodes' user owns.
func (c *Cluster) writeFile(path, content string) error {
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		return err
	}
	return c.chown(path)
}

// freePort returns a 127.0.0.1 port that was free a moment ago.
func freePort() int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// initdb creates n's data directory and the configuration every node
// shares (a base backup copies it to the standbys).
func (c *Cluster) initdb(ctx context.Context, n *Node) error {
	if out, err := c.run(ctx, "initdb", "-D", n.dataDir, "-U", "postgres", "--auth=trust", "--no-locale", "-E", "UTF8", "--no-sync"); err != nil {
		return fmt.Errorf("initdb %s: %w\n%s", n.Name, err, out)
	}
	names := make([]string, len(c.nodes))
	for i, m := range c.nodes {
		names[i] = m.Name
	}
	conf := []string{
		"listen_addresses = '127.0.0.1'",
		"unix_socket_directories = ''",
		"max_connections = 200",
		"shared_buffers = 64MB",
		"fsync = off",
		"wal_level = replica",
		"max_wal_senders = 10",
		"max_replication_slots = 10",
		"hot_standby = on",
		"synchronous_commit = on",
		"wal_receiver_status_interval = 1s",
		"log_min_messages = warning",
		"log_line_prefix = '%m [%p] '",
	}
	if !c.opts.Async {
		// Quorum of one among every node: whichever node is primary waits
		// for any one of the others (a node never streams from itself).
		conf = append(conf, fmt.Sprintf("synchronous_standby_names = 'ANY 1 (%s)'", strings.Join(names, ", ")))
	}
	conf = append(conf, c.opts.Settings...)
	f, err := os.OpenFile(filepath.Join(n.dataDir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.WriteString("\n# pgcluster\n" + strings.Join(conf, "\n") + "\n")
	return err
}

// Primary is the node that is primary now.
func (c *Cluster) Primary() *Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.primary
}

// Nodes are every node, in the order of the multi-host URL.
func (c *Cluster) Nodes() []*Node { return c.nodes }

// Standbys are the running nodes that are not the primary.
func (c *Cluster) Standbys() []*Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*Node
	for _, n := range c.nodes {
		if n != c.primary && n.Running() {
			out = append(out, n)
		}
	}
	return out
}

// URL is a DATABASE_URL for database db on every node, in order, with
// target_session_attrs=read-write: a client tries them in turn and keeps
// the one that accepts writes, the primary, wherever it is now.
func (c *Cluster) URL(db string) string {
	hosts := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		hosts[i] = n.addr()
	}
	return (&url.URL{Scheme: "postgres", User: url.User("postgres"), Host: strings.Join(hosts, ","), Path: "/" + db,
		RawQuery: "target_session_attrs=read-write&sslmode=disable"}).String()
}

// SetReplicationDelay delays everything on every replication link by d,
// each way, as a long link between machines would (the stream is not
// slowed: a standby lags by d, and a synchronous commit waits 2d more).
func (c *Cluster) SetReplicationDelay(d time.Duration) {
	for _, n := range c.nodes {
		n.repl.SetDelay(d)
	}
}

// Logs returns the last lines of every node's server log.
func (c *Cluster) Logs(lines int) string {
	var b strings.Builder
	for _, n := range c.nodes {
		fmt.Fprintf(&b, "--- %s (port %d) server log, last lines\n%s\n", n.Name, n.Port, n.Log(lines))
	}
	return b.String()
}

// Close stops every node (fast shutdown, a SIGKILL after 10 s), stops the
// replication proxies and removes the directories. It is safe to call
// twice.
func (c *Cluster) Close() {
	for _, n := range c.nodes {
		n.stop(10 * time.Second)
		n.repl.Close()
	}
	if c.dir != "" {
		_ = os.RemoveAll(c.dir)
	}
}

// Promote makes standby n the primary (pg_promote) and points the other
// running standbys at it. The old primary must be dead: two primaries are
// a split brain no client can resolve.
func (c *Cluster) Promote(ctx context.Context, n *Node) error {
	c.mu.Lock()
	old := c.primary
	c.mu.Unlock()
	if n == old {
		return fmt.Errorf("promote %s: it is the primary", n.Name)
	}
	if old.Running() {
		return fmt.Errorf("promote %s: the primary %s is still running", n.Name, old.Name)
	}
	conn, err := n.connect(ctx, "postgres")
	if err != nil {
		return fmt.Errorf("promote %s: %w", n.Name, err)
	}
	defer func() { _ = conn.Close(ctx) }()
	var promoted bool
	if err := conn.QueryRow(ctx, "SELECT pg_promote(true, 60)").Scan(&promoted); err != nil {
		return fmt.Errorf("promote %s: %w", n.Name, err)
	}
	if !promoted {
		return fmt.Errorf("promote %s: not promoted within 60 s", n.Name)
	}
	c.mu.Lock()
	c.primary = n
	c.mu.Unlock()
	for _, s := range c.Standbys() {
		if err := c.follow(ctx, s); err != nil {
			return err
		}
	}
	return nil
}

// follow points running standby s at the current primary: a slot there,
// and primary_conninfo through its replication link (both reloadable).
func (c *Cluster) follow(ctx context.Context, s *Node) error {
	p := c.Primary()
	if err := p.createSlot(ctx, s.slot()); err != nil {
		return err
	}
	conn, err := s.connect(ctx, "postgres")
	if err != nil {
		return fmt.Errorf("follow %s: %w", p.Name, err)
	}
	defer func() { _ = conn.Close(ctx) }()
	for _, q := range []string{
		"ALTER SYSTEM SET primary_conninfo = " + quote(c.conninfo(s)),
		"ALTER SYSTEM SET primary_slot_name = " + quote(s.slot()),
		"SELECT pg_reload_conf()",
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			return fmt.Errorf("%s follow %s: %s: %w", s.Name, p.Name, q, err)
		}
	}
	return c.WaitStreaming(ctx, s)
}

// conninfo is standby s's primary_conninfo: the current primary through
// its replication link, s's name as the application name
// synchronous_standby_names matches.
func (c *Cluster) conninfo(s *Node) string {
	return fmt.Sprintf("host=127.0.0.1 port=%s user=postgres application_name=%s connect_timeout=2",
		portOf(c.Primary().repl.Addr()), s.Name)
}

func portOf(addr string) string {
	_, port, _ := net.SplitHostPort(addr)
	return port
}

func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// Rejoin rebuilds node n, which must not be running (a killed primary,
// say), as a standby of the current primary: its data directory is
// replaced by a base backup over a replication slot, and it returns once
// n streams (in a synchronous cluster: as a synchronous standby).
// Whatever n had committed that the primary has not is discarded.
func (c *Cluster) Rejoin(ctx context.Context, n *Node) error {
	if n.Running() {
		return fmt.Errorf("rejoin %s: it is running", n.Name)
	}
	p := c.Primary()
	if err := os.RemoveAll(n.dataDir); err != nil {
		return err
	}
	if err := p.createSlot(ctx, n.slot()); err != nil {
		return err
	}
	if out, err := c.run(ctx, "pg_basebackup", "-h", "127.0.0.1", "-p", strconv.Itoa(p.Port), "-U", "postgres",
		"-D", n.dataDir, "-X", "stream", "-S", n.slot(), "--checkpoint=fast", "--no-sync"); err != nil {
		return fmt.Errorf("pg_basebackup of %s for %s: %w\n%s", p.Name, n.Name, err, out)
	}
	// The backup carries the primary's postgresql.auto.conf, which names
	// the primary's own upstream if it was a standby once: replace it.
	auto := fmt.Sprintf("primary_conninfo = %s\nprimary_slot_name = %s\n", quote(c.conninfo(n)), quote(n.slot()))
	if err := c.writeFile(filepath.Join(n.dataDir, "postgresql.auto.conf"), auto); err != nil {
		return err
	}
	if err := c.writeFile(filepath.Join(n.dataDir, "standby.signal"), ""); err != nil {
		return err
	}
	n.repl.SetDown(false)
	if err := n.start(ctx); err != nil {
		return err
	}
	return c.WaitStreaming(ctx, n)
}

// WaitStreaming waits until standby n streams from the primary; in a
// synchronous cluster, until the primary counts it as a synchronous
// standby.
func (c *Cluster) WaitStreaming(ctx context.Context, n *Node) error {
	p := c.Primary()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var last string
	for {
		if !n.Running() {
			return fmt.Errorf("%s stopped before it streamed from %s", n.Name, p.Name)
		}
		state, err := c.replicationState(ctx, p, n)
		if err != nil {
			last = err.Error()
		} else {
			last = state
		}
		if state == "streaming/async" && c.opts.Async || state == "streaming/quorum" || state == "streaming/sync" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s does not stream from %s (last: %q): %w", n.Name, p.Name, last, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// replicationState is "state/sync_state" of standby n in primary p's
// pg_stat_replication, or "" if n is not connected.
func (c *Cluster) replicationState(ctx context.Context, p, n *Node) (string, error) {
	conn, err := p.connect(ctx, "postgres")
	if err != nil {
		return "", err
	}
	defer func() { _ = conn.Close(ctx) }()
	var state string
	err = conn.QueryRow(ctx, `SELECT coalesce(max(state || '/' || sync_state), '') FROM pg_stat_replication
		WHERE application_name = $1`, n.Name).Scan(&state)
	return state, err
}

// Unreplicated returns how many bytes of WAL the primary has flushed that
// no standby has flushed yet: the commits a crash of the primary would
// lose now, unless a synchronous commit is still waiting for them.
func (c *Cluster) Unreplicated(ctx context.Context) (int64, error) {
	conn, err := c.Primary().connect(ctx, "postgres")
	if err != nil {
		return 0, err
	}
	defer func() { _ = conn.Close(ctx) }()
	var lag int64
	err = conn.QueryRow(ctx, `SELECT coalesce(pg_wal_lsn_diff(pg_current_wal_flush_lsn(), max(flush_lsn)), -1)::bigint
		FROM pg_stat_replication`).Scan(&lag)
	return lag, err
}

// connect opens a connection to database db on n itself.
func (n *Node) connect(ctx context.Context, db string) (*pgx.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return pgx.Connect(ctx, n.URL(db))
}

// createSlot creates the physical replication slot name on n, reserving
// WAL from now; an old slot of that name (from a node's previous life) is
// dropped first, once nothing streams from it.
func (n *Node) createSlot(ctx context.Context, name string) error {
	conn, err := n.connect(ctx, "postgres")
	if err != nil {
		return fmt.Errorf("create slot %s on %s: %w", name, n.Name, err)
	}
	defer func() { _ = conn.Close(ctx) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var active *bool
		if err := conn.QueryRow(ctx, "SELECT max(active::int)::bool FROM pg_replication_slots WHERE slot_name = $1", name).Scan(&active); err != nil {
			return fmt.Errorf("read slot %s on %s: %w", name, n.Name, err)
		}
		if active == nil {
			break
		}
		if !*active {
			if _, err := conn.Exec(ctx, "SELECT pg_drop_replication_slot($1)", name); err != nil {
				return fmt.Errorf("drop slot %s on %s: %w", name, n.Name, err)
			}
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("slot %s on %s is still in use", name, n.Name)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_create_physical_replication_slot($1, true)", name); err != nil {
		return fmt.Errorf("create slot %s on %s: %w", name, n.Name, err)
	}
	return nil
}

// errStopped is returned when a node's postmaster exits while awaited.
var errStopped = errors.New("postmaster exited")
