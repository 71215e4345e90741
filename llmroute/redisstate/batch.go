package redisstate

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Group commit. A script call costs Caddy tens of microseconds, most of it
// the write and read syscalls of its round trip, whatever the script does;
// under load that made state redis cost about 1.6× the CPU of state memory
// per request. So every script call of a store goes through one batcher:
// callers queue their call and one goroutine sends everything queued as one
// pipeline (each EVALSHA still atomic on its own on the server), then hands
// each caller its own reply. No timer waits to fill a batch: a call queued
// on an idle batcher is sent at once; calls queued while a batch is in
// flight, or by the goroutines that ran while the batcher yielded before
// taking its batch (flush), go out together with the next one, maxBatch at
// most.
//
// The queue is FIFO and batches are sent one after the other, so calls
// reach Redis in the order they were queued, but for the claims and
// releases pending together between two other calls, which are merged per
// pair (see plan). The fleet relies on that: a release is queued only
// after its claim's reply, and a renewal queued after a release is applied
// after it.

// maxBatch bounds one pipeline, so that one batch's replies never hold the
// calls behind them for long.
const maxBatch = 128

// ErrClosed is the error of a call queued on a closed store.
var ErrClosed = errors.New("redis: state store closed")

// errExpired is the answer of a call whose deadline passed before its batch
// went out: it was not sent (its caller has given up on it already).
var errExpired = errors.New("redis: call not sent: too little of its timeout left")

// call is one queued script call.
type call struct {
	script *redis.Script
	keys   []string
	args   []any
	// kind and pair let the batcher merge calls (see plan): claims and
	// releases of the same pair (pair names the keys, and for a claim its
	// limits) queued together become one script call each.
	kind  kind
	pair  string
	until time.Time // not sent after this
	// Exactly one of reply (a caller waits) and onErr (a call nobody waits
	// for, e.g. a release; nil ignores the error) is used.
	reply chan *redis.Cmd
	onErr func(error)
}

type kind uint8

const (
	plainCall kind = iota
	claimCall
	releaseCall
)

// finish delivers the call's outcome; it never blocks the batcher (reply
// has room for its one answer).
func (c *call) finish(cmd *redis.Cmd) {
	if c.reply != nil {
		c.reply <- cmd
		return
	}
	if err := cmd.Err(); err != nil && c.onErr != nil {
		c.onErr(err)
	}
}

// failedCmd is a reply that carries only err.
func failedCmd(err error) *redis.Cmd {
	cmd := redis.NewCmd(context.Background())
	cmd.SetErr(err)
	return cmd
}

type batcher struct {
	c *redis.Client
	// minLeft is the least time a call must have left to be sent: its
	// deadline bounds its whole batch (send).
	minLeft time.Duration

	mu      sync.Mutex
	pending []*call
	closed  bool

	loaded map[*redis.Script]bool // scripts seen to run; the batcher goroutine's own

	sent    atomic.Int64 // pipelines sent (round trips), for the tests and benchmarks
	scripts atomic.Int64 // script calls sent (merged calls count once), likewise

	kick chan struct{} // one token: something is pending
	quit chan struct{}
	done chan struct{}
}

func newBatcher(c *redis.Client, minLeft time.Duration) *batcher {
	b := &batcher{c: c, minLeft: minLeft, loaded: map[*redis.Script]bool{}, kick: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{})}
	go b.run()
	return b
}

// queue adds a call; it does not block. On a closed batcher the call fails
// at once with ErrClosed.
func (b *batcher) queue(c *call) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		c.finish(failedCmd(ErrClosed))
		return
	}
	b.pending = append(b.pending, c)
	b.mu.Unlock()
	select {
	case b.kick <- struct{}{}:
	default: // the batcher is awake already, it takes this call too
	}
}

// do queues a call and waits for its reply, at most until ctx ends (the
// reply then comes to nobody: the channel has room for it) or the call's
// deadline passes: it is not sent after it, and its batch is bounded by
// it (send).
func (b *batcher) do(ctx context.Context, c *call) *redis.Cmd {
	c.reply = make(chan *redis.Cmd, 1)
	b.queue(c)
	select {
	case cmd := <-c.reply:
		return cmd
	case <-ctx.Done():
		return failedCmd(ctx.Err())
	}
}

// close stops queueing, sends what is pending (one last round of batches,
// each bounded by its calls' deadlines, so a release queued just before a shutdown
// still reaches Redis when it answers) and returns once the batcher is gone.
func (b *batcher) close() {
	b.mu.Lock()
	already := b.closed
	b.closed = true
	b.mu.Unlock()
	if !already {
		close(b.quit)
	}
	<-b.done
}

func (b *batcher) run() {
	defer close(b.done)
	for {
		select {
		case <-b.kick:
			b.flush()
		case <-b.quit:
			b.flush() // nothing is queued after closed is set: this drains all
			return
		}
	}
}

// flush sends batches until nothing is pending.
func (b *batcher) flush() {
	for {
		// Let the goroutines that can run now run first: under load they
		// are the requests about to queue their claims and releases, which
		// then go out in this batch instead of the next round trip. When
		// nothing else can run, this returns at once (no timer, no wait).
		runtime.Gosched()
		b.mu.Lock()
		n := min(len(b.pending), maxBatch)
		batch := make([]*call, n)
		copy(batch, b.pending)
		rest := copy(b.pending, b.pending[n:])
		clear(b.pending[rest:]) // no reference kept to a finished call
		b.pending = b.pending[:rest]
		b.mu.Unlock()
		if n == 0 {
			return
		}
		b.send(batch)
	}
}

// send runs one batch as one pipeline and delivers every reply.
func (b *batcher) send(batch []*call) {
	now := time.Now()
	live := batch[:0]
	for _, c := range batch {
		// One call about to expire would cut the whole batch short: it is
		// not sent (nor would it have had time for an answer).
		if c.until.Sub(now) < b.minLeft {
			c.finish(failedCmd(errExpired))
			continue
		}
		live = append(live, c)
	}
	if len(live) == 0 {
		return
	}
	ops := plan(live)
	// The batch is bounded by its earliest deadline (at least minLeft
	// away), so that no caller waits past its own timeout: a call queued
	// while this batch is in flight has a later one than every call in it
	// (one timeout for all), and its own batch is bounded by it again, or
	// it is not sent. The callers thus need no timer of their own (one
	// whose ctx has an earlier deadline stops waiting at ctx.Done).
	deadline := live[0].until
	for _, c := range live[1:] {
		if c.until.Before(deadline) {
			deadline = c.until
		}
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	b.sent.Add(1)
	b.scripts.Add(int64(len(ops)))
	if len(ops) == 1 { // the idle case: a plain call costs less than a pipeline of one
		o := ops[0]
		o.finish(o.script.Run(ctx, b.c, o.keys, o.args...))
		return
	}
	cmds := make([]*redis.Cmd, len(ops))
	// A script not yet seen to run goes in full (which caches it on the
	// server): a NOSCRIPT would make it run after the calls behind it.
	// Exec's error is the first failed command's: each command has its own.
	_, _ = b.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, o := range ops {
			if b.loaded[o.script] {
				cmds[i] = o.script.EvalSha(ctx, p, o.keys, o.args...)
			} else {
				cmds[i] = o.script.Eval(ctx, p, o.keys, o.args...)
			}
		}
		return nil
	})
	// A script the server forgot (a restart, SCRIPT FLUSH) is sent again
	// in full, after the others of the batch (the next renewal heals a
	// count this reorders).
	var again []int
	for i, cmd := range cmds {
		switch err := cmd.Err(); {
		case redis.HasErrorPrefix(err, "NOSCRIPT"):
			again = append(again, i)
			delete(b.loaded, ops[i].script)
		case err == nil:
			b.loaded[ops[i].script] = true
		}
	}
	if len(again) > 0 {
		b.sent.Add(1)
		_, _ = b.c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, i := range again {
				cmds[i] = ops[i].script.Eval(ctx, p, ops[i].keys, ops[i].args...)
			}
			return nil
		})
	}
	for i, o := range ops {
		o.finish(cmds[i])
	}
}

// op is one script call sent: a queued call, or several merged.
type op struct {
	script  *redis.Script
	keys    []string
	args    []any
	kind    kind
	members []*call // the queued calls it answers, in queue order
}

// plan turns a batch into the script calls to send. Each maximal run of
// claims and releases between two other calls (a renewal, a read, a
// backoff: these keep their place) is sent as its releases, one call per
// pair with the count, then its claims, one "claim up to k" per pair (and
// limits), each merged call where its pair first appears in the run.
//
// Why the order inside a run may change: the calls of a run were all
// pending at once, so none of their callers has seen another's outcome,
// except that a release is queued only after its own claim's reply, which
// is in an earlier batch. Releases commute among themselves (a count moved
// down by the sum; a field at or below zero is dropped either way), and
// claims of one pair in one call are granted in queue order, exactly as
// one by one. Moving a release before a claim of the same run only frees a
// slot sooner for it, as if it had been queued first; nothing crosses a
// renewal, whose absolute counts must see every call queued before it and
// none after. (A release whose claim Redis never saw, one made while it
// was unreachable, may end one off either way, as it could before: the
// next renewal writes the true count.)
//
// The last release call of the batch publishes the wake message for all.
func plan(live []*call) []op {
	ops := make([]op, 0, len(live))
	for i := 0; i < len(live); {
		if live[i].kind == plainCall {
			c := live[i]
			ops = append(ops, op{script: c.script, keys: c.keys, args: c.args, members: []*call{c}})
			i++
			continue
		}
		j := i
		for j < len(live) && live[j].kind != plainCall {
			j++
		}
		ops = appendMerged(ops, live[i:j], releaseCall)
		ops = appendMerged(ops, live[i:j], claimCall)
		i = j
	}
	last := -1
	for i := range ops {
		if ops[i].kind == releaseCall {
			last = i
		}
	}
	for i := range ops {
		o := &ops[i]
		switch o.kind {
		case releaseCall: // instance, count, wake channel ("" but for the last)
			ch := o.members[0].args[1]
			if i != last {
				ch = ""
			}
			o.args = []any{o.members[0].args[0], len(o.members), ch}
		case claimCall: // instance, ttl, limit, capacity, then k
			o.args = append(append(make([]any, 0, 5), o.members[0].args...), len(o.members))
		}
	}
	return ops
}

// appendMerged appends one op per pair of the run's calls of kind k, in
// the order the pairs first appear; each op's members in queue order.
func appendMerged(ops []op, run []*call, k kind) []op {
	first := len(ops)
	for _, c := range run {
		if c.kind != k {
			continue
		}
		merged := false
		for i := first; i < len(ops); i++ {
			if ops[i].members[0].pair == c.pair {
				ops[i].members = append(ops[i].members, c)
				merged = true
				break
			}
		}
		if !merged {
			ops = append(ops, op{script: c.script, keys: c.keys, kind: k, members: []*call{c}})
		}
	}
	return ops
}

// finish hands each member its outcome: a merged claim's {granted,
// reason} becomes Claimed for the first granted members and the reason
// for the others.
func (o *op) finish(cmd *redis.Cmd) {
	if o.kind != claimCall || cmd.Err() != nil {
		for _, c := range o.members {
			c.finish(cmd)
		}
		return
	}
	vals, err := cmd.Int64Slice()
	if err == nil && len(vals) != 2 {
		err = errors.New("redis: unexpected answer to the claim script")
	}
	// Two answers shared by the members (a reply is only read).
	granted, refused := redis.NewCmd(context.Background()), redis.NewCmd(context.Background())
	if err != nil {
		granted.SetErr(err)
		refused.SetErr(err)
	} else {
		granted.SetVal(int64(Claimed))
		refused.SetVal(vals[1])
	}
	for i, c := range o.members {
		if err == nil && int64(i) < vals[0] {
			c.finish(granted)
		} else {
			c.finish(refused)
		}
	}
}
