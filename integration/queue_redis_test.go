package integration

// Under state redis the queue claims a slot for its oldest waiter with a
// call to Redis. That call must not be made while the queue is locked:
// a slow Redis would stop every other queue operation of the process
// (requests of any model joining or leaving the queue, the status, explain,
// the queue metrics) for as long as the call takes.

import (
	"context"
	"net/http"
	"testing"
	"time"
)

// TestQueueRedisClaimOutsideTheLock: a waiter is admitted while Redis is
// asleep (DEBUG SLEEP), so its claim waits for Redis; explain, which reads
// the queue and makes no Redis call, keeps answering at once meanwhile.
// The waiter is served once Redis answers, and no slot is left taken.
func TestQueueRedisClaimOutsideTheLock(t *testing.T) {
	rs := startRedis(t)
	g := newGate()
	up := newUpstream(t, g.handler(completion("ok")))
	t.Cleanup(g.open)
	// A state timeout longer than Redis's sleep: the claim waits for it
	// rather than falling back after 50 ms.
	p := startProxy(t, fleetConfig(up, rs.addr, 1, "timeout", "4s", "lease_ttl", "60s"))
	waitHealthy(t, p, true)

	ctx := context.Background()
	held := p.goChat(ctx, chatBody("m", false))
	g.waitArrivals(t, 1)
	waiter := p.goChat(ctx, chatBody("m", false))
	eventually(t, 10*time.Second, "the second request queued", func() bool { return p.queueDepth("m") == 1 })

	c := rs.client()
	defer c.Close()
	slept := make(chan struct{})
	const sleep = 3 * time.Second
	go func() { _ = c.Do(context.Background(), "DEBUG", "SLEEP", sleep.Seconds()).Err(); close(slept) }()
	time.Sleep(200 * time.Millisecond) // the sleep has begun

	// The held request ends: its slot goes to the waiter, whose claim in
	// Redis waits for the sleep to end.
	start := time.Now()
	g.open()
	// Explain reads the queue depth; over 1.5 s of Redis's sleep it must
	// answer each time well within a second (the locked claim held it
	// until Redis woke, ~2.8 s).
	var slowest time.Duration
	for time.Since(start) < 1500*time.Millisecond {
		t0 := time.Now()
		p.explain("m")
		slowest = max(slowest, time.Since(t0))
		time.Sleep(20 * time.Millisecond)
	}
	if slowest > time.Second {
		t.Errorf("explain took %v while a queued claim waited for Redis: the queue was locked during the Redis call", slowest.Round(time.Millisecond))
	}
	if r := await(t, held); r.status != http.StatusOK {
		t.Fatalf("held request: %d %s", r.status, r.body)
	}
	<-slept
	if r := await(t, waiter); r.status != http.StatusOK {
		t.Fatalf("queued request: %d %s", r.status, r.body)
	}
	eventually(t, 10*time.Second, "the slot free again", func() bool {
		s, _ := p.status()
		return s.upstream(t, "u1").Inflight == 0 && p.queueDepth("m") == 0
	})
	t.Logf("slowest explain during the sleep: %v", slowest.Round(time.Millisecond))
}
