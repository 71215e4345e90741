package ledger

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/llm-route/caddy-llm-route/llmroute/redisstate"
)

// Shared state across instances. The memory backend is the
// pooled state of state.go and capacity.go, as it always was; the redis
// backend sits in front of it: every claim is taken locally first (this
// instance alone never exceeds a limit either) and then fleet-wide in Redis,
// rolled back if the fleet is full. The local count of this instance is
// therefore always exact, which is what makes the fallback cheap: while
// Redis is away, claims stop at the local check, and when it answers again
// one renewal writes this instance's true counts back.
//
// The request path reaches a fleet only through its handler's ledger
// (ledger.go, redisLedger); a fleet renews, polls and listens for exactly
// the upstreams, providers and backoff scopes its handlers registered, so
// a memory handler of the same process never reaches Redis.

// instanceID names this process in Redis. It is process-wide so a reload
// keeps counting in the same hash fields.
var instanceID = func() string {
	host, _ := os.Hostname()
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}()

// stateErrors counts failed or timed-out calls to the state backend.
var stateErrors = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "llm_proxy_state_errors_total",
	Help: "Calls to the shared state backend (Redis) that failed or timed out.",
})

// fleets pools the redis fleets by their state block (fleetPoolKey): a
// reload that keeps the block keeps the fleet — its client, connections
// and background work — so the requests of the old config go on claiming,
// releasing and settling through a live client. A fleet whose last handler
// is cleaned up is destructed: its listener and poll stop, and its client
// closes once the last request holding it is done (fleet.use).
var fleets = caddy.NewUsagePool()

// fleet is the redis state of the handlers sharing one state block.
type fleet struct {
	store   *redisstate.Store
	logger  atomic.Pointer[zap.Logger] // the latest started config's
	reject  bool                       // on_state_error reject
	address string
	ttl     time.Duration
	poolKey string

	// mu orders claims and releases (read side) against a renewal (write
	// side), which rewrites this instance's counts from the local ones: a
	// count read between a local and a Redis step would be off by one.
	mu sync.RWMutex
	// healthy is false while Redis is unreachable: claims then use the local
	// accounting only, without a Redis call that would wait for the timeout.
	healthy atomic.Bool
	// recheck wakes maintain after a failed call on the request path, so
	// that a passing glitch does not keep the instance on its fallback
	// until the next renewal (lease_ttl/3).
	recheck chan struct{}

	// users keeps the client open: one for the pool (given back by
	// Destruct), one per call in progress and per shared reservation not
	// yet settled. At zero the client is closed for good; use then fails.
	users atomic.Int64
	// retired: no handler uses the fleet any more, only requests that
	// started under it; its renewals then only keep their reservations.
	retired atomic.Bool
	// settleLater holds the key settlements Redis did not take, sent
	// again with each renewal until it does.
	settleLater pendingSettles

	// wake is the queue's hook, given by the first handler to start: a
	// release elsewhere, a renewal that deferred a pass, the poll.
	wake func()
	// scopes is what the fleet's handlers count in it.
	scopes fleetScopes

	life         sync.Mutex // orders start against Destruct and the close
	started      bool
	stopMaintain context.CancelFunc
	maintainDone chan struct{}
	stopListen   context.CancelFunc
	listenDone   chan struct{}
}

// RedisOptions is a resolved redis state block: the connection, the
// lease TTL, and what happens while Redis does not answer.
type RedisOptions struct {
	redisstate.Options
	// Reject refuses requests while Redis is unreachable (on_state_error
	// reject); false falls back to this process's accounting.
	Reject bool
}

// fleetPoolKey names a state block by everything a fleet is built from,
// the password only as a hash: a reload that changes any of it (the
// timeout or on_state_error too) gets a fleet of its own.
func fleetPoolKey(o RedisOptions) string {
	pw := sha256.Sum256([]byte(o.Password))
	return strings.Join([]string{"redis", o.Address, o.Username, hex.EncodeToString(pw[:]), strconv.Itoa(o.DB),
		o.Prefix, strconv.FormatBool(o.TLS), o.Timeout.String(), o.LeaseTTL.String(), strconv.FormatBool(o.Reject)}, "\x00")
}

// acquireFleet returns the pooled fleet of the resolved state block o,
// made on first use. The caller gives it back with fleets.Delete(f.poolKey).
func acquireFleet(o RedisOptions, logger *zap.Logger) *fleet {
	key := fleetPoolKey(o)
	v, _, _ := fleets.LoadOrNew(key, func() (caddy.Destructor, error) {
		f := newFleet(o, logger)
		f.poolKey = key
		return f, nil
	})
	return v.(*fleet)
}

func newFleet(o RedisOptions, logger *zap.Logger) *fleet {
	f := &fleet{
		store:   redisstate.Open(o.Options, instanceID),
		reject:  o.Reject,
		address: o.Address,
		ttl:     o.LeaseTTL,
		recheck: make(chan struct{}, 1),
	}
	f.logger.Store(logger)
	f.users.Store(1) // the pool's
	return f
}

// start runs the background work once, when the first of the fleet's
// configs starts: health and renewal, the wake listener, the slow poll.
// Redis being down does not stop it: the fleet starts in fallback and
// comes back by itself. Later configs only bring their logger.
func (f *fleet) start(logger *zap.Logger, wake func()) {
	f.logger.Store(logger)
	f.life.Lock()
	defer f.life.Unlock()
	if f.started || f.retired.Load() {
		return
	}
	f.started = true
	f.wake = wake // before the goroutines that call it
	renewing, stopMaintain := context.WithCancel(context.Background())
	maintainDone := make(chan struct{})
	f.stopMaintain, f.maintainDone = stopMaintain, maintainDone
	go func() { defer close(maintainDone); f.maintain(renewing) }()
	listening, stopListen := context.WithCancel(context.Background())
	listenDone := make(chan struct{})
	f.stopListen, f.listenDone = stopListen, listenDone
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); f.store.Listen(listening, f.onEvent) }()
	go func() { defer wg.Done(); f.poll(listening) }()
	go func() { wg.Wait(); close(listenDone) }()
}

// Destruct implements caddy.Destructor: the fleet's last handler is gone.
// The listener and the poll stop now (a running config on Redis has a
// fleet of its own doing that); the client, and the renewal of the
// reservations still held, stay until the last request is done.
func (f *fleet) Destruct() error {
	f.life.Lock()
	f.retired.Store(true)
	stop, done := f.stopListen, f.listenDone
	f.life.Unlock()
	if stop != nil {
		stop()
		<-done
	}
	f.done()
	return nil
}

// use holds the client open for one call or one reservation; false when
// it is closed already (a request of a config whose fleet is gone, which
// then uses this instance's own accounting).
func (f *fleet) use() bool {
	for {
		n := f.users.Load()
		if n <= 0 {
			return false
		}
		if f.users.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// done gives back a hold of use (or the pool's). The last one stops the
// renewals (a call in progress is bounded by the state timeout) and closes
// the client.
func (f *fleet) done() {
	if f.users.Add(-1) != 0 {
		return
	}
	f.life.Lock()
	stop, wait := f.stopMaintain, f.maintainDone
	f.life.Unlock()
	if stop != nil {
		stop()
		<-wait
	}
	_ = f.store.Close()
}

// maintain renews the leases every third of lease_ttl while Redis answers,
// and checks every second while it does not, or within a second of a
// failed call elsewhere (recheck).
func (f *fleet) maintain(ctx context.Context) {
	t := time.NewTimer(0)
	defer t.Stop()
	next := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-f.recheck:
			// Not at once: a Redis that is really gone would be asked
			// again right away, and a flapping one logged at every call.
			if soon := time.Now().Add(recheckDelay); soon.Before(next) {
				next = soon
				t.Reset(recheckDelay)
			}
			continue
		case <-t.C:
		}
		wait := f.ttl / 3
		if err := f.renew(ctx); err != nil {
			f.failed(err)
			wait = min(wait, time.Second)
		} else if f.healthy.CompareAndSwap(false, true) {
			// Good news, at start and after an outage alike: only the
			// loss (failed) is worth an operator's attention.
			f.logger.Load().Info("shared state reachable, using it", zap.String("backend", "redis"), zap.String("address", f.address))
		}
		next = time.Now().Add(wait)
		t.Reset(wait)
	}
}

// recheckDelay is how soon maintain looks at Redis again after a failed
// call outside it.
const recheckDelay = time.Second

// renew writes this instance's true slot counts and pushes its leases on,
// then the leases of the key reservations still held. A retired fleet
// only does the latter: the running config counts the slots of all
// requests in its own fleet, and this one's slot leases may expire.
func (f *fleet) renew(ctx context.Context) error {
	if !f.retired.Load() {
		if err := f.renewSlots(ctx); err != nil {
			return err
		}
	}
	if err := f.store.RenewKeyLeases(ctx); err != nil {
		return err
	}
	return f.settleLater.retry(ctx, f)
}

// renewSlots holds the write lock only while it reads the counts and
// queues the renewal: the store sends its calls in order, so the claims and
// releases queued before are applied before it, and those queued after,
// after it. Only the fleet's own scopes are written (fleetScopes.counts).
func (f *fleet) renewSlots(ctx context.Context) error {
	f.mu.Lock()
	ups, provs := f.scopes.counts()
	q := f.store.QueueRenew(ups, provs)
	f.mu.Unlock()
	f.wake() // a pass the renewal deferred (ledger.pin)
	return q.Wait(ctx)
}

// failed records a Redis error: counted always, logged at ERROR once per
// transition into the fallback.
func (f *fleet) failed(err error) {
	stateErrors.Inc()
	select {
	case f.recheck <- struct{}{}:
	default:
	}
	if f.healthy.CompareAndSwap(true, false) {
		mode := "local accounting"
		if f.reject {
			mode = "rejecting requests"
		}
		f.logger.Load().Error("shared state unreachable, "+mode+" until it answers", zap.String("backend", "redis"),
			zap.String("address", f.address), zap.Error(err))
	}
}

// poll is the safety net of the pub/sub messages: a release whose message
// was lost (a late subscription, a reconnect) still admits a waiter within
// a second, and a cooling another instance started is read within one.
func (f *fleet) poll(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f.syncBackoffs(ctx)
			f.wake()
		}
	}
}

// syncBackoffs reads the fleet's backoff scopes and upstream holds from
// Redis and applies the coolings running there (only ever growing the local
// ones).
func (f *fleet) syncBackoffs(ctx context.Context) {
	if !f.healthy.Load() {
		return
	}
	states, holds, keys := f.scopes.cooling()
	if len(states)+len(holds)+len(keys) == 0 {
		return
	}
	scopes := make([]string, 0, len(states)+len(holds)+len(keys))
	for _, b := range states {
		scopes = append(scopes, b.scope)
	}
	for _, s := range holds {
		scopes = append(scopes, holdScope(s.id))
	}
	for _, k := range keys {
		scopes = append(scopes, k.scope)
	}
	got, err := f.store.Backoffs(ctx, scopes)
	if err != nil {
		if ctx.Err() == nil {
			f.failed(err)
		}
		return
	}
	now := time.Now()
	for i, c := range got[len(states) : len(states)+len(holds)] {
		if c.Left > 0 {
			holds[i].holdUntil(now.Add(c.Left).UnixNano())
		}
	}
	for i, c := range got[len(states)+len(holds):] {
		if c.Left > 0 {
			keys[i].coolUntil(now.Add(c.Left).UnixNano())
		}
	}
	for i, c := range got[:len(states)] {
		// Tolerance: the same cooling, read again, differs by the latency;
		// it must not count as a new one (that would put probes off).
		if c.Left > states[i].remaining(now)+250*time.Millisecond {
			states[i].applyFleet(redisstate.Event{Kind: "cool", Left: c.Left, Streak: c.Streak, Hold: c.Hold}, now)
		}
	}
}

// onEvent applies a message of another instance (or this one) to the
// fleet's own scopes.
func (f *fleet) onEvent(ev redisstate.Event) {
	switch ev.Kind {
	case "release":
		f.wake()
	case "cool", "ok":
		if strings.HasPrefix(ev.Scope, "key/") {
			if k := f.scopes.key(ev.Scope); k != nil && ev.Kind == "cool" {
				k.coolUntil(time.Now().Add(ev.Left).UnixNano())
			}
		} else if id, ok := strings.CutPrefix(ev.Scope, "hold/"); ok {
			if s := f.scopes.upstream(id); s != nil && ev.Kind == "cool" {
				s.holdUntil(time.Now().Add(ev.Left).UnixNano())
			}
		} else if b := f.scopes.backoff(ev.Scope); b != nil {
			b.applyFleet(ev, time.Now())
		}
	}
}

// tryClaim claims locally, then fleet-wide. dispatch tells the caller to
// wake the queue once it no longer holds the read lock (a rollback freed a
// slot a waiter may have seen taken).
func (f *fleet) tryClaim(u *Upstream) (n int64, ok, dispatch bool) {
	if !f.use() {
		return u.ClaimLocal() // a reload has just switched this fleet off
	}
	f.mu.RLock()
	n, ok, dispatch = u.ClaimLocal()
	if !ok {
		f.mu.RUnlock()
		f.done()
		return n, false, dispatch
	}
	if f.claimShared(u) {
		return n, true, false
	}
	return n - 1, false, true
}

// claimShared claims fleet-wide what u.ClaimLocal has claimed in this
// process, and rolls the local claim back if the fleet is full (or Redis
// does not answer and on_state_error is reject). The caller holds a use of
// f and f.mu's read lock, taken before the local claim; claimShared gives
// both back. It makes the Redis call, so it never runs under the
// scheduler's lock (Ledger.Pin, Ledger.Finish).
func (f *fleet) claimShared(u *Upstream) bool {
	defer f.done()
	defer f.mu.RUnlock()
	if !f.healthy.Load() {
		if f.reject {
			u.UnclaimLocal()
			return false
		}
		return true
	}
	v, err := f.store.Claim(context.Background(), u.ID, u.Provider, fleetLimit(u.Limit), fleetLimit(u.Capacity))
	switch {
	case err != nil:
		f.failed(err)
		if f.reject {
			u.UnclaimLocal()
			return false
		}
		return true
	case v != redisstate.Claimed:
		u.UnclaimLocal()
		full := FleetUpstreamFull
		if v == redisstate.ProviderFull {
			full = FleetProviderFull
		}
		u.State.fleetFull.Store(full)
		return false
	}
	if u.State.fleetFull.Load() != FleetFree { // a load, not a store, on the hot path
		u.State.fleetFull.Store(FleetFree)
	}
	return true
}

// release queues the slot's release in Redis without waiting for it, then
// the caller releases locally (which wakes the queue). The request does not
// wait for Redis; the release is queued after its claim's reply, so it
// cannot overtake it, and a failure is handled as on the claim's path.
func (f *fleet) release(u *Upstream) {
	if !f.use() {
		return
	}
	defer f.done()
	f.mu.RLock()
	defer f.mu.RUnlock()
	if !f.healthy.Load() {
		return // the next renewal writes the true count
	}
	f.store.ReleaseLater(u.ID, u.Provider, f.failed)
}

// fleetLimit maps the Unlimited sentinel to the scripts' "none".
func fleetLimit(n int64) int64 {
	if n == Unlimited {
		return -1
	}
	return n
}

// shareBackoff tells the fleet about a failure (hold 0) or a Retry-After
// hold on a backoff scope, off the request path.
func (f *fleet) shareBackoff(scope string, capacity, hold time.Duration) {
	if !f.healthy.Load() {
		return
	}
	go func() {
		if !f.use() {
			return
		}
		defer f.done()
		if _, err := f.store.Fail(context.Background(), scope, capacity, hold); err != nil {
			f.failed(err)
		}
	}()
}

// holdScope names, among the backoff scopes in Redis, the Retry-After hold
// of an upstream without a backoff scope (scopes are "<kind>/<id>"; no kind
// is called hold).
func holdScope(id string) string { return "hold/" + id }

// shareHold tells the fleet that an upstream without a backoff scope asked
// for a pause (Retry-After): the other instances hold it as long.
func (f *fleet) shareHold(id string, d time.Duration) { f.shareBackoff(holdScope(id), 0, d) }

// shareSuccess tells the fleet that a backoff scope recovered.
func (f *fleet) shareSuccess(scope string) {
	if !f.healthy.Load() {
		return
	}
	go func() {
		if !f.use() {
			return
		}
		defer f.done()
		if _, err := f.store.Succeed(context.Background(), scope); err != nil {
			f.failed(err)
		}
	}()
}

// status is the fleet's part of the status (redisLedger.Status).
func (f *fleet) status() Status {
	st := Status{Backend: "redis", Healthy: f.healthy.Load()}
	if !st.Healthy {
		st.Fallback = "local"
		if f.reject {
			st.Fallback = "reject"
		}
	}
	return st
}

// used returns the fleet-wide in-flight counts for the status, or nil
// maps while Redis does not answer.
func (f *fleet) used(upstreams, providers []string) (map[string]int64, map[string]int64) {
	if !f.healthy.Load() || !f.use() {
		return nil, nil
	}
	defer f.done()
	ups, provs, err := f.store.Used(context.Background(), upstreams, providers)
	if err != nil {
		f.failed(err)
		return nil, nil
	}
	return ups, provs
}

// counter is a pooled state with an in-flight count: an upstream's or a
// provider's.
type counter interface {
	comparable
	count() (id string, inflight int64)
}

func (s *UpstreamState) count() (string, int64) { return s.id, s.inflight.Load() }
func (p *ProviderState) count() (string, int64) { return p.id, p.inflight.Load() }

// countInto writes the in-flight count of every registered and every
// draining state into out by id, and lets a draining state at zero go.
func countInto[S counter](out map[string]int64, live map[S]int, draining map[S]bool) {
	for s := range draining {
		id, n := s.count()
		out[id] = n
		if n <= 0 {
			delete(draining, s)
		}
	}
	for s := range live {
		id, n := s.count()
		out[id] = n
	}
}

// fleetScopes are the upstreams, providers and backoff scopes that the
// fleet's handlers count in it, registered when a handler starts and given
// back at its Cleanup. Renewals, the poll and the wake messages touch only
// these: another handler of the process on memory (or on another fleet)
// keeps its counts to itself. An upstream or provider given back with
// requests still in flight is renewed until they end, so a reload that
// drops it leaves no lease behind too early.
type fleetScopes struct {
	mu         sync.Mutex
	ups        map[*UpstreamState]int // by the number of registrations holding it
	provs      map[*ProviderState]int
	backoffs   map[*Backoff]int
	keys       map[*KeyState]int
	drainUps   map[*UpstreamState]bool
	drainProvs map[*ProviderState]bool
}

// fleetRegistration is what one handler registered in its fleet.
type fleetRegistration struct {
	ups      []*UpstreamState
	provs    []*ProviderState
	backoffs []*Backoff
	keys     []*KeyState
}

// add records u's states, each once.
func (r *fleetRegistration) add(u *Upstream) {
	if !slices.Contains(r.ups, u.State) {
		r.ups = append(r.ups, u.State)
	}
	if u.Prov != nil && !slices.Contains(r.provs, u.Prov) {
		r.provs = append(r.provs, u.Prov)
	}
	if u.Backoff != nil && !slices.Contains(r.backoffs, u.Backoff) {
		r.backoffs = append(r.backoffs, u.Backoff)
	}
	for _, k := range u.Keys {
		if !slices.Contains(r.keys, k) {
			r.keys = append(r.keys, k)
		}
	}
}

func (f *fleet) register(r *fleetRegistration)   { f.scopes.apply(r, 1) }
func (f *fleet) unregister(r *fleetRegistration) { f.scopes.apply(r, -1) }

func (c *fleetScopes) apply(r *fleetRegistration, d int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ups == nil {
		c.ups, c.provs, c.backoffs = map[*UpstreamState]int{}, map[*ProviderState]int{}, map[*Backoff]int{}
		c.keys = map[*KeyState]int{}
		c.drainUps, c.drainProvs = map[*UpstreamState]bool{}, map[*ProviderState]bool{}
	}
	for _, s := range r.ups {
		if c.ups[s] += d; c.ups[s] <= 0 {
			delete(c.ups, s)
			c.drainUps[s] = true // renewed while its requests run (counts)
		} else {
			delete(c.drainUps, s)
		}
	}
	for _, p := range r.provs {
		if c.provs[p] += d; c.provs[p] <= 0 {
			delete(c.provs, p)
			c.drainProvs[p] = true
		} else {
			delete(c.drainProvs, p)
		}
	}
	for _, b := range r.backoffs {
		if c.backoffs[b] += d; c.backoffs[b] <= 0 {
			delete(c.backoffs, b)
		}
	}
	for _, k := range r.keys {
		if c.keys[k] += d; c.keys[k] <= 0 {
			delete(c.keys, k)
		}
	}
}

// counts reads the in-flight counts a renewal writes: the registered
// states and the draining ones, which leave once they are at zero (that
// zero is written once more, which clears this instance's lease).
func (c *fleetScopes) counts() (ups, provs map[string]int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ups, provs = make(map[string]int64, len(c.ups)), make(map[string]int64, len(c.provs))
	countInto(ups, c.ups, c.drainUps)
	countInto(provs, c.provs, c.drainProvs)
	return ups, provs
}

// cooling lists the backoff scopes, the upstreams (their Retry-After
// holds) and the provider keys whose coolings the poll reads.
func (c *fleetScopes) cooling() ([]*Backoff, []*UpstreamState, []*KeyState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	bs := make([]*Backoff, 0, len(c.backoffs))
	for b := range c.backoffs {
		bs = append(bs, b)
	}
	us := make([]*UpstreamState, 0, len(c.ups))
	for s := range c.ups {
		us = append(us, s)
	}
	ks := make([]*KeyState, 0, len(c.keys))
	for k := range c.keys {
		ks = append(ks, k)
	}
	return bs, us, ks
}

// key returns the registered provider key named scope, if any.
func (c *fleetScopes) key(scope string) *KeyState {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := range c.keys {
		if k.scope == scope {
			return k
		}
	}
	return nil
}

// upstream returns the registered upstream state of id, if any.
func (c *fleetScopes) upstream(id string) *UpstreamState {
	c.mu.Lock()
	defer c.mu.Unlock()
	for s := range c.ups {
		if s.id == id {
			return s
		}
	}
	return nil
}

// backoff returns the registered backoff scope named scope, if any.
func (c *fleetScopes) backoff(scope string) *Backoff {
	c.mu.Lock()
	defer c.mu.Unlock()
	for b := range c.backoffs {
		if b.scope == scope {
			return b
		}
	}
	return nil
}
