package evidence

import (
	lru "github.com/hashicorp/golang-lru/v2"
)

// rememberedSources bounds what the Redis store remembers of sources'
// revisions: a few thousand contents and sources, a few hundred bytes
// each.
const rememberedSources = 4096

// sourceCache remembers what the Redis store last saw of sources'
// revisions, so an observation's write can be decided before anything is
// read (see RecordObservation). It is only a guess: the write checks it,
// so a stale entry costs a round trip, never a wrong revision. A source's
// revision of a content never changes once written, so a remembered one
// stays right; the count of a source's revisions grows.
type sourceCache struct {
	revisions *lru.Cache[string, string] // revs key + "\x00" + content digest -> SourceRevision
	counts    *lru.Cache[string, int64]  // revs key -> revisions of the source
}

func newSourceCache() *sourceCache {
	revisions, err := lru.New[string, string](rememberedSources)
	if err != nil {
		panic(err) // only for a size below one
	}
	counts, err := lru.New[string, int64](rememberedSources)
	if err != nil {
		panic(err)
	}
	return &sourceCache{revisions: revisions, counts: counts}
}

// sourceGuess is what an observation's write is decided on: the
// content's revision when found, else the count of the source's
// revisions.
type sourceGuess struct {
	revision string
	found    bool
	count    int64
}

// guess is what the cache knows of a content of the source at revsKey;
// an unknown source is guessed new (no revisions yet).
func (c *sourceCache) guess(revsKey, digest string) sourceGuess {
	if rev, ok := c.revisions.Get(revsKey + "\x00" + digest); ok {
		return sourceGuess{revision: rev, found: true}
	}
	count, _ := c.counts.Get(revsKey)
	return sourceGuess{count: count}
}

// learn remembers a content's revision and the source's count of
// revisions seen with it.
func (c *sourceCache) learn(revsKey, digest, revision string, count int64) {
	c.revisions.Add(revsKey+"\x00"+digest, revision)
	c.learnCount(revsKey, count)
}

// learnCount remembers the count of a source's revisions.
func (c *sourceCache) learnCount(revsKey string, count int64) {
	c.counts.Add(revsKey, count)
}
