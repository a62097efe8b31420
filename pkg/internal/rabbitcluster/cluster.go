package rabbitcluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/idempotent-events/idempotent-events/pkg/internal/backoff"
	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
)

// ErrNotInstalled is returned by Start on a machine without rabbitmq-server.
var ErrNotInstalled = errors.New("rabbitmq-server is not installed")

// Cluster is a running private RabbitMQ cluster.
type Cluster struct {
	// VHost, User and Password are the tests' vhost, and a user with every
	// permission on it.
	VHost, User, Password string

	dir   string
	tools tools
	nodes []*node
	// extra adds lines to a node's rabbitmq.conf (Options.Config).
	extra func(i int) string
}

// node is one rabbitmq-server of the cluster.
type node struct {
	name           string // ie-<random>-<i>@localhost
	port, distPort int
	dir            string

	mu     sync.Mutex
	cmd    *exec.Cmd // the rabbitmq-server script; nil while the node is down
	exited chan struct{}
	pid    int // the Erlang VM's OS pid, while the node is up
}

// tools runs the machine's RabbitMQ scripts.
type tools struct {
	dir  string
	home string
	// cred, when set, is the machine's rabbitmq user: the scripts run as it
	// when the tests run as root.
	cred *syscall.Credential
}

func findTools() (tools, error) {
	t := tools{dir: "/usr/lib/rabbitmq/bin", home: os.Getenv("HOME")}
	// Debian's /usr/sbin/rabbitmq-* are wrappers that switch to the rabbitmq
	// user and send the server's output to the machine node's log; the
	// scripts they wrap are used directly.
	if _, err := os.Stat(filepath.Join(t.dir, "rabbitmq-server")); err != nil {
		p, err := exec.LookPath("rabbitmq-server")
		if err != nil {
			return t, ErrNotInstalled
		}
		t.dir = filepath.Dir(p)
	}
	if os.Geteuid() != 0 {
		return t, nil
	}
	u, err := user.Lookup("rabbitmq")
	if err != nil {
		return t, nil
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return t, fmt.Errorf("rabbitmq user: uid %q, gid %q", u.Uid, u.Gid)
	}
	t.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	t.home = u.HomeDir
	return t, nil
}

// Start boots a cluster of n nodes (3 when n is 0) and returns once every
// node runs in it. The caller must Close it.
func Start(ctx context.Context, n int) (c *Cluster, err error) {
	return StartWith(ctx, Options{Nodes: n})
}

// Options configure StartWith.
type Options struct {
	// Nodes is the number of nodes; 3 when 0.
	Nodes int
	// Config, when set, returns lines to add to node i's rabbitmq.conf (a
	// TLS listener, say). Files it names must be readable by the user the
	// nodes run as (the machine's rabbitmq user, when the tests are root).
	Config func(i int) string
}

// StartWith is Start with opts.
func StartWith(ctx context.Context, opts Options) (c *Cluster, err error) {
	n := opts.Nodes
	if n <= 0 {
		n = 3
	}
	t, err := findTools()
	if err != nil {
		return nil, err
	}
	id := randomHex(4)
	c = &Cluster{VHost: "ie", User: "ie", Password: randomHex(12), tools: t, extra: opts.Config}
	if c.dir, err = os.MkdirTemp("", "ie-rabbitcluster-"+id+"-"); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			c.Close()
			c = nil
		}
	}()
	ports, err := servicetest.FreePorts(2 * n)
	if err != nil {
		return c, err
	}
	for i := range n {
		nd := &node{name: fmt.Sprintf("ie-%s-%d@localhost", id, i+1), port: ports[2*i], distPort: ports[2*i+1],
			dir: filepath.Join(c.dir, strconv.Itoa(i+1))}
		c.nodes = append(c.nodes, nd)
		if err := os.MkdirAll(nd.dir, 0o755); err != nil {
			return c, err
		}
		if err := os.WriteFile(filepath.Join(nd.dir, "rabbitmq.conf"), c.config(i), 0o644); err != nil {
			return c, err
		}
	}
	// No plugins (so no management listener), and an empty rabbitmq-env.conf
	// instead of the machine's, which names its own node.
	if err := os.WriteFile(filepath.Join(c.dir, "enabled_plugins"), []byte("[].\n"), 0o644); err != nil {
		return c, err
	}
	if err := os.WriteFile(filepath.Join(c.dir, "rabbitmq-env.conf"), nil, 0o644); err != nil {
		return c, err
	}
	if err := c.chown(); err != nil {
		return c, err
	}

	// The nodes boot at once; then each joins node 1 in turn.
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range c.nodes {
		wg.Go(func() { errs[i] = c.boot(ctx, i) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return c, err
	}
	for i := 1; i < n; i++ {
		for _, args := range [][]string{{"stop_app"}, {"join_cluster", c.nodes[0].name}, {"start_app"}} {
			if _, err := c.Ctl(ctx, i, args...); err != nil {
				return c, fmt.Errorf("join %s to %s: %w", c.nodes[i].name, c.nodes[0].name, err)
			}
		}
	}
	running, err := c.RunningNodes(ctx, 0)
	if err != nil {
		return c, err
	}
	if len(running) != n {
		return c, fmt.Errorf("cluster formed with %d running nodes, want %d: %v", len(running), n, running)
	}
	return c, nil
}

// config is a node's rabbitmq.conf. Node 1 creates the tests' user and
// vhost at its first boot; the others take them when they join. The AMQP
// and distribution ports come from the environment (RABBITMQ_NODE_PORT,
// RABBITMQ_DIST_PORT).
func (c *Cluster) config(i int) []byte {
	first := i == 0
	var b bytes.Buffer
	b.WriteString("loopback_users = none\nlog.file.level = info\nlog.console = false\n")
	// A cluster on a busy 2-core machine: no memory or disk alarm from the
	// machine's own load blocks its publishers.
	b.WriteString("vm_memory_high_watermark.absolute = 2GB\ndisk_free_limit.absolute = 50MB\n")
	if first {
		fmt.Fprintf(&b, "default_user = %s\ndefault_pass = %s\ndefault_vhost = %s\n", c.User, c.Password, c.VHost)
		b.WriteString("default_permissions.configure = .*\ndefault_permissions.read = .*\ndefault_permissions.write = .*\n")
		b.WriteString("default_user_tags.administrator = true\n")
	}
	if c.extra != nil {
		b.WriteString(c.extra(i) + "\n")
	}
	return b.Bytes()
}

// chown gives the directory to the user the nodes run as.
func (c *Cluster) chown() error {
	if c.tools.cred == nil {
		return nil
	}
	return filepath.Walk(c.dir, func(path string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, int(c.tools.cred.Uid), int(c.tools.cred.Gid))
	})
}

// env is the environment of every script the cluster runs: the process's
// own without RabbitMQ's and Erlang's variables, the home holding the
// cookie, and the cluster's rabbitmq-env.conf and plugins.
func (c *Cluster) env() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if name == "HOME" || strings.HasPrefix(name, "RABBITMQ_") || strings.HasPrefix(name, "ERL_") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "HOME="+c.tools.home, "ERL_EPMD_ADDRESS=127.0.0.1",
		"RABBITMQ_CONF_ENV_FILE="+filepath.Join(c.dir, "rabbitmq-env.conf"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(c.dir, "enabled_plugins"))
}

func (c *Cluster) command(ctx context.Context, tool string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(c.tools.dir, tool), args...)
	cmd.Dir = c.dir
	cmd.Env = c.env()
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.tools.cred}
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// boot starts node i's rabbitmq-server and waits until RabbitMQ runs on it.
func (c *Cluster) boot(ctx context.Context, i int) error {
	n := c.nodes[i]
	n.mu.Lock()
	if n.cmd != nil {
		n.mu.Unlock()
		return fmt.Errorf("node %s is already running", n.name)
	}
	cmd := exec.Command(filepath.Join(c.tools.dir, "rabbitmq-server"))
	cmd.Dir = n.dir
	cmd.Env = append(c.env(),
		"RABBITMQ_NODENAME="+n.name,
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_NODE_PORT="+strconv.Itoa(n.port),
		"RABBITMQ_DIST_PORT="+strconv.Itoa(n.distPort),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(n.dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(n.dir, "log"),
		"RABBITMQ_PID_FILE="+filepath.Join(n.dir, "pid"),
		"RABBITMQ_CONFIG_FILE="+filepath.Join(n.dir, "rabbitmq.conf"),
		"RABBITMQ_ADVANCED_CONFIG_FILE="+filepath.Join(n.dir, "advanced.config"),
		// Distribution on loopback only, as the AMQP listener.
		"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}",
		"ERL_CRASH_DUMP_SECONDS=0")
	// Its own process group, for Close; and a test binary that dies
	// without Close stops it (the script stops the VM on SIGTERM).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM, Credential: c.tools.cred}
	out, err := os.OpenFile(filepath.Join(n.dir, "console.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		n.mu.Unlock()
		return err
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		n.mu.Unlock()
		out.Close()
		return fmt.Errorf("start %s: %w", n.name, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		out.Close()
		close(exited)
	}()
	n.cmd, n.exited, n.pid = cmd, exited, 0
	n.mu.Unlock()

	// rabbitmqctl wait returns once the node wrote its pid file and the
	// RabbitMQ application runs; it is cut short if the node exits.
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	go func() {
		select {
		case <-exited:
			cancel()
		case <-wctx.Done():
		}
	}()
	if _, err := c.Ctl(wctx, i, "wait", filepath.Join(n.dir, "pid"), "--timeout", "180"); err != nil {
		select {
		case <-exited:
			err = fmt.Errorf("node exited while booting (%w); its console:\n%s", err, c.ConsoleTail(i, 20))
		default:
		}
		return fmt.Errorf("boot %s: %w", n.name, err)
	}
	pid, err := c.Ctl(ctx, i, "eval", "os:getpid().")
	if err != nil {
		return fmt.Errorf("read the OS pid of %s: %w", n.name, err)
	}
	p, err := strconv.Atoi(strings.Trim(strings.TrimSpace(pid), `"`))
	if err != nil {
		return fmt.Errorf("OS pid of %s: %q", n.name, pid)
	}
	n.mu.Lock()
	n.pid = p
	n.mu.Unlock()
	return nil
}

// Ctl runs rabbitmqctl against node i and returns its output.
func (c *Cluster) Ctl(ctx context.Context, i int, args ...string) (string, error) {
	return c.run(ctx, "rabbitmqctl", i, args...)
}

// Queues runs rabbitmq-queues against node i and returns its output.
func (c *Cluster) Queues(ctx context.Context, i int, args ...string) (string, error) {
	return c.run(ctx, "rabbitmq-queues", i, args...)
}

func (c *Cluster) run(ctx context.Context, tool string, i int, args ...string) (string, error) {
	if _, ok := ctx.Deadline(); !ok {
		// No call of a CLI tool hangs a test: the slowest, start_app of a
		// joining node, takes seconds.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
	}
	var stdout, stderr bytes.Buffer
	cmd := c.command(ctx, tool, append([]string{"-n", c.nodes[i].name}, args...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s -n %s %s: %w: %s", tool, c.nodes[i].name, strings.Join(args, " "), err,
			strings.TrimSpace(stderr.String()+"\n"+stdout.String()))
	}
	return stdout.String(), nil
}

// Size is the number of nodes.
func (c *Cluster) Size() int { return len(c.nodes) }

// Node is node i's Erlang node name.
func (c *Cluster) Node(i int) string { return c.nodes[i].name }

// Port is node i's AMQP port on 127.0.0.1.
func (c *Cluster) Port(i int) int { return c.nodes[i].port }

// NodeURL is the AMQP URL of node i, on the tests' vhost.
func (c *Cluster) NodeURL(i int) string {
	u := url.URL{Scheme: "amqp", User: url.UserPassword(c.User, c.Password),
		Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(c.nodes[i].port)), Path: "/" + c.VHost}
	return u.String()
}

// AMQPURL lists every node's URL, comma-separated, as AMQP_URL takes a
// cluster.
func (c *Cluster) AMQPURL() string {
	urls := make([]string, len(c.nodes))
	for i := range c.nodes {
		urls[i] = c.NodeURL(i)
	}
	return strings.Join(urls, ",")
}

// Running reports whether node i's process is up (Kill stops it, Restart
// starts it again).
func (c *Cluster) Running(i int) bool {
	n := c.nodes[i]
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cmd != nil
}

// Pid is the OS pid of node i's Erlang VM, 0 while it is down.
func (c *Cluster) Pid(i int) int {
	n := c.nodes[i]
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.pid
}

// Kill SIGKILLs node i's Erlang VM, and only it, and waits until its
// rabbitmq-server has exited.
func (c *Cluster) Kill(i int) error {
	n := c.nodes[i]
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil || n.pid == 0 {
		return fmt.Errorf("kill %s: not running", n.name)
	}
	if err := syscall.Kill(n.pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill %s (pid %d): %w", n.name, n.pid, err)
	}
	select {
	case <-n.exited:
	case <-time.After(30 * time.Second):
		return fmt.Errorf("kill %s: its rabbitmq-server did not exit within 30s of the VM's SIGKILL", n.name)
	}
	n.cmd, n.pid = nil, 0
	return nil
}

// Restart boots node i again on its data, after Kill, and returns once
// RabbitMQ runs on it; it rejoins the cluster by itself (AwaitMember says
// when its replica of a quorum queue is back).
func (c *Cluster) Restart(ctx context.Context, i int) error {
	return c.boot(ctx, i)
}

// RunningNodes asks node i which nodes of the cluster are running.
func (c *Cluster) RunningNodes(ctx context.Context, i int) ([]string, error) {
	out, err := c.Ctl(ctx, i, "cluster_status", "--formatter", "json")
	if err != nil {
		return nil, err
	}
	var st struct {
		Running []string `json:"running_nodes"`
	}
	if err := json.Unmarshal([]byte(jsonPart(out)), &st); err != nil {
		return nil, fmt.Errorf("cluster_status: %w: %s", err, out)
	}
	return st.Running, nil
}

// QueueInfo is a queue as the cluster reports it; Leader, Members and
// Online are a quorum queue's.
type QueueInfo struct {
	Name    string
	Leader  string
	Members []string
	Online  []string
}

// Queue asks a running node about queue in the tests' vhost.
func (c *Cluster) Queue(ctx context.Context, queue string) (QueueInfo, error) {
	i := c.someRunning()
	if i < 0 {
		return QueueInfo{}, errors.New("no node is running")
	}
	out, err := c.Ctl(ctx, i, "list_queues", "-p", c.VHost, "name", "leader", "members", "online", "--formatter", "json")
	if err != nil {
		return QueueInfo{}, err
	}
	// A classic queue's leader, members and online are not node names.
	var qs []struct {
		Name                    string
		Leader, Members, Online json.RawMessage
	}
	if err := json.Unmarshal([]byte(jsonPart(out)), &qs); err != nil {
		return QueueInfo{}, fmt.Errorf("list_queues: %w: %s", err, out)
	}
	for _, q := range qs {
		if q.Name == queue {
			info := QueueInfo{Name: q.Name}
			_ = json.Unmarshal(q.Leader, &info.Leader)
			_ = json.Unmarshal(q.Members, &info.Members)
			_ = json.Unmarshal(q.Online, &info.Online)
			return info, nil
		}
	}
	return QueueInfo{}, fmt.Errorf("no queue %s in vhost %s", queue, c.VHost)
}

// LeaderOf returns the node that leads quorum queue queue. While the
// queue is missing, its leader unknown or on a node that is down (an
// election after a kill is under way), it asks again, until ctx is done.
func (c *Cluster) LeaderOf(ctx context.Context, queue string) (int, error) {
	for {
		q, err := c.Queue(ctx, queue)
		if err == nil {
			if i := c.index(q.Leader); i >= 0 && c.Running(i) {
				return i, nil
			}
			err = fmt.Errorf("queue %s: leader %q is not a running node", queue, q.Leader)
		}
		if !backoff.Sleep(ctx, 250*time.Millisecond) {
			return -1, fmt.Errorf("leader of %s: %w (%w)", queue, ctx.Err(), err)
		}
	}
}

// AwaitMember waits until node i's replica of quorum queue queue is a
// follower or the leader, its log caught up with the commit index the
// leader reported when it was first seen online. It is how a restarted
// node has rejoined as far as the queue is concerned.
func (c *Cluster) AwaitMember(ctx context.Context, i int, queue string) error {
	var target int64 = -1
	for {
		st, err := c.QuorumStatus(ctx, queue)
		if err == nil {
			var leader, mine *MemberStatus
			for k := range st {
				switch {
				case st[k].Node == c.nodes[i].name:
					mine = &st[k]
				case st[k].State == "leader":
					leader = &st[k]
				}
			}
			switch {
			case mine == nil:
				err = fmt.Errorf("no member of %s on %s", queue, c.nodes[i].name)
			case mine.State == "leader":
				return nil
			case mine.State != "follower" || leader == nil:
				err = fmt.Errorf("member of %s on %s is %s", queue, c.nodes[i].name, mine.State)
			case target < 0:
				target = leader.CommitIndex
				err = fmt.Errorf("member of %s on %s is at %d, the leader's commit index %d", queue, c.nodes[i].name, mine.CommitIndex, target)
				if mine.CommitIndex >= target {
					return nil
				}
			case mine.CommitIndex >= target:
				return nil
			default:
				err = fmt.Errorf("member of %s on %s is at %d of %d", queue, c.nodes[i].name, mine.CommitIndex, target)
			}
		}
		if !backoff.Sleep(ctx, 250*time.Millisecond) {
			return fmt.Errorf("await the member on %s: %w (%w)", c.nodes[i].name, ctx.Err(), err)
		}
	}
}

// MemberStatus is one replica of a quorum queue, from rabbitmq-queues
// quorum_status.
type MemberStatus struct {
	Node        string
	State       string // leader, follower, candidate, …; noproc when it is not running
	CommitIndex int64
}

// QuorumStatus asks a running node for the replicas of quorum queue queue.
func (c *Cluster) QuorumStatus(ctx context.Context, queue string) ([]MemberStatus, error) {
	i := c.someRunning()
	if i < 0 {
		return nil, errors.New("no node is running")
	}
	out, err := c.Queues(ctx, i, "quorum_status", "-p", c.VHost, queue, "--formatter", "json")
	if err != nil {
		return nil, err
	}
	var rows []map[string]any
	if err := json.Unmarshal([]byte(jsonPart(out)), &rows); err != nil {
		return nil, fmt.Errorf("quorum_status: %w: %s", err, out)
	}
	var st []MemberStatus
	for _, r := range rows {
		m := MemberStatus{Node: fmt.Sprint(r["Node Name"]), State: fmt.Sprint(r["Raft State"]), CommitIndex: -1}
		if v, ok := r["Commit Index"].(float64); ok {
			m.CommitIndex = int64(v)
		}
		st = append(st, m)
	}
	return st, nil
}

// index is the index of the node named name, -1 if none is.
func (c *Cluster) index(name string) int {
	for i, n := range c.nodes {
		if n.name == name {
			return i
		}
	}
	return -1
}

func (c *Cluster) someRunning() int {
	for i := range c.nodes {
		if c.Running(i) && c.Pid(i) != 0 {
			return i
		}
	}
	return -1
}

// ConsoleTail returns the last lines node i wrote to its console.
func (c *Cluster) ConsoleTail(i, lines int) string {
	b, _ := os.ReadFile(filepath.Join(c.nodes[i].dir, "console.log"))
	l := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(l[max(len(l)-lines, 0):], "\n")
}

// Close kills every node and removes the cluster's directory. It is safe
// to call twice.
func (c *Cluster) Close() {
	for _, n := range c.nodes {
		n.mu.Lock()
		if n.cmd != nil {
			// The node's process group: the script, the VM and its helpers.
			_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL)
			select {
			case <-n.exited:
			case <-time.After(30 * time.Second):
			}
			n.cmd, n.pid = nil, 0
		}
		n.mu.Unlock()
	}
	if c.dir != "" {
		_ = os.RemoveAll(c.dir)
	}
}

// jsonPart drops anything the CLI printed before its JSON document.
func jsonPart(out string) string {
	if i := strings.IndexAny(out, "[{"); i > 0 {
		return out[i:]
	}
	return out
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
