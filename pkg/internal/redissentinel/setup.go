package redissentinel

import (
	"context"
	"errors"
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

	"github.com/idempotent-events/idempotent-events/pkg/internal/servicetest"
)

// MasterName is the name the sentinels monitor the master under, the
// master_name of URL.
const MasterName = "ie-master"

// The sentinels' settings. A quorum of 2 of the 3 sentinels declares the
// master down; the failover needs a majority of them (2) to elect the one
// that runs it.
const (
	Quorum          = 2
	DownAfter       = time.Second
	FailoverTimeout = 3 * time.Second
)

// ErrNotInstalled is returned by Start on a machine without redis-server.
var ErrNotInstalled = errors.New("redis-server is not installed")

// Setup is a running private Redis master, its replica and three sentinels.
type Setup struct {
	bin string
	dir string
	// servers are the two redis-servers: 0 is the first master, 1 its
	// replica; a failover swaps the roles, not the indexes.
	servers   []*process
	sentinels []*process
	closeOnce sync.Once
}

// process is one redis-server, serving data or running as a sentinel.
type process struct {
	name string // server-1, sentinel-2, …
	port int
	dir  string
	args []string // the configuration file, and --sentinel

	mu     sync.Mutex
	cmd    *exec.Cmd // nil while it is down
	exited chan struct{}
}

func (p *process) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)) }

// Start starts the master and its replica, then the sentinels, and returns
// once the replica streams from the master and every sentinel knows the
// master, the replica and the two other sentinels: from then on a kill of
// the master is failed over. The caller must Close it.
func Start(ctx context.Context) (s *Setup, err error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, ErrNotInstalled
	}
	s = &Setup{bin: bin}
	if s.dir, err = os.MkdirTemp("", "ie-redissentinel-"); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			s.Close()
			s = nil
		}
	}()
	ports, err := servicetest.FreePorts(5)
	if err != nil {
		return s, err
	}
	for i := range 2 {
		p, err := s.newProcess(fmt.Sprintf("server-%d", i+1), ports[i])
		if err != nil {
			return s, err
		}
		conf := serverConfig(p)
		if i == 1 {
			conf += fmt.Sprintf("replicaof 127.0.0.1 %d\n", ports[0])
		}
		if err := os.WriteFile(p.args[0], []byte(conf), 0o600); err != nil {
			return s, err
		}
		s.servers = append(s.servers, p)
	}
	for i := range 3 {
		p, err := s.newProcess(fmt.Sprintf("sentinel-%d", i+1), ports[2+i])
		if err != nil {
			return s, err
		}
		p.args = append(p.args, "--sentinel")
		if err := os.WriteFile(p.args[0], []byte(sentinelConfig(p, ports[0])), 0o600); err != nil {
			return s, err
		}
		s.sentinels = append(s.sentinels, p)
	}

	for _, p := range s.servers {
		if err := s.run(ctx, p); err != nil {
			return s, err
		}
	}
	first := func(context.Context) (string, error) { return s.Addr(0), nil }
	if err := s.awaitReplica(ctx, 1, first); err != nil {
		return s, fmt.Errorf("%w\n%s", err, s.Logs(10))
	}
	for _, p := range s.sentinels {
		if err := s.run(ctx, p); err != nil {
			return s, err
		}
	}
	for _, p := range s.sentinels {
		if err := s.awaitSentinel(ctx, p); err != nil {
			return s, fmt.Errorf("%w\n%s", err, s.Logs(10))
		}
	}
	return s, nil
}

func (s *Setup) newProcess(name string, port int) (*process, error) {
	dir := filepath.Join(s.dir, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	return &process{name: name, port: port, dir: dir, args: []string{filepath.Join(dir, name+".conf")}}, nil
}

// serverConfig is a redis-server's configuration file: loopback, no
// persistence, and a full copy to a replica streamed at once (the 7.0
// default waits 5 s for more replicas to share it). Redis and the
// sentinels rewrite the file (CONFIG REWRITE) when they change the
// server's replicaof, so that a restart keeps what they decided.
func serverConfig(p *process) string {
	return fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nlogfile %s\nsave \"\"\nappendonly no\n"+
		"repl-diskless-sync yes\nrepl-diskless-sync-delay 0\n",
		p.port, p.dir, filepath.Join(p.dir, p.name+".log"))
}

// sentinelConfig is a sentinel's configuration file, which it rewrites
// with what it learns (its id, the replicas, the other sentinels, the
// current master).
func sentinelConfig(p *process, masterPort int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "port %d\nbind 127.0.0.1\ndir %s\nlogfile %s\n", p.port, p.dir, filepath.Join(p.dir, p.name+".log"))
	fmt.Fprintf(&b, "sentinel monitor %s 127.0.0.1 %d %d\n", MasterName, masterPort, Quorum)
	fmt.Fprintf(&b, "sentinel down-after-milliseconds %s %d\n", MasterName, DownAfter.Milliseconds())
	fmt.Fprintf(&b, "sentinel failover-timeout %s %d\n", MasterName, FailoverTimeout.Milliseconds())
	fmt.Fprintf(&b, "sentinel parallel-syncs %s 1\n", MasterName)
	return b.String()
}

// run starts p and waits until it answers PING.
func (s *Setup) run(ctx context.Context, p *process) error {
	p.mu.Lock()
	if p.cmd != nil {
		p.mu.Unlock()
		return fmt.Errorf("%s is already running", p.name)
	}
	out, err := os.OpenFile(filepath.Join(p.dir, "console.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		p.mu.Unlock()
		return err
	}
	cmd := exec.Command(s.bin, p.args...)
	cmd.Dir = p.dir
	cmd.Stdout, cmd.Stderr = out, out
	// Its own process group, for Kill and Close; and a test binary that
	// dies without Close takes it along.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		p.mu.Unlock()
		out.Close()
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		out.Close()
		close(exited)
	}()
	p.cmd, p.exited = cmd, exited
	p.mu.Unlock()

	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var d net.Dialer
	for {
		// A plain connect first: go-redis logs every failed dial.
		conn, err := d.DialContext(wctx, "tcp", p.addr())
		if err == nil {
			conn.Close()
			var reply any
			if reply, err = call(wctx, p.addr(), "PING"); err == nil {
				if reply == "PONG" {
					return nil
				}
				err = fmt.Errorf("PING answered %v", reply)
			}
		}
		select {
		case <-exited:
			return fmt.Errorf("%s exited while starting; its log:\n%s", p.name, p.logTail(20))
		case <-wctx.Done():
			return fmt.Errorf("%s does not answer PING: %w (%w)", p.name, wctx.Err(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Kill SIGKILLs server i's process group, and waits until it has exited.
func (s *Setup) Kill(i int) error {
	p := s.servers[i]
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return fmt.Errorf("kill %s: not running", p.name)
	}
	if err := syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill %s: %w", p.name, err)
	}
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		return fmt.Errorf("kill %s: it did not exit within 30s of its SIGKILL", p.name)
	}
	p.cmd = nil
	return nil
}

// Restart starts server i again after Kill, on its configuration file as
// Redis and the sentinels last rewrote it, and returns once it answers
// PING. It comes back empty; an old master comes back as a master, until
// the sentinels make it a replica of the new one (AwaitReplica).
func (s *Setup) Restart(ctx context.Context, i int) error {
	return s.run(ctx, s.servers[i])
}

// Running reports whether server i's process is up.
func (s *Setup) Running(i int) bool {
	p := s.servers[i]
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd != nil
}

// Pids are the process ids of every server and sentinel that runs.
func (s *Setup) Pids() []int {
	var pids []int
	for _, p := range s.processes() {
		p.mu.Lock()
		if p.cmd != nil {
			pids = append(pids, p.cmd.Process.Pid)
		}
		p.mu.Unlock()
	}
	return pids
}

func (s *Setup) processes() []*process {
	return append(append([]*process{}, s.servers...), s.sentinels...)
}

// Dir is the temporary directory that holds every process's files.
func (s *Setup) Dir() string { return s.dir }

// Close kills every server and sentinel and removes the directory. It is
// safe to call twice, and from another goroutine than the test's.
func (s *Setup) Close() {
	s.closeOnce.Do(func() {
		for _, p := range s.processes() {
			p.mu.Lock()
			if p.cmd != nil {
				_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
				select {
				case <-p.exited:
				case <-time.After(30 * time.Second):
				}
				p.cmd = nil
			}
			p.mu.Unlock()
		}
		if s.dir != "" {
			_ = os.RemoveAll(s.dir)
		}
	})
}

// Logs returns the last lines of every server's and sentinel's log, for a
// failure's message.
func (s *Setup) Logs(lines int) string {
	var b strings.Builder
	for _, p := range s.processes() {
		fmt.Fprintf(&b, "--- %s (%s)\n%s\n", p.name, p.addr(), p.logTail(lines))
	}
	return b.String()
}

func (p *process) logTail(lines int) string {
	var all []string
	for _, f := range []string{"console.log", p.name + ".log"} {
		b, _ := os.ReadFile(filepath.Join(p.dir, f))
		if s := strings.TrimRight(string(b), "\n"); s != "" {
			all = append(all, strings.Split(s, "\n")...)
		}
	}
	return strings.Join(all[max(len(all)-lines, 0):], "\n")
}
