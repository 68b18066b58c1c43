package suite

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"time"

	ostore "github.com/v0m3/v0m3/services/orchestrator/store"

	"github.com/redis/go-redis/v9"

	"github.com/v0m3/v0m3/internal/redisstore"
	"github.com/v0m3/v0m3/internal/retryqueue"
	"github.com/v0m3/v0m3/internal/store"
	"github.com/v0m3/v0m3/services/evidence"
	"github.com/v0m3/v0m3/services/policy"
	"github.com/v0m3/v0m3/services/registry"
)

// DefaultRedisPrefix is the deployment prefix of Redis keys when the store
// URL names none.
const DefaultRedisPrefix = "v0m3"

// Stores opens every service's Store from one store URL:
//
//	file:///var/lib/v0m3       one embedded bbolt file per service in that directory
//	redis://host:6379/0?prefix=prod
//	rediss://user:pass@host:6380/0?prefix=prod&dial_timeout=2s
//
// A redis URL takes go-redis's options (redis.ParseURL) plus prefix, the
// deployment's key prefix (default "v0m3"). Every service's keys are then
// under "{<prefix>:<service>}:", so deployments and services sharing one
// Redis never collide. Redis is for several replicas; the file store is for
// one process (bbolt locks its files).
type Stores struct {
	kind   string // "file" or "redis"
	dir    string
	redis  redis.UniversalClient
	prefix string
	shown  string // the URL without credentials, for logs and errors

	mu  sync.Mutex
	dbs map[string]*store.DB
}

// OpenStores parses a store URL and connects (Redis) or prepares to open
// files (file). It does not wait for Redis to answer: a service starts
// while Redis is down and reports NOT_SERVING until it is up (see Ping).
func OpenStores(rawURL string) (*Stores, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		// url's error repeats the input, which may hold a password.
		return nil, errors.New("suite: store URL does not parse; want file:///dir or redis://host:port/db?prefix=name")
	}
	shown := u.Redacted()
	switch u.Scheme {
	case "file":
		dir := u.Path
		if u.Opaque != "" {
			dir = u.Opaque // file:relative/dir
		}
		if u.Host != "" && u.Host != "localhost" {
			dir = u.Host + u.Path // file://relative/dir
		}
		if dir == "" {
			return nil, fmt.Errorf("suite: store %s names no directory", shown)
		}
		return FileStores(dir), nil
	case "redis", "rediss":
		q := u.Query()
		prefix := q.Get("prefix")
		if prefix == "" {
			prefix = DefaultRedisPrefix
		}
		if strings.ContainsAny(prefix, "{}:") {
			return nil, fmt.Errorf("suite: store %s: prefix %q may not contain '{', '}' or ':'", shown, prefix)
		}
		q.Del("prefix")
		u.RawQuery = q.Encode()
		opts, err := redis.ParseURL(u.String())
		if err != nil {
			return nil, fmt.Errorf("suite: store %s: %w", shown, err)
		}
		c := redis.NewClient(opts)
		c.AddHook(redisstore.AbortReasons{}) // a transaction refused at maxmemory says so
		return &Stores{kind: "redis", redis: c, prefix: prefix, shown: shown}, nil
	default:
		return nil, fmt.Errorf("suite: store %s: scheme %q is not file or redis", shown, u.Scheme)
	}
}

// FileStores returns the embedded stores: one bbolt file per service in
// dir, opened on first use.
func FileStores(dir string) *Stores {
	dir = filepath.Clean(dir)
	return &Stores{kind: "file", dir: dir, shown: "file://" + filepath.ToSlash(dir), dbs: map[string]*store.DB{}}
}

// Kind is "file" or "redis".
func (s *Stores) Kind() string { return s.kind }

// String is the store URL without credentials.
func (s *Stores) String() string { return s.shown }

// Shared reports whether several processes may use these stores at once.
func (s *Stores) Shared() bool { return s.kind == "redis" }

func (s *Stores) open(name string) (*store.DB, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if db := s.dbs[name]; db != nil {
		return db, nil
	}
	db, err := store.Open(filepath.Join(s.dir, name+".db"))
	if err != nil {
		return nil, err
	}
	s.dbs[name] = db
	return db, nil
}

// Registry returns the registry service's Store.
func (s *Stores) Registry() (registry.Store, error) {
	if s.kind == "redis" {
		return registry.NewRedisStore(s.redis, s.prefix), nil
	}
	db, err := s.open(Registry)
	if err != nil {
		return nil, err
	}
	return registry.NewBoltStore(db), nil
}

// Policy returns the policy service's Store.
func (s *Stores) Policy() (policy.Store, error) {
	if s.kind == "redis" {
		return policy.NewRedisStore(s.redis, s.prefix), nil
	}
	db, err := s.open(Policy)
	if err != nil {
		return nil, err
	}
	return policy.NewBoltStore(db), nil
}

// Evidence returns the evidence service's Store.
func (s *Stores) Evidence() (evidence.Store, error) {
	if s.kind == "redis" {
		return evidence.NewRedisStore(s.redis, s.prefix), nil
	}
	db, err := s.open(Evidence)
	if err != nil {
		return nil, err
	}
	return evidence.NewBoltStore(db), nil
}

// Orchestrator returns the orchestrator service's Store.
func (s *Stores) Orchestrator() (ostore.Store, error) {
	if s.kind == "redis" {
		return ostore.NewRedisStore(s.redis, s.prefix), nil
	}
	db, err := s.open(Orchestrator)
	if err != nil {
		return nil, err
	}
	return ostore.NewBoltStore(db), nil
}

// Spool returns where service keeps records waiting for another
// service across a restart (retryqueue.Spool), in its own store: a bucket
// of its file, or a hash among its Redis keys. name tells apart what
// waits (audit records, protocol trace events).
func (s *Stores) Spool(service, name string) (retryqueue.Spool, error) {
	if s.kind == "redis" {
		return redisstore.Spool(s.redis, redisstore.NewKeys(s.prefix, service), name), nil
	}
	db, err := s.open(service)
	if err != nil {
		return nil, err
	}
	return db.Spool(name), nil
}

// Ping reports whether the backing store is usable: Redis must answer
// within a second and evict nothing. The file store is always usable once
// open.
//
// Redis evicting keys under memory pressure (any maxmemory-policy but
// noeviction, including the volatile-* ones, which evict exactly the
// keys with a time to live: leases, idempotency records, budgets) would
// silently break what the services promise: a lease lost lets another
// replica run a request again, a lost charge record charges twice. Such
// a Redis is reported like an unreachable one, so the services say
// NOT_SERVING and log why until it is reconfigured; at its maxmemory with
// noeviction, writes are refused instead (STORE_FULL) and nothing is lost.
func (s *Stores) Ping(ctx context.Context) error {
	if s.kind != "redis" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	info, err := s.redis.Info(ctx, "memory").Result()
	var reply redis.Error
	if errors.As(err, &reply) && strings.HasPrefix(reply.Error(), "NOPERM") {
		// An ACL user without INFO: reachability is all it can show.
		info, err = "", s.redis.Ping(ctx).Err()
	}
	if err != nil {
		return fmt.Errorf("store %s: %w", s.shown, err)
	}
	if policy := infoField(info, "maxmemory_policy"); policy != "" && policy != "noeviction" {
		return fmt.Errorf("store %s evicts keys when full (maxmemory-policy %s): V0M3 keeps leases, approvals, budgets and idempotency records there, which must never be evicted; set maxmemory-policy noeviction", s.shown, policy)
	}
	return nil
}

// infoField returns the value of field in the text of Redis INFO, "" when
// absent.
func infoField(info, field string) string {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return ""
}

// Close closes the Redis client or every opened file.
func (s *Stores) Close() error {
	if s.redis != nil {
		return s.redis.Close()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for name, db := range s.dbs {
		errs = append(errs, db.Close())
		delete(s.dbs, name)
	}
	return errors.Join(errs...)
}
