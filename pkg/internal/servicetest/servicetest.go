// Package servicetest gives each test its own slice of the real services on
// 127.0.0.1: a RabbitMQ vhost, a Postgres schema with the migrations
// applied, and a Redis key prefix. Everything is removed in t.Cleanup, so
// tests run in parallel and can be re-run.
//
// The services are found through TEST_AMQP_URL, TEST_DATABASE_URL,
// TEST_REDIS_URL and TEST_RABBITMQ_API (the management API, used to create
// vhosts; without it rabbitmqctl is used), each defaulting to the local
// service.
//
// It is for tests only: no product package imports it
// (pkg/internal/app/layers_test.go checks).
package servicetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/migrate"
)

func env(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// Base URLs of the services.
var (
	AMQPBase    = env("TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
	DatabaseURL = env("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/idempotent_events_test?sslmode=disable")
	RedisURL    = env("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
	RabbitAPI   = env("TEST_RABBITMQ_API", "http://guest:guest@127.0.0.1:15672")
)

// Name returns a short unique name with prefix, safe as a vhost, schema or
// key part.
func Name(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + "_" + hex.EncodeToString(b[:])
}

// VHost creates a RabbitMQ vhost for t and returns an AMQP URL pointing at
// it. The vhost is deleted when t ends.
func VHost(t testing.TB) string {
	t.Helper()
	url, drop, err := NewVHost("ie_test")
	require.NoError(t, err)
	t.Cleanup(drop)
	return url
}

// NewVHost creates a vhost named prefix_<random> with full permissions for
// the AMQP user, through the management API or else rabbitmqctl. It returns
// the AMQP URL of the vhost and a function that deletes it.
func NewVHost(prefix string) (string, func(), error) {
	name := Name(prefix)
	var drop func()
	if err := rabbitAPI(http.MethodPut, "/api/vhosts/"+name, nil); err == nil {
		perm := []byte(`{"configure":".*","write":".*","read":".*"}`)
		if err := rabbitAPI(http.MethodPut, "/api/permissions/"+name+"/"+apiUser(), perm); err != nil {
			return "", nil, fmt.Errorf("set vhost permissions: %w", err)
		}
		drop = func() { _ = rabbitAPI(http.MethodDelete, "/api/vhosts/"+name, nil) }
	} else {
		if out, cerr := exec.Command("rabbitmqctl", "add_vhost", name).CombinedOutput(); cerr != nil {
			return "", nil, fmt.Errorf("create vhost: management API failed (%w) and rabbitmqctl failed: %s", err, out)
		}
		if out, cerr := exec.Command("rabbitmqctl", "set_permissions", "-p", name, apiUser(), ".*", ".*", ".*").CombinedOutput(); cerr != nil {
			return "", nil, fmt.Errorf("set permissions: %s", out)
		}
		drop = func() { _ = exec.Command("rabbitmqctl", "delete_vhost", name).Run() }
	}
	u, err := url.Parse(AMQPBase)
	if err != nil {
		return "", nil, err
	}
	u.Path = "/" + name
	return u.String(), drop, nil
}

func apiUser() string {
	u, err := url.Parse(AMQPBase)
	if err != nil || u.User == nil {
		return "guest"
	}
	return u.User.Username()
}

// apiClient keeps no idle connections, so no goroutine outlives a call.
var apiClient = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

func rabbitAPI(method, path string, body []byte) error {
	u, err := url.Parse(RabbitAPI)
	if err != nil {
		return err
	}
	user := u.User
	u.User = nil
	req, err := http.NewRequest(method, strings.TrimSuffix(u.String(), "/")+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	if user != nil {
		pw, _ := user.Password()
		req.SetBasicAuth(user.Username(), pw)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := apiClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		return fmt.Errorf("%s %s: %s", method, path, resp.Status)
	}
	return nil
}

var ensureDB sync.Once

// Schema creates a Postgres schema for t in the test database, applies the
// migrations to it, and returns a DATABASE_URL whose search_path selects it.
// The schema is dropped when t ends.
func Schema(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dbURL, drop, err := NewSchema(ctx, "t")
	require.NoError(t, err)
	t.Cleanup(drop)
	return dbURL
}

// NewSchema creates a migrated schema prefix_<random> in the test database
// (created if missing). It returns a DATABASE_URL selecting the schema and
// a function that drops it.
func NewSchema(ctx context.Context, prefix string) (string, func(), error) {
	var dbErr error
	ensureDB.Do(func() { _, dbErr = migrate.EnsureDatabase(ctx, DatabaseURL) })
	if dbErr != nil {
		return "", nil, fmt.Errorf("create test database: %w", dbErr)
	}
	name := Name(prefix)
	conn, err := pgx.Connect(ctx, DatabaseURL)
	if err != nil {
		return "", nil, fmt.Errorf("connect to test database: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+name); err != nil {
		return "", nil, err
	}
	drop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if c, err := pgx.Connect(ctx, DatabaseURL); err == nil {
			_, _ = c.Exec(ctx, "DROP SCHEMA "+name+" CASCADE")
			_ = c.Close(ctx)
		}
	}
	dbURL := WithSearchPath(DatabaseURL, name)
	if _, err := migrate.Up(ctx, dbURL, time.Minute); err != nil {
		drop()
		return "", nil, fmt.Errorf("migrate schema %s: %w", name, err)
	}
	return dbURL, drop, nil
}

// Recreate drops the schema dbURL selects (from Schema) with everything in
// it and creates and migrates it again, under the same name: to the ledger
// this is what dropping and recreating the database is.
func Recreate(t testing.TB, dbURL string) {
	t.Helper()
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	name := u.Query().Get("search_path")
	require.NotEmpty(t, name, "not a URL from Schema: %s", dbURL)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, DatabaseURL)
	require.NoError(t, err)
	defer func() { _ = conn.Close(ctx) }()
	_, err = conn.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{name}.Sanitize()+" CASCADE")
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{name}.Sanitize())
	require.NoError(t, err)
	_, err = migrate.Up(ctx, dbURL, time.Minute)
	require.NoError(t, err)
}

// WithSearchPath returns databaseURL with its search_path set to schema.
func WithSearchPath(databaseURL, schema string) string {
	u, err := url.Parse(databaseURL)
	if err != nil {
		panic(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// RedisPrefix returns a key prefix for t; its keys are deleted when t ends.
func RedisPrefix(t testing.TB) string {
	t.Helper()
	prefix := Name("ie_test") + ":"
	t.Cleanup(func() { _ = DeleteKeys(RedisURL, prefix) })
	return prefix
}

// DeleteKeys removes every key starting with prefix: the per-test
// equivalent of FLUSHALL.
func DeleteKeys(redisURL, prefix string) error {
	opts, err := redis.ParseURL(redisURL)
	if err != nil {
		return err
	}
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	iter := rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		return err
	}
	if len(keys) == 0 {
		return nil
	}
	return rdb.Del(ctx, keys...).Err()
}

// Conn opens a pgx connection to databaseURL for assertions, closed when t
// ends.
func Conn(t testing.TB, databaseURL string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, databaseURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// ReplaceHost returns rawURL with its host:port replaced by hostPort, to
// route a client through a faulttest.Proxy.
func ReplaceHost(rawURL, hostPort string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		panic(err)
	}
	u.Host = hostPort
	return u.String()
}

// FreeAddr returns a 127.0.0.1 address with a port that was free a moment
// ago, for a process under test to listen on.
func FreeAddr() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// FreePorts returns n distinct 127.0.0.1 ports that were free a moment
// ago, for the nodes of a private cluster: each is held open until all are
// picked, so that no two are the same.
func FreePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer ln.Close()
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// AwaitHTTP polls url until it answers want, or returns an error after
// timeout.
func AwaitHTTP(url string, want int, timeout time.Duration) error {
	return PollHTTP(url, want, timeout, 20*time.Millisecond)
}

// PollHTTP is AwaitHTTP asking every interval: a benchmark that starts its
// clock at readiness polls often so the clock starts close to it.
func PollHTTP(url string, want int, timeout, interval time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		resp, err := apiClient.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == want {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not answer %d within %s", url, want, timeout)
		}
		time.Sleep(interval)
	}
}
