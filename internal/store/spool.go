package store

import (
	"bytes"
	"context"

	bolt "go.etcd.io/bbolt"

	"github.com/v0m3/v0m3/internal/retryqueue"
)

// Spool returns the bucket "spool/<name>" of d as a retryqueue.Spool:
// where records waiting for another service are kept across a restart.
func (d *DB) Spool(name string) retryqueue.Spool { return boltSpool{db: d, bucket: "spool/" + name} }

type boltSpool struct {
	db     *DB
	bucket string
}

// Put and Delete share group commits (Batch) with the service's other
// writes: during an outage every queued record is a write, and they must
// not each take the file's one writer and an fsync of their own.
func (s boltSpool) Put(_ context.Context, key string, rec []byte) error {
	return s.db.Batch(func(tx *Tx) error {
		b, err := tx.bucket(s.bucket, true)
		if err != nil {
			return err
		}
		return b.Put([]byte(key), rec)
	})
}

func (s boltSpool) Delete(_ context.Context, key string) error {
	return s.db.Batch(func(tx *Tx) error { return tx.Delete(s.bucket, key) })
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
