package pgcluster

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/idempotent-events/idempotent-events/pkg/internal/faulttest"
)

// Node is one PostgreSQL server of the cluster. Its port stays the same
// through kills and rebuilds, so the multi-host URL does too.
type Node struct {
	// Name is the node's name: its replication slot and application_name.
	Name string
	// Port is the port it listens on, on 127.0.0.1.
	Port int

	c       *Cluster
	dataDir string
	logPath string
	// repl is the node's replication link: standbys stream from the node
	// through it.
	repl *faulttest.Proxy

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

func (n *Node) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(n.Port)) }

func (n *Node) slot() string { return n.Name }

// URL is a DATABASE_URL for database db on this node alone.
func (n *Node) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable", n.addr(), db)
}

// Running reports whether the node's postmaster is running.
func (n *Node) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return false
	}
	select {
	case <-n.exited:
		return false
	default:
		return true
	}
}

// Log returns the last lines of the node's server log.
func (n *Node) Log(lines int) string {
	b, err := os.ReadFile(n.logPath)
	if err != nil {
		return err.Error()
	}
	all := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

// command is bin of the cluster's binaries with args, run as the nodes'
// user in the cluster's directory.
func (c *Cluster) command(bin string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(c.opts.binDir(), bin), args...)
	cmd.Dir = c.dir
	// No PG* variable of the caller's, and a HOME the nodes' user can read
	// (libpq looks for ~/.pgpass).
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + c.dir, "LC_ALL=C"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	return cmd
}

// run runs bin to completion and returns what it printed.
func (c *Cluster) run(ctx context.Context, bin string, args ...string) ([]byte, error) {
	cmd := c.command(bin, args...)
	// Its own process group, so a timeout stops what it forked too
	// (pg_basebackup streams WAL from a child).
	cmd.SysProcAttr.Setpgid = true
	var out []byte
	var err error
	finished := make(chan struct{})
	go func() { out, err = cmd.CombinedOutput(); close(finished) }()
	select {
	case <-finished:
		return out, err
	case <-ctx.Done():
		if cmd.Process != nil {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
		<-finished
		return out, fmt.Errorf("%s: %w", bin, ctx.Err())
	}
}

// start starts the node's postmaster on its data directory and waits
// until it accepts connections (a standby accepts read-only ones).
func (n *Node) start(ctx context.Context) error {
	logf, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close() // the child has its own descriptor
	// The postmaster stays in the caller's process group: a Ctrl-C of the
	// test or chaos run reaches it too, and it shuts down fast.
	cmd := n.c.command("postgres", "-D", n.dataDir, "-p", strconv.Itoa(n.Port))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", n.Name, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	n.mu.Lock()
	n.cmd, n.exited = cmd, exited
	n.mu.Unlock()

	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		conn, err := n.connect(ctx, "postgres")
		if err == nil {
			_ = conn.Close(ctx)
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("start %s: %w\n%s", n.Name, errStopped, n.Log(20))
		case <-ctx.Done():
			return fmt.Errorf("start %s: not accepting connections: %w (last: %w)", n.Name, ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Kill crashes the node as a machine dies. The crash is the moment its
// replication link is cut: nothing the node sent that a standby had not
// read yet, and nothing it sends later, reaches a standby. Then the
// postmaster is stopped (SIGSTOP: it forks nothing more), and its children
// and it are SIGKILLed; until they are, clients connected to the node
// itself are still answered, as across a partition. It returns once every
// process of the node is gone.
func (n *Node) Kill() {
	n.mu.Lock()
	cmd, exited := n.cmd, n.exited
	n.mu.Unlock()
	if cmd == nil {
		return
	}
	n.repl.SetDown(true)
	pm := cmd.Process.Pid
	_ = syscall.Kill(pm, syscall.SIGSTOP)
	// Backends make themselves process group leaders (so the postmaster
	// can signal each one's group): a signal to the postmaster's group
	// would miss them. They are its children.
	children := childrenOf(pm)
	for _, pid := range children {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	_ = syscall.Kill(pm, syscall.SIGKILL)
	<-exited
	// The children are init's to reap now; wait until they are gone, so
	// nothing of the node outlives Kill.
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range children {
		for alive(pid) && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// stop shuts the node down fast (SIGINT), or kills it after timeout.
func (n *Node) stop(timeout time.Duration) {
	n.mu.Lock()
	cmd, exited := n.cmd, n.exited
	n.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-exited:
		return
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-exited:
	case <-time.After(timeout):
		n.Kill()
	}
}

// childrenOf lists the processes whose parent is pid (single-threaded, as
// the postmaster is): from /proc/pid/task/pid/children in one read, or, on
// a kernel without it, by reading every process's stat.
func childrenOf(pid int) []int {
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid)); err == nil {
		var out []int
		for _, f := range strings.Fields(string(b)) {
			if child, err := strconv.Atoi(f); err == nil {
				out = append(out, child)
			}
		}
		return out
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid …; comm may hold spaces and parentheses.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		fields := strings.Fields(s[i+1:])
		if len(fields) > 1 && fields[1] == strconv.Itoa(pid) {
			out = append(out, child)
		}
	}
	return out
}

// alive reports whether process pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && !strings.HasPrefix(strings.TrimSpace(s[i+1:]), "Z")
}
