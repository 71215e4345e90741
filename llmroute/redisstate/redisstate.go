// Package redisstate keeps llm_route's shared accounting in Redis:
// upstream slots and provider capacity as per-instance leases, and
// backoff scopes. Every operation is one Lua script, atomic on the server;
// nothing is read, changed in Go and written back. The package knows
// nothing of Caddy or of the routing core: it takes ids and numbers.
//
// Slots are held as a count per instance (a hash field) with a lease expiry
// per instance (a sorted set). Claims and releases move the count by one;
// a renewal every third of the lease TTL rewrites the count to what the
// instance really holds and pushes the expiry on. A crashed instance stops
// renewing, and its count is dropped by the first claim after the expiry; a
// Redis restart (state lost) is healed by the next renewal.
package redisstate

import (
	"context"
	"crypto/tls"
	_ "embed"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed claim.lua
	claimLua string
	//go:embed release.lua
	releaseLua string
	//go:embed renew.lua
	renewLua string
	//go:embed used.lua
	usedLua string
	//go:embed cool.lua
	coolLua string
	//go:embed success.lua
	successLua string
	//go:embed backoffs.lua
	backoffsLua string

	claimScript    = redis.NewScript(claimLua)
	releaseScript  = redis.NewScript(releaseLua)
	renewScript    = redis.NewScript(renewLua)
	usedScript     = redis.NewScript(usedLua)
	coolScript     = redis.NewScript(coolLua)
	successScript  = redis.NewScript(successLua)
	backoffsScript = redis.NewScript(backoffsLua)
)

// The client's own logger writes reconnect chatter to stderr, outside
// Caddy's logs; the caller logs the transitions that matter.
func init() { redis.SetLogger(quiet{}) }

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// Options are the connection and lease settings.
type Options struct {
	Address  string
	Username string
	Password string
	DB       int
	TLS      bool
	Prefix   string
	// Timeout bounds every call, connecting included.
	Timeout time.Duration
	// LeaseTTL is how long a lease lives without renewal.
	LeaseTTL time.Duration
}

// Store is one instance's handle on the shared state.
type Store struct {
	c        *redis.Client
	prefix   string
	instance string
	timeout  time.Duration
	ttlMS    string
	b        *batcher // every script call goes through it (batch.go)
	pairsMu  sync.RWMutex
	pairs    map[pairID]*pair // see pairOf
	leases   leases           // client-key reservations held (keys.go)

	// tag names this Store's reservations (keys.go): the instance id is
	// process-wide, and a reload may open a second Store beside this one
	// whose reservation numbers start over.
	tag string
}

// opened numbers the Stores of this process.
var opened atomic.Uint64

// Open returns a store; it does not connect until the first call, so a
// Redis that is down at start-up does not stop the caller.
func Open(o Options, instance string) *Store {
	ro := &redis.Options{
		Addr:                  o.Address,
		Username:              o.Username,
		Password:              o.Password,
		DB:                    o.DB,
		DialTimeout:           o.Timeout,
		ReadTimeout:           o.Timeout,
		WriteTimeout:          o.Timeout,
		PoolTimeout:           o.Timeout,
		ContextTimeoutEnabled: true,
		MaxRetries:            -1, // a retry would double the bound on a call
		DisableIdentity:       true,
		// The batcher sends one pipeline at a time, on the pipeline pool:
		// one connection carries every script call, whatever the number of
		// concurrent requests (go-redis's default of 10 per CPU let 64
		// requests under GOMAXPROCS 1 wait for a connection past the
		// timeout). The main pool serves the few direct calls (PING) and
		// a pipeline whose connection is being replaced; the pub/sub
		// connection has a pool of its own. Buffers: a full batch is
		// 128 calls of a few hundred bytes.
		PoolSize:                4,
		PipelinePoolSize:        2,
		PipelineReadBufferSize:  64 << 10,
		PipelineWriteBufferSize: 64 << 10,
	}
	if o.TLS {
		ro.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	c := redis.NewClient(ro)
	return &Store{
		c:        c,
		prefix:   o.Prefix,
		instance: instance,
		tag:      instance + "." + strconv.FormatUint(opened.Add(1), 10),
		timeout:  o.Timeout,
		ttlMS:    strconv.FormatInt(o.LeaseTTL.Milliseconds(), 10),
		b:        newBatcher(c, o.Timeout/4),
		pairs:    map[pairID]*pair{},
	}
}

// Close sends the calls still queued (releases nobody waits for; each
// batch bounded by its calls' deadlines), then closes the connections. A call
// queued after Close fails with ErrClosed.
func (s *Store) Close() error {
	s.b.close()
	return s.c.Close()
}

// WakeChannel is the pub/sub channel releases are announced on.
func (s *Store) WakeChannel() string { return s.prefix + "wake" }

func (s *Store) upKeys(id string) (string, string) {
	k := s.prefix + "up:" + id
	return k, k + ":leases"
}

func (s *Store) provKeys(id string) (string, string) {
	k := s.prefix + "prov:" + id
	return k, k + ":leases"
}

// deadline is a call's, queued now: the timeout, or ctx's deadline when
// it comes sooner (a call is not sent after its caller gave up).
func (s *Store) deadline(ctx context.Context) time.Time {
	until := time.Now().Add(s.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(until) {
		return d
	}
	return until
}

// run queues a script call on the batcher and waits for its reply, at most
// the timeout (batcher.do) or until ctx ends.
func (s *Store) run(ctx context.Context, script *redis.Script, keys []string, args ...any) *redis.Cmd {
	return s.b.do(ctx, &call{script: script, keys: keys, args: args, until: s.deadline(ctx)})
}

// pair holds what the claims and releases of one upstream at one provider
// send, built once: a claim and a release are on every request's path,
// and their keys, the merge key and the boxed arguments were most of the
// allocations of a claim. Everything in it is only read once built.
type pair struct {
	claimKeys, releaseKeys []string
	releaseArgs            []any
	id                     string // the batcher's merge key of a release
	limits                 atomic.Pointer[claimLimits]
}

type pairID struct{ upstream, provider string }

// claimLimits are a claim's arguments for one pair of limits (an
// upstream's limits change only with a reload: one value in practice).
type claimLimits struct {
	limit, capacity int64
	args            []any
	id              string // the batcher's merge key of a claim
}

// maxPairs bounds the pairs kept; reloads that rename upstreams add new
// ones, and the map starts over when full.
const maxPairs = 4096

// pairOf returns the pair of upstream at provider.
func (s *Store) pairOf(upstream, provider string) *pair {
	k := pairID{upstream, provider}
	s.pairsMu.RLock()
	p := s.pairs[k]
	s.pairsMu.RUnlock()
	if p != nil {
		return p
	}
	uh, uz := s.upKeys(upstream)
	ph, pz := s.provKeys(provider)
	p = &pair{claimKeys: []string{uh, uz, ph, pz}, releaseKeys: []string{uh, ph},
		releaseArgs: []any{s.instance, s.WakeChannel()}, id: upstream + "\x00" + provider}
	s.pairsMu.Lock()
	if len(s.pairs) >= maxPairs {
		clear(s.pairs)
	}
	s.pairs[k] = p
	s.pairsMu.Unlock()
	return p
}

// claimArgs returns the claim arguments of p for these limits.
func (s *Store) claimArgs(p *pair, limit, capacity int64) *claimLimits {
	if l := p.limits.Load(); l != nil && l.limit == limit && l.capacity == capacity {
		return l
	}
	// Claims merge when their keys and limits are the same.
	l := &claimLimits{limit: limit, capacity: capacity, args: []any{s.instance, s.ttlMS, limit, capacity},
		id: p.id + "\x00" + strconv.FormatInt(limit, 10) + "\x00" + strconv.FormatInt(capacity, 10)}
	p.limits.Store(l)
	return l
}

// Verdict is the outcome of a claim.
type Verdict int

const (
	Claimed      Verdict = 1
	UpstreamFull Verdict = 0
	ProviderFull Verdict = -1
)

// Claim takes one slot of upstream (limit < 0: none) and one unit of its
// provider's capacity (capacity < 0: none) fleet-wide, both or neither.
func (s *Store) Claim(ctx context.Context, upstream, provider string, limit, capacity int64) (Verdict, error) {
	p := s.pairOf(upstream, provider)
	l := s.claimArgs(p, limit, capacity)
	n, err := s.b.do(ctx, &call{script: claimScript, keys: p.claimKeys, args: l.args, until: s.deadline(ctx),
		kind: claimCall, pair: l.id}).Int64()
	if err != nil {
		return UpstreamFull, err
	}
	return Verdict(n), nil
}

// Release gives back what Claim took and wakes every instance's queue.
func (s *Store) Release(ctx context.Context, upstream, provider string) error {
	return s.b.do(ctx, s.releaseCall(s.deadline(ctx), upstream, provider)).Err()
}

// ReleaseLater is Release without waiting: the release is queued (behind
// every call queued before it) and sent within the timeout; onErr, called
// from the batcher, gets its failure (it must not block).
func (s *Store) ReleaseLater(upstream, provider string, onErr func(error)) {
	c := s.releaseCall(s.deadline(context.Background()), upstream, provider)
	c.onErr = onErr
	s.b.queue(c)
}

func (s *Store) releaseCall(until time.Time, upstream, provider string) *call {
	p := s.pairOf(upstream, provider)
	return &call{script: releaseScript, keys: p.releaseKeys, args: p.releaseArgs,
		kind: releaseCall, pair: p.id, until: until}
}

// Renew sets this instance's counts to what it holds and renews its leases.
func (s *Store) Renew(ctx context.Context, upstreams, providers map[string]int64) error {
	return s.QueueRenew(upstreams, providers).Wait(ctx)
}

// Queued is a call queued on the batcher, whose reply is still to come.
type Queued struct {
	c *call
}

// Wait returns the queued call's outcome, waiting at most until ctx ends
// or the call's timeout passes.
func (q Queued) Wait(ctx context.Context) error {
	if q.c == nil {
		return nil
	}
	ctx, cancel := context.WithDeadline(ctx, q.c.until)
	defer cancel()
	select {
	case cmd := <-q.c.reply:
		return cmd.Err()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// QueueRenew queues Renew and returns at once: the renewal reaches Redis
// after every call queued before it (a caller can stop ordering its calls
// against the renewal as soon as it is queued) and before every later one.
func (s *Store) QueueRenew(upstreams, providers map[string]int64) Queued {
	if len(upstreams)+len(providers) == 0 {
		return Queued{}
	}
	keys := make([]string, 0, 2*(len(upstreams)+len(providers)))
	args := []any{s.instance, s.ttlMS}
	for id, n := range upstreams {
		h, z := s.upKeys(id)
		keys = append(keys, h, z)
		args = append(args, n)
	}
	for id, n := range providers {
		h, z := s.provKeys(id)
		keys = append(keys, h, z)
		args = append(args, n)
	}
	c := &call{script: renewScript, keys: keys, args: args, until: s.deadline(context.Background()),
		reply: make(chan *redis.Cmd, 1)}
	s.b.queue(c)
	return Queued{c}
}

// Used returns the fleet-wide in-flight count of each upstream and provider.
func (s *Store) Used(ctx context.Context, upstreams, providers []string) (map[string]int64, map[string]int64, error) {
	if len(upstreams)+len(providers) == 0 {
		return nil, nil, nil
	}
	var keys []string
	for _, id := range upstreams {
		h, z := s.upKeys(id)
		keys = append(keys, h, z)
	}
	for _, id := range providers {
		h, z := s.provKeys(id)
		keys = append(keys, h, z)
	}
	vals, err := s.run(ctx, usedScript, keys).Int64Slice()
	if err != nil {
		return nil, nil, err
	}
	if len(vals) != len(upstreams)+len(providers) {
		return nil, nil, errors.New("redis: unexpected answer to the usage script")
	}
	ups, provs := make(map[string]int64, len(upstreams)), make(map[string]int64, len(providers))
	for i, id := range upstreams {
		ups[id] = vals[i]
	}
	for i, id := range providers {
		provs[id] = vals[len(upstreams)+i]
	}
	return ups, provs, nil
}

// Cooling is a backoff scope's state after a shared change, relative to now.
type Cooling struct {
	Left   time.Duration // cooling left
	Streak int64
	Hold   time.Duration // Retry-After hold left
}

// Fail records a failure on a backoff scope (the doubling happens on the
// server), or with hold > 0 a Retry-After hold, and announces it.
func (s *Store) Fail(ctx context.Context, scope string, capacity, hold time.Duration) (Cooling, error) {
	vals, err := s.run(ctx, coolScript, []string{s.prefix + "backoff:" + scope},
		capacity.Milliseconds(), hold.Milliseconds(), s.WakeChannel(), scope).Int64Slice()
	if err != nil {
		return Cooling{}, err
	}
	if len(vals) != 3 {
		return Cooling{}, errors.New("redis: unexpected answer to the cooling script")
	}
	return Cooling{Left: time.Duration(vals[0]) * time.Millisecond, Streak: vals[1],
		Hold: time.Duration(vals[2]) * time.Millisecond}, nil
}

// Succeed ends a backoff scope's streak and announces it; it returns the
// Retry-After hold still running.
func (s *Store) Succeed(ctx context.Context, scope string) (time.Duration, error) {
	ms, err := s.run(ctx, successScript, []string{s.prefix + "backoff:" + scope}, s.WakeChannel(), scope).Int64()
	return time.Duration(ms) * time.Millisecond, err
}

// Backoffs reads the given backoff scopes.
func (s *Store) Backoffs(ctx context.Context, scopes []string) ([]Cooling, error) {
	if len(scopes) == 0 {
		return nil, nil
	}
	keys := make([]string, len(scopes))
	for i, sc := range scopes {
		keys[i] = s.prefix + "backoff:" + sc
	}
	vals, err := s.run(ctx, backoffsScript, keys).Int64Slice()
	if err != nil {
		return nil, err
	}
	if len(vals) != 3*len(scopes) {
		return nil, errors.New("redis: unexpected answer to the backoff script")
	}
	out := make([]Cooling, len(scopes))
	for i := range out {
		out[i] = Cooling{Left: time.Duration(vals[3*i]) * time.Millisecond, Streak: vals[3*i+1],
			Hold: time.Duration(vals[3*i+2]) * time.Millisecond}
	}
	return out, nil
}

// Ping checks that Redis answers.
func (s *Store) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	return s.c.Ping(ctx).Err()
}

// Event is a message on the wake channel.
type Event struct {
	Kind   string // "release", "cool" or "ok"
	Scope  string // cool, ok: the backoff scope
	Left   time.Duration
	Streak int64
	Hold   time.Duration
}

// Listen delivers the wake channel's messages until ctx ends. The client
// resubscribes by itself after a connection loss (messages sent meanwhile
// are lost: the caller polls as well).
func (s *Store) Listen(ctx context.Context, deliver func(Event)) {
	sub := s.c.Subscribe(ctx, s.WakeChannel())
	stop := context.AfterFunc(ctx, func() { _ = sub.Close() }) // ends the range below
	defer stop()
	for m := range sub.Channel(redis.WithChannelHealthCheckInterval(5 * time.Second)) {
		deliver(parseEvent(m.Payload))
	}
}

// parseEvent reads "release", "cool <left ms> <streak> <hold ms> <scope>"
// or "ok <hold ms> <scope>" (the scope last: an id may hold spaces).
func parseEvent(p string) Event {
	kind, rest, _ := strings.Cut(p, " ")
	ev := Event{Kind: kind}
	num := func(s string) int64 {
		n, _ := strconv.ParseInt(s, 10, 64)
		return n
	}
	switch kind {
	case "cool":
		if f := strings.SplitN(rest, " ", 4); len(f) == 4 {
			ev.Left, ev.Streak, ev.Hold = time.Duration(num(f[0]))*time.Millisecond, num(f[1]), time.Duration(num(f[2]))*time.Millisecond
			ev.Scope = f[3]
		}
	case "ok":
		if f := strings.SplitN(rest, " ", 2); len(f) == 2 {
			ev.Hold, ev.Scope = time.Duration(num(f[0]))*time.Millisecond, f[1]
		}
	}
	return ev
}
