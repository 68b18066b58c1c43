package store

import (
	"bytes"
	"context"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/v0m3/v0m3/services/internal/retryqueue"
)

// Spool returns the bucket "spool/<name>" of d as a retryqueue.Spool:
// where records waiting for another service are kept across a restart.
func (d *DB) Spool(name string) retryqueue.Spool { return boltSpool{db: d, bucket: "spool/" + name} }

type boltSpool struct {
	db     *DB
	bucket string
}

func (s boltSpool) Put(_ context.Context, key string, rec []byte) error {
	return s.db.bolt.Update(func(t *bolt.Tx) error {
		b, err := t.CreateBucketIfNotExists([]byte(s.bucket))
		if err != nil {
			return fmt.Errorf("store: create bucket %s: %w", s.bucket, err)
		}
		return b.Put([]byte(key), rec)
	})
}

func (s boltSpool) Delete(_ context.Context, key string) error {
	return s.db.Update(func(tx *Tx) error { return tx.Delete(s.bucket, key) })
}

func (s boltSpool) List(context.Context) ([]retryqueue.Spooled, error) {
	var out []retryqueue.Spooled
	err := s.db.bolt.View(func(t *bolt.Tx) error {
		b := t.Bucket([]byte(s.bucket))
		if b == nil {
			return nil
		}
		// bbolt's cursor walks keys in byte order: the order queued.
		return b.ForEach(func(k, v []byte) error {
			out = append(out, retryqueue.Spooled{Key: string(k), Rec: bytes.Clone(v)})
			return nil
		})
	})
	return out, err
}
