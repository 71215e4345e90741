package redisstate

import (
	"context"
	"errors"
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
// each caller its own reply. Nothing waits to fill a batch: a call queued on
// an idle batcher is sent at once; calls queued while a batch is in flight
// go out together with the next one, maxBatch at most.
//
// The queue is FIFO and batches are sent one after the other, so calls
// reach Redis in the order they were queued. The fleet relies on that: a
// release is queued only after its claim's reply, and a renewal queued after
// a release is applied after it.

// maxBatch bounds one pipeline, so that one batch's replies never hold the
// calls behind them for long.
const maxBatch = 128

// ErrClosed is the error of a call queued on a closed store.
var ErrClosed = errors.New("redis: state store closed")

// errExpired is the answer of a call whose deadline passed before its batch
// went out: it was not sent (its caller has given up on it already).
var errExpired = errors.New("redis: call not sent within the timeout")

// call is one queued script call.
type call struct {
	script *redis.Script
	keys   []string
	args   []any
	// release marks a release: only the last release of a batch publishes
	// the wake message (one message wakes every queue), the others run
	// with an empty channel argument.
	release bool
	until   time.Time // not sent after this
	// Exactly one of reply (a caller waits) and onErr (a call nobody waits
	// for, e.g. a release; nil ignores the error) is used.
	reply chan *redis.Cmd
	onErr func(error)
}

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
	c       *redis.Client
	timeout time.Duration

	mu      sync.Mutex
	pending []*call
	closed  bool

	sent atomic.Int64 // pipelines sent (round trips), for the tests and benchmarks

	kick chan struct{} // one token: something is pending
	quit chan struct{}
	done chan struct{}
}

func newBatcher(c *redis.Client, timeout time.Duration) *batcher {
	b := &batcher{c: c, timeout: timeout, kick: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{})}
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
// reply then comes to nobody: the channel has room for it).
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
// each bounded by the timeout, so a release queued just before a shutdown
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
		if now.After(c.until) {
			c.finish(failedCmd(errExpired))
			continue
		}
		live = append(live, c)
	}
	if len(live) == 0 {
		return
	}
	lastRelease := -1
	for i, c := range live {
		if c.release {
			lastRelease = i
		}
	}
	args := func(i int) []any {
		c := live[i]
		if c.release && i != lastRelease {
			return []any{c.args[0], ""} // the last release of the batch publishes for all
		}
		return c.args
	}

	ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
	defer cancel()
	b.sent.Add(1)
	if len(live) == 1 { // the idle case: a plain call costs less than a pipeline of one
		c := live[0]
		c.finish(c.script.Run(ctx, b.c, c.keys, args(0)...))
		return
	}
	cmds := make([]*redis.Cmd, len(live))
	// Exec's error is the first failed command's: each command has its own.
	_, _ = b.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, c := range live {
			cmds[i] = c.script.EvalSha(ctx, p, c.keys, args(i)...)
		}
		return nil
	})
	// A script the server does not know (a restart, SCRIPT FLUSH) is sent
	// again in full, which also caches it for the next batches.
	var again []int
	for i, cmd := range cmds {
		if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		b.sent.Add(1)
		_, _ = b.c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, i := range again {
				cmds[i] = live[i].script.Eval(ctx, p, live[i].keys, args(i)...)
			}
			return nil
		})
	}
	for i, c := range live {
		c.finish(cmds[i])
	}
}
