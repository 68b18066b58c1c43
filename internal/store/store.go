// Package store is the embedded, durable key-value store (bbolt) that each
// service's typed Store is built on. Values are protobuf messages; every
// multi-key change happens in one transaction, so a crash never leaves half
// of a state change on disk.
package store

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"
)

// ErrNotFound is returned when a key does not exist.
var ErrNotFound = errors.New("store: not found")

// ErrExists is returned by Create when the key already exists.
var ErrExists = errors.New("store: already exists")

// DB is one service's embedded database file.
type DB struct {
	bolt *bolt.DB

	// group commit (see Batch)
	mu      sync.Mutex
	pending []*batchCall
	leading bool
}

// batchCall is one function waiting for a group commit.
type batchCall struct {
	fn   func(*Tx) error
	done chan error
	// lead wakes a waiting call to commit the next group itself.
	lead chan struct{}
}

// Open opens (creating if needed) the database file at path. The parent
// directory is created with owner-only permissions.
func Open(path string) (*DB, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("store: create data dir: %w", err)
	}
	// As etcd opens its bbolt files: the free page list is not written
	// with every commit (it is rebuilt from the pages when the file
	// opens), and is kept as a map, whose allocation does not scan.
	// Commits stay as durable; they write fewer pages.
	b, err := bolt.Open(path, 0o600, &bolt.Options{
		Timeout:        5 * time.Second,
		NoFreelistSync: true,
		FreelistType:   bolt.FreelistMapType,
	})
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	return &DB{bolt: b}, nil
}

// Close closes the file.
func (d *DB) Close() error { return d.bolt.Close() }

// Update runs fn in a read-write transaction; fn's error rolls it back.
func (d *DB) Update(fn func(*Tx) error) error {
	return d.bolt.Update(func(t *bolt.Tx) error { return fn(&Tx{t: t}) })
}

// Batch runs fn in a read-write transaction that it may share with the
// functions of concurrent Batch calls: one commit (one fsync) for all of
// them. It returns when the transaction holding fn's changes is on disk,
// as Update does. Unlike bbolt's own Batch it waits for no timer: a call
// that finds no commit under way commits at once, and the calls that
// arrive meanwhile make up the next group.
//
// fn may run more than once: when any function of a group fails, the
// group's transaction is rolled back and each function runs again in a
// transaction of its own. So fn must set everything it leaves outside the
// transaction on every run (as a transaction that is retried would).
func (d *DB) Batch(fn func(*Tx) error) error {
	c := &batchCall{fn: fn, done: make(chan error, 1), lead: make(chan struct{}, 1)}
	d.mu.Lock()
	d.pending = append(d.pending, c)
	if d.leading {
		d.mu.Unlock()
		select {
		case err := <-c.done:
			return err
		case <-c.lead:
			// The previous leader left c first in line: commit the group.
			d.mu.Lock()
		}
	}
	d.leading = true
	group := d.pending
	d.pending = nil
	d.mu.Unlock()

	d.commitGroup(group)

	d.mu.Lock()
	if len(d.pending) > 0 {
		d.pending[0].lead <- struct{}{}
	} else {
		d.leading = false
	}
	d.mu.Unlock()
	return <-c.done
}

// commitGroup commits the functions of group in one transaction, or, when
// that fails, each in its own.
func (d *DB) commitGroup(group []*batchCall) {
	if len(group) > 1 {
		err := d.bolt.Update(func(t *bolt.Tx) error {
			for _, c := range group {
				if err := c.fn(&Tx{t: t}); err != nil {
					return err
				}
			}
			return nil
		})
		if err == nil {
			for _, c := range group {
				c.done <- nil
			}
			return
		}
	}
	for _, c := range group {
		c.done <- d.Update(c.fn)
	}
}

// View runs fn in a read-only transaction.
func (d *DB) View(fn func(*Tx) error) error {
	return d.bolt.View(func(t *bolt.Tx) error { return fn(&Tx{t: t}) })
}

// Tx is a transaction. Buckets are created on first write.
type Tx struct {
	t *bolt.Tx
}

func (x *Tx) bucket(name string, create bool) (*bolt.Bucket, error) {
	if b := x.t.Bucket([]byte(name)); b != nil {
		return b, nil
	}
	if !create || !x.t.Writable() {
		return nil, nil
	}
	b, err := x.t.CreateBucket([]byte(name))
	if err != nil {
		return nil, fmt.Errorf("store: create bucket %s: %w", name, err)
	}
	return b, nil
}

// Get reads key into m. It returns ErrNotFound when absent.
func (x *Tx) Get(bucket, key string, m proto.Message) error {
	b, err := x.bucket(bucket, false)
	if err != nil {
		return err
	}
	if b == nil {
		return ErrNotFound
	}
	v := b.Get([]byte(key))
	if v == nil {
		return ErrNotFound
	}
	if err := proto.Unmarshal(v, m); err != nil {
		return fmt.Errorf("store: decode %s/%s: %w", bucket, key, err)
	}
	return nil
}

// GetOptional is Get for a record that may be absent: it returns m, or nil
// when key holds nothing.
func GetOptional[M proto.Message](x *Tx, bucket, key string, m M) (M, error) {
	var zero M
	switch err := x.Get(bucket, key, m); {
	case errors.Is(err, ErrNotFound):
		return zero, nil
	case err != nil:
		return zero, err
	}
	return m, nil
}

// Put writes m at key, replacing any value.
func (x *Tx) Put(bucket, key string, m proto.Message) error {
	b, err := x.bucket(bucket, true)
	if err != nil {
		return err
	}
	v, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return fmt.Errorf("store: encode %s/%s: %w", bucket, key, err)
	}
	return b.Put([]byte(key), v)
}

// Create writes m at key only if the key is absent; otherwise ErrExists.
func (x *Tx) Create(bucket, key string, m proto.Message) error {
	b, err := x.bucket(bucket, true)
	if err != nil {
		return err
	}
	if b.Get([]byte(key)) != nil {
		return ErrExists
	}
	return x.Put(bucket, key, m)
}

// Delete removes key. Deleting an absent key is not an error.
func (x *Tx) Delete(bucket, key string) error {
	b, err := x.bucket(bucket, false)
	if err != nil || b == nil {
		return err
	}
	return b.Delete([]byte(key))
}

// List calls fn for every key with the given prefix, in key order, decoding
// each value into a fresh message from newMsg. fn may stop the walk by
// returning a non-nil error, which List returns.
func List[M proto.Message](x *Tx, bucket, prefix string, newMsg func() M, fn func(key string, m M) error) error {
	b, err := x.bucket(bucket, false)
	if err != nil || b == nil {
		return err
	}
	c := b.Cursor()
	p := []byte(prefix)
	for k, v := c.Seek(p); k != nil && bytes.HasPrefix(k, p); k, v = c.Next() {
		m := newMsg()
		if err := proto.Unmarshal(v, m); err != nil {
			return fmt.Errorf("store: decode %s/%s: %w", bucket, k, err)
		}
		if err := fn(string(k), m); err != nil {
			return err
		}
	}
	return nil
}

// NextSequence returns the next value of a bucket's monotonic counter,
// starting at 1.
func (x *Tx) NextSequence(bucket string) (int64, error) {
	b, err := x.bucket(bucket, true)
	if err != nil {
		return 0, err
	}
	n, err := b.NextSequence()
	return int64(n), err
}

// SeqKey formats a sequence number as a fixed-width key so that key order
// is numeric order.
func SeqKey(n int64) string { return fmt.Sprintf("%020d", n) }
