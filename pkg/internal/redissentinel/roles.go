package redissentinel

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idempotent-events/idempotent-events/pkg/internal/backoff"
)

// URL is REDIS_URL in go-redis's failover form: the first sentinel as the
// host, the others as addr parameters, and master_name. A client of it asks
// the sentinels where the master is and follows a failover.
func (s *Setup) URL() string {
	u := "redis://" + s.sentinels[0].addr() + "?master_name=" + MasterName
	for _, p := range s.sentinels[1:] {
		u += "&addr=" + p.addr()
	}
	return u
}

// Addr is server i's address, 127.0.0.1:port.
func (s *Setup) Addr(i int) string { return s.servers[i].addr() }

// SentinelAddrs are the sentinels' addresses.
func (s *Setup) SentinelAddrs() []string {
	addrs := make([]string, len(s.sentinels))
	for i, p := range s.sentinels {
		addrs[i] = p.addr()
	}
	return addrs
}

// Server is the index of the server at addr, -1 if none is.
func (s *Setup) Server(addr string) int {
	for i, p := range s.servers {
		if p.addr() == addr {
			return i
		}
	}
	return -1
}

// Master asks the sentinels in turn which address the master has, and
// returns the first answer. During a failover they may disagree for a
// moment; AwaitFailover waits until they do not.
func (s *Setup) Master(ctx context.Context) (string, error) {
	var errs []error
	for _, p := range s.sentinels {
		addr, err := masterOf(ctx, p)
		if err == nil {
			return addr, nil
		}
		errs = append(errs, err)
	}
	return "", fmt.Errorf("no sentinel names the master: %w", errors.Join(errs...))
}

func masterOf(ctx context.Context, p *process) (string, error) {
	reply, err := call(ctx, p.addr(), "SENTINEL", "GET-MASTER-ADDR-BY-NAME", MasterName)
	if err != nil {
		return "", fmt.Errorf("%s: %w", p.name, err)
	}
	a, ok := reply.([]any)
	if !ok || len(a) != 2 {
		return "", fmt.Errorf("%s: GET-MASTER-ADDR-BY-NAME answered %v", p.name, reply)
	}
	return net.JoinHostPort(fmt.Sprint(a[0]), fmt.Sprint(a[1])), nil
}

// KillMaster SIGKILLs the server the sentinels name as master (Kill) and
// returns its index.
func (s *Setup) KillMaster(ctx context.Context) (int, error) {
	addr, err := s.Master(ctx)
	if err != nil {
		return -1, err
	}
	i := s.Server(addr)
	if i < 0 {
		return -1, fmt.Errorf("the sentinels name %s as master, which is none of the servers", addr)
	}
	return i, s.Kill(i)
}

// Keys is the number of keys server i holds (DBSIZE).
func (s *Setup) Keys(ctx context.Context, i int) (int64, error) {
	reply, err := call(ctx, s.servers[i].addr(), "DBSIZE")
	if err != nil {
		return 0, fmt.Errorf("%s: DBSIZE: %w", s.servers[i].name, err)
	}
	n, ok := reply.(int64)
	if !ok {
		return 0, fmt.Errorf("%s: DBSIZE answered %v", s.servers[i].name, reply)
	}
	return n, nil
}

// Role is what a server says of itself (ROLE).
type Role struct {
	// Role is master, or slave (Redis' word) for a replica.
	Role string
	// Offset is a master's replication offset, or the offset a replica
	// has received up to (-1 before its first full copy).
	Offset int64
	// Master is a replica's master, host:port.
	Master string
	// State is a replica's link to its master: connect, connecting,
	// sync, connected.
	State string
	// Replicas are a master's replicas and the offset each last
	// acknowledged (they acknowledge every second).
	Replicas map[string]int64
}

// Role asks server i for its role.
func (s *Setup) Role(ctx context.Context, i int) (Role, error) {
	reply, err := call(ctx, s.servers[i].addr(), "ROLE")
	if err != nil {
		return Role{}, fmt.Errorf("%s: ROLE: %w", s.servers[i].name, err)
	}
	r, err := parseRole(reply)
	if err != nil {
		return Role{}, fmt.Errorf("%s: ROLE: %w", s.servers[i].name, err)
	}
	return r, nil
}

// parseRole reads ROLE's answer: ["master", offset, [[ip, port, offset],
// …]] or ["slave", ip, port, state, offset].
func parseRole(reply any) (Role, error) {
	a, _ := reply.([]any)
	if len(a) == 0 {
		return Role{}, fmt.Errorf("answer %v", reply)
	}
	r := Role{Role: fmt.Sprint(a[0])}
	switch {
	case r.Role == "master" && len(a) == 3:
		r.Offset = toInt(a[1])
		r.Replicas = map[string]int64{}
		replicas, _ := a[2].([]any)
		for _, x := range replicas {
			if f, _ := x.([]any); len(f) == 3 {
				r.Replicas[net.JoinHostPort(fmt.Sprint(f[0]), fmt.Sprint(f[1]))] = toInt(f[2])
			}
		}
	case r.Role == "slave" && len(a) == 5:
		r.Master = net.JoinHostPort(fmt.Sprint(a[1]), fmt.Sprint(a[2]))
		r.State = fmt.Sprint(a[3])
		r.Offset = toInt(a[4])
	default:
		return Role{}, fmt.Errorf("answer %v", reply)
	}
	return r, nil
}

// toInt reads an integer that ROLE sends as an integer or as a string.
func toInt(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case string:
		n, err := strconv.ParseInt(x, 10, 64)
		if err == nil {
			return n
		}
	}
	return -1
}

// AwaitReplica waits until server i is a replica of the master the
// sentinels name, its link up, and has received the master's stream up to
// the offset the master had when the link was first seen up. It is how a
// restarted server has rejoined: the sentinels made it a replica of the new
// master, and it has caught up.
func (s *Setup) AwaitReplica(ctx context.Context, i int) error {
	return s.awaitReplica(ctx, i, func(ctx context.Context) (string, error) {
		master, err := s.Master(ctx)
		if err != nil {
			return "", err
		}
		if j := s.Server(master); j < 0 || j == i {
			return "", fmt.Errorf("the sentinels name %s as master", master)
		}
		return master, nil
	})
}

// AwaitPair waits until the two servers are a master and its replica
// again: the master the sentinels name, and the other server a connected
// replica of it that has received the master's stream up to the offset the
// master had when the pair was first seen. Unlike AwaitReplica it allows a
// further failover on the way (on a loaded machine the sentinels may find
// the new master down for a second while it streams a full copy to the
// restarted server, and promote that one): it returns the master it found.
func (s *Setup) AwaitPair(ctx context.Context) (string, error) {
	var master string
	var target int64 = -1
	for {
		err := func() error {
			m, err := s.Master(ctx)
			if err != nil {
				return err
			}
			j := s.Server(m)
			if j < 0 {
				return fmt.Errorf("the sentinels name %s, not one of the servers", m)
			}
			if m != master {
				master, target = m, -1 // a failover: the pair starts anew
			}
			r, err := s.Role(ctx, 1-j)
			if err != nil {
				return err
			}
			if r.Role != "slave" || r.Master != m || r.State != "connected" {
				return fmt.Errorf("%s is a %s (master %q, link %q), not a connected replica of %s", s.servers[1-j].name, r.Role, r.Master, r.State, m)
			}
			mr, err := s.Role(ctx, j)
			if err != nil {
				return err
			}
			if target < 0 {
				target = mr.Offset
			}
			if r.Offset < target {
				return fmt.Errorf("%s is at offset %d of %d", s.servers[1-j].name, r.Offset, target)
			}
			return nil
		}()
		if err == nil {
			return master, nil
		}
		if !backoff.Sleep(ctx, 100*time.Millisecond) {
			return "", fmt.Errorf("await a master and its replica: %w (%w)", ctx.Err(), err)
		}
	}
}

// awaitReplica is AwaitReplica with the master named by masterAddr.
func (s *Setup) awaitReplica(ctx context.Context, i int, masterAddr func(context.Context) (string, error)) error {
	var target int64 = -1
	for {
		err := func() error {
			master, err := masterAddr(ctx)
			if err != nil {
				return err
			}
			r, err := s.Role(ctx, i)
			if err != nil {
				return err
			}
			if r.Role != "slave" || r.Master != master || r.State != "connected" {
				return fmt.Errorf("%s is a %s (master %q, link %q), not a connected replica of %s", s.servers[i].name, r.Role, r.Master, r.State, master)
			}
			m, err := s.Role(ctx, s.Server(master))
			if err != nil {
				return err
			}
			if target < 0 {
				target = m.Offset
			}
			if r.Offset < target {
				return fmt.Errorf("%s is at offset %d of %d", s.servers[i].name, r.Offset, target)
			}
			return nil
		}()
		if err == nil {
			return nil
		}
		if !backoff.Sleep(ctx, 100*time.Millisecond) {
			return fmt.Errorf("await %s as a replica: %w (%w)", s.servers[i].name, ctx.Err(), err)
		}
	}
}

// AwaitFailover waits until every sentinel names a master other than old
// (host:port), the same, and that server answers ROLE as a master; it
// returns its address. From then on a client that asks any sentinel is
// sent to a master that takes writes (a client that holds connections, or
// a pool that gave up dialling, may take a moment longer to follow).
func (s *Setup) AwaitFailover(ctx context.Context, old string) (string, error) {
	for {
		addr, err := func() (string, error) {
			var named string
			for _, p := range s.sentinels {
				addr, err := masterOf(ctx, p)
				switch {
				case err != nil:
					return "", err
				case addr == old:
					return "", fmt.Errorf("%s still names %s", p.name, old)
				case named != "" && addr != named:
					return "", fmt.Errorf("the sentinels name %s and %s", named, addr)
				}
				named = addr
			}
			i := s.Server(named)
			if i < 0 {
				return "", fmt.Errorf("the sentinels name %s, which is none of the servers", named)
			}
			r, err := s.Role(ctx, i)
			if err != nil {
				return "", err
			}
			if r.Role != "master" {
				return "", fmt.Errorf("%s, named master, is a %s", named, r.Role)
			}
			return named, nil
		}()
		if err == nil {
			return addr, nil
		}
		if !backoff.Sleep(ctx, 50*time.Millisecond) {
			return "", fmt.Errorf("await a failover from %s: %w (%w)", old, ctx.Err(), err)
		}
	}
}

// awaitSentinel waits until sentinel p knows the master, sees the replica
// up, and knows the other sentinels (they find each other through the
// master, every 2 s): without the others it could not reach the quorum,
// nor be elected to fail over.
func (s *Setup) awaitSentinel(ctx context.Context, p *process) error {
	for {
		err := func() error {
			master, err := masterOf(ctx, p)
			if err != nil {
				return err
			}
			if master != s.Addr(0) {
				return fmt.Errorf("%s names %s as master", p.name, master)
			}
			replicas, err := call(ctx, p.addr(), "SENTINEL", "REPLICAS", MasterName)
			if err != nil {
				return err
			}
			if up := instancesUp(replicas); len(up) != 1 || up[0] != s.Addr(1) {
				return fmt.Errorf("%s sees the replicas %v up", p.name, up)
			}
			sentinels, err := call(ctx, p.addr(), "SENTINEL", "SENTINELS", MasterName)
			if err != nil {
				return err
			}
			if up := instancesUp(sentinels); len(up) != len(s.sentinels)-1 {
				return fmt.Errorf("%s knows the sentinels %v", p.name, up)
			}
			return nil
		}()
		if err == nil {
			return nil
		}
		if !backoff.Sleep(ctx, 100*time.Millisecond) {
			return fmt.Errorf("await %s: %w (%w)", p.name, ctx.Err(), err)
		}
	}
}

// instancesUp reads SENTINEL REPLICAS or SENTINELS: a list of flat
// field-value lists. It returns the addresses of the instances whose flags
// say neither down nor disconnected.
func instancesUp(reply any) []string {
	var up []string
	list, _ := reply.([]any)
	for _, x := range list {
		fields, _ := x.([]any)
		m := map[string]string{}
		for k := 0; k+1 < len(fields); k += 2 {
			m[fmt.Sprint(fields[k])] = fmt.Sprint(fields[k+1])
		}
		if strings.Contains(m["flags"], "down") || strings.Contains(m["flags"], "disconnected") {
			continue
		}
		up = append(up, net.JoinHostPort(m["ip"], m["port"]))
	}
	return up
}

// call sends one command to addr on a connection of its own, in RESP2 (the
// replies above are parsed in its shapes). A client per call keeps no pool
// that goes on dialling a server after its kill.
func call(ctx context.Context, addr string, args ...any) (any, error) {
	c := redis.NewClient(&redis.Options{Addr: addr, Protocol: 2, DisableIdentity: true,
		DialTimeout: time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: time.Second, ContextTimeoutEnabled: true,
		MaxRetries: -1, DialerRetries: 1, PoolSize: 1})
	defer c.Close()
	return c.Do(ctx, args...).Result()
}
