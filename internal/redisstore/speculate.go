package redisstore

import (
	"context"
	"crypto/sha1"
	"errors"
	"fmt"
	"strings"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/redis/go-redis/v9"
)

// Speculator runs optimistic transactions in one round trip when it can.
//
// UpdateRead takes two round trips: WATCH with the reads, then the
// MULTI/EXEC. But a service is usually the last writer of what it
// changes next (a request it moves through its stages, a budget it
// charges again), so the values are often already known. The Speculator
// remembers, per key, the value this process last read or wrote there
// (bounded, least recently used first out), decides on those values, and
// sends one script that checks each key still holds exactly what it
// decided on and only then runs the writes. When a key changed (another
// replica wrote it, or the guess was wrong), nothing is written and the
// transaction runs as UpdateRead, on fresh values, which it remembers.
// What is remembered is only a guess: every write is checked against the
// store, so a stale value costs a round trip, never a lost update. The
// check compares values where WATCH notices any write: decide depends on
// the values alone, so a key written away and back to the same bytes
// would be decided on the same way.
//
// A Write whose commands the script cannot run, a refusal or a replay
// (decide returns an error or no writes) decided on remembered values
// are not trusted either: they too run as UpdateRead. So is every
// transaction on a Redis Cluster client, whose keys a script must
// declare.
type Speculator struct {
	c      redis.UniversalClient
	known  *lru.Cache[string, known]
	script *redis.Script
	// evals are the scripts a Write may queue with EVAL, by source: the
	// speculative script runs each as a function (a script cannot call
	// EVAL).
	evals map[string]bool
	on    bool
}

// known is a remembered value: absent, or the string stored.
type known struct {
	v      string
	absent bool
}

// maxRemembered bounds the size of a value kept: a larger record is read
// again each time rather than held in memory.
const maxRemembered = 64 << 10

// keep remembers v as key's value, unless it is too large to.
func (s *Speculator) keep(key string, v known) {
	if len(v.v) > maxRemembered {
		s.known.Remove(key)
		return
	}
	s.known.Add(key, v)
}

// speculativeWrite checks that each of KEYS holds the value decided on
// (for KEYS[i], ARGV[2i-1] and ARGV[2i]: "1" and the value, or "0" and ""
// for absent) and returns nil (false) if any does not. Otherwise
// it runs the commands that follow in ARGV, each as its argument count
// and its arguments, as MULTI/EXEC would: one failing command does not
// stop the others, and the reply is every command's reply (an error
// reply for one that failed). A command "eval" runs the registered
// script of that source, found by its SHA-1, as a function.
const speculativeWrite = `
local n = #KEYS
for i = 1, n do
  local v = redis.call('GET', KEYS[i])
  if ARGV[2*i-1] == '0' then
    if v ~= false then return false end
  elseif v ~= ARGV[2*i] then
    return false
  end
end
local out = {}
local i = 2*n + 1
while i <= #ARGV do
  local argc = tonumber(ARGV[i])
  local args = {}
  for j = 1, argc do args[j] = ARGV[i + j] end
  i = i + argc + 1
  if args[1] == 'eval' then
    local f = scripts[redis.sha1hex(args[2])]
    local nk = tonumber(args[3])
    local keys, argv = {}, {}
    for j = 1, nk do keys[j] = args[3 + j] end
    for j = 4 + nk, argc do argv[#argv + 1] = args[j] end
    local ok, r = pcall(f, keys, argv)
    if ok then
      if r == nil then r = false end
      out[#out + 1] = r
    elseif type(r) == 'table' and r.err then
      out[#out + 1] = redis.error_reply(r.err)
    else
      out[#out + 1] = redis.error_reply(tostring(r))
    end
  else
    out[#out + 1] = redis.pcall(unpack(args))
  end
end
return out
`

// NewSpeculator returns a Speculator on c remembering up to size keys.
// evals are the sources of the scripts the Writes given to it may queue
// with EVAL (redis.Script.Eval).
func NewSpeculator(c redis.UniversalClient, size int, evals ...string) *Speculator {
	known, err := lru.New[string, known](size)
	if err != nil {
		panic(fmt.Sprintf("redis store: speculator of %d keys: %v", size, err))
	}
	_, cluster := c.(*redis.ClusterClient)
	s := &Speculator{c: c, known: known, evals: map[string]bool{}, on: !cluster}
	var src strings.Builder
	src.WriteString("local scripts = {}\n")
	for _, e := range evals {
		s.evals[e] = true
		fmt.Fprintf(&src, "scripts['%x'] = function(KEYS, ARGV)\n%s\nend\n", sha1.Sum([]byte(e)), e)
	}
	src.WriteString(speculativeWrite)
	s.script = redis.NewScript(src.String())
	return s
}

// Expect remembers that key holds v, or is absent when v is nil: what a
// caller knows before its transaction, such as that a new id's key does
// not exist yet.
func (s *Speculator) Expect(key string, v []byte) {
	if v == nil {
		s.known.Add(key, known{absent: true})
		return
	}
	s.keep(key, known{v: string(v)})
}

// forget drops what is remembered about keys.
func (s *Speculator) forget(keys ...string) {
	for _, k := range keys {
		s.known.Remove(k)
	}
}

// Update runs decide as one optimistic transaction on keys, as
// UpdateRead does with an MGET of keys as its read: decide gets the
// values at keys, in their order (nil when absent), and returns the
// writes (or an error, or no writes for a replay), which are made only if
// those values are still current. When every key's value is remembered,
// decide runs on those first and, if it writes, the writes go in one
// round trip (see Speculator). decide may therefore run more than once,
// and must not read through its Cmdable when it decides to write (such a
// read is not checked in one round trip). keys must hold strings (or
// nothing): the check reads them with GET.
func (s *Speculator) Update(ctx context.Context, keys []string, decide func(tx redis.Cmdable, vals []any) (Write, error)) error {
	if vals, ok := s.remembered(keys); ok {
		if done, err := s.speculate(ctx, keys, vals, decide); done {
			return err
		}
	}
	var (
		read    *redis.SliceCmd
		cmds    []redis.Cmder
		refused error
	)
	err := UpdateRead(ctx, s.c, keys, func(p redis.Pipeliner) {
		read = p.MGet(ctx, keys...)
	}, func(tx *redis.Tx) (Write, error) {
		cmds, refused = nil, nil
		vals, err := read.Result()
		if err != nil {
			return nil, err
		}
		for i, k := range keys {
			s.remember(k, vals[i])
		}
		w, err := decide(tx, vals)
		if w == nil || err != nil {
			refused = err
			return w, err
		}
		return func(p redis.Pipeliner) error {
			err := w(p)
			cmds = p.Cmds()
			return err
		}, nil
	})
	if err != nil {
		if refused == nil || !errors.Is(err, refused) {
			// A failed EXEC may have left anything: remember nothing.
			s.forget(keys...)
		}
		return err
	}
	s.learn(cmds)
	return nil
}

// remembered returns the values remembered at every key of keys, as MGET
// would return them, or false when one is not.
func (s *Speculator) remembered(keys []string) ([]any, bool) {
	if !s.on || len(keys) == 0 {
		return nil, false
	}
	vals := make([]any, len(keys))
	for i, k := range keys {
		v, ok := s.known.Get(k)
		if !ok {
			return nil, false
		}
		if !v.absent {
			vals[i] = v.v
		}
	}
	return vals, true
}

// speculate decides on vals, the remembered values at keys, and sends
// the check and the writes in one script. done is false when the
// transaction must run as UpdateRead: decide refused or wrote nothing,
// its writes cannot run in the script, or a key no longer holds what was
// remembered (nothing was written then).
func (s *Speculator) speculate(ctx context.Context, keys []string, vals []any, decide func(tx redis.Cmdable, vals []any) (Write, error)) (done bool, err error) {
	w, err := decide(s.c, vals)
	if w == nil || err != nil {
		return false, nil
	}
	p := s.c.Pipeline()
	defer p.Discard()
	if err := w(p); err != nil {
		return false, nil
	}
	cmds := p.Cmds()
	args := make([]any, 0, 2*len(keys)+4*len(cmds))
	for _, v := range vals {
		if v == nil {
			args = append(args, "0", "")
		} else {
			args = append(args, "1", v)
		}
	}
	for _, c := range cmds {
		if !s.runnable(c) {
			return false, nil
		}
		a := c.Args()
		args = append(args, len(a))
		args = append(args, a...)
	}
	res, err := s.script.Run(ctx, s.c, keys, args...).Result()
	switch {
	case errors.Is(err, redis.Nil):
		// A key changed: nothing was written.
		s.forget(keys...)
		return false, nil
	case err != nil:
		// The writes' own failures are replies, so the script failed in
		// its check, or the reply was lost on the way back, when it may
		// have written: the caller learns of it as of a failed EXEC.
		s.forget(keys...)
		return true, fmt.Errorf("redis store: speculative write: %w", err)
	}
	replies, ok := res.([]any)
	if !ok || len(replies) != len(cmds) {
		s.forget(keys...)
		return true, fmt.Errorf("redis store: speculative write: %d replies for %d commands", len(replies), len(cmds))
	}
	for i, c := range cmds {
		setReply(c, replies[i])
	}
	s.learn(cmds)
	return true, nil
}

// runnable reports whether the script can run c and hand its reply back.
func (s *Speculator) runnable(c redis.Cmder) bool {
	switch c.(type) {
	case *redis.StatusCmd, *redis.IntCmd, *redis.Cmd:
	default:
		return false
	}
	a := c.Args()
	if name, _ := a[0].(string); name == "eval" {
		src, _ := a[1].(string)
		return s.evals[src]
	}
	return true
}

// setReply gives c the reply v the script returned for it.
func setReply(c redis.Cmder, v any) {
	if err, ok := v.(error); ok {
		c.SetErr(err)
		return
	}
	switch c := c.(type) {
	case *redis.StatusCmd:
		s, _ := v.(string)
		c.SetVal(s)
	case *redis.IntCmd:
		n, _ := v.(int64)
		c.SetVal(n)
	case *redis.Cmd:
		c.SetVal(v)
	}
}

// remember keeps v, a value read by MGET (nil when absent), as key's.
func (s *Speculator) remember(key string, v any) {
	switch v := v.(type) {
	case nil:
		s.known.Add(key, known{absent: true})
	case string:
		s.keep(key, known{v: v})
	default:
		s.known.Remove(key)
	}
}

// learn remembers what committed commands left: the value of a plain
// SET; any other command may have changed the keys it names, which are
// forgotten.
func (s *Speculator) learn(cmds []redis.Cmder) {
	for _, c := range cmds {
		a := c.Args()
		if name, _ := a[0].(string); name == "set" && len(a) == 3 && c.Err() == nil {
			if k, ok := a[1].(string); ok {
				switch v := a[2].(type) {
				case []byte:
					s.keep(k, known{v: string(v)})
					continue
				case string:
					s.keep(k, known{v: v})
					continue
				}
			}
		}
		for _, x := range a[1:] {
			if k, ok := x.(string); ok && s.known.Contains(k) {
				s.known.Remove(k)
			}
		}
	}
}
