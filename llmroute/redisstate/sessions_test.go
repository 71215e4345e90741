package redisstate

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// keys returns n prefix keys of conversation conv, longest first.
func sessKeys(s *Store, conv string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%s-%03d", s.SessionKeyPrefix(), conv, n-1-i)
	}
	return out
}

func TestSessionLongestPrefixWinsAndTTL(t *testing.T) {
	addr := startRedis(t)
	ctx := context.Background()
	a := open(addr, "a", time.Second)
	defer a.Close()
	c := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true})
	defer c.Close()
	const ttl = 6 * time.Hour

	// Nothing known: the candidate names the session.
	k := sessKeys(a, "c", 4) // k[0] longest … k[3] the first turn
	if id, err := a.Session(ctx, k[3:], "first", ttl); err != nil || id != "first" {
		t.Fatalf("first turn: %q, %v; want the candidate", id, err)
	}
	// Two prefixes known under different ids: the longer one wins, and
	// every prefix of the request is recorded under it.
	if err := c.Set(ctx, k[2], "second", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if id, err := a.Session(ctx, k, "new", ttl); err != nil || id != "second" {
		t.Fatalf("with k[2] known as second and k[3] as first: %q, %v; want second (the longest)", id, err)
	}
	for i, key := range k {
		if v, _ := c.Get(ctx, key).Result(); !strings.HasSuffix(v, " second") {
			t.Errorf("prefix %d recorded as %q, want \"<time> second\"", i, v)
		}
		// The TTL is set on new keys and refreshed on known ones (k[2] had
		// a minute).
		if d := c.TTL(ctx, key).Val(); d < ttl-time.Minute || d > ttl {
			t.Errorf("prefix %d TTL = %v, want about %v", i, d, ttl)
		}
	}
	// Under the store's prefix only.
	if n := len(c.Keys(ctx, "x:sess:*").Val()); n != 4 {
		t.Errorf("%d keys under x:sess:, want 4", n)
	}
	if id, err := a.Session(ctx, nil, "lone", ttl); err != nil || id != "lone" {
		t.Errorf("no prefixes: %q, %v; want the candidate without a call", id, err)
	}
}

// A prefix recorded under the id a moment ago is not written again (its
// TTL runs on); once ttl/64 old it is, with the full TTL again.
func TestSessionRefreshesStalePrefixesOnly(t *testing.T) {
	addr := startRedis(t)
	ctx := context.Background()
	a := open(addr, "a", time.Second)
	defer a.Close()
	c := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true})
	defer c.Close()
	k := sessKeys(a, "r", 3)
	pttl := func(key string) time.Duration { return c.PTTL(ctx, key).Val() }

	const long = 6 * time.Hour // stale after about 337 s
	if _, err := a.Session(ctx, k[1:], "id", long); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if id, err := a.Session(ctx, k, "other", long); err != nil || id != "id" {
		t.Fatalf("next turn: %q, %v", id, err)
	}
	if d := pttl(k[0]); d < long-100*time.Millisecond {
		t.Errorf("the new prefix's TTL = %v, want about %v", d, long)
	}
	for _, key := range k[1:] {
		if d := pttl(key); d > long-200*time.Millisecond {
			t.Errorf("a fresh prefix was written again: TTL %v, want below %v", d, long-200*time.Millisecond)
		}
	}

	const short = 64 * time.Second // stale after 1 s
	if _, err := a.Session(ctx, k, "id", short); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond)
	if _, err := a.Session(ctx, k, "id", short); err != nil {
		t.Fatal(err)
	}
	for _, key := range k {
		if d := pttl(key); d < short-500*time.Millisecond || d > short {
			t.Errorf("a stale prefix was not rewritten: TTL %v, want about %v", d, short)
		}
	}
}

// The first turns of one conversation, arriving at the same time on two
// instances with different candidates, get one id: the lookup and the
// recording are one step on the server.
func TestSessionConcurrentFirstTurnsGetOneID(t *testing.T) {
	addr := startRedis(t)
	ctx := context.Background()
	a, b := open(addr, "a", time.Second), open(addr, "b", time.Second)
	defer a.Close()
	defer b.Close()
	for conv := 0; conv < 100; conv++ {
		keys := sessKeys(a, fmt.Sprint("conv", conv), 3)
		var wg sync.WaitGroup
		ids := make([]string, 8)
		errs := make([]error, 8)
		start := make(chan struct{})
		for i := range ids {
			s, cand := a, "from-a"
			if i%2 == 1 {
				s, cand = b, "from-b"
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				ids[i], errs[i] = s.Session(ctx, keys, cand, time.Hour)
			}()
		}
		close(start)
		wg.Wait()
		for i := range ids {
			if errs[i] != nil {
				t.Fatal(errs[i])
			}
			if ids[i] != ids[0] {
				t.Fatalf("conversation %d got two ids: %q", conv, ids)
			}
		}
	}
}

// BenchmarkSession is what a request with a session header pays on the
// redis state: one script call. new: a conversation's first request, every
// prefix written; next-turn: the steady state, where the history is known
// and only the newest prefix is written.
func BenchmarkSession(b *testing.B) {
	addr := startRedis(b)
	s := open(addr, "bench", 30*time.Second)
	defer s.Close()
	ctx := context.Background()
	for _, n := range []int{8, 128} {
		b.Run(fmt.Sprintf("new/prefixes=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			conv := 0
			for b.Loop() {
				b.StopTimer()
				conv++
				keys := sessKeys(s, fmt.Sprint("new", n, "-", conv), n)
				b.StartTimer()
				if id, err := s.Session(ctx, keys, "cand", 6*time.Hour); err != nil || id != "cand" {
					b.Fatal(id, err)
				}
			}
		})
		b.Run(fmt.Sprintf("next-turn/prefixes=%d", n), func(b *testing.B) {
			keys := sessKeys(s, fmt.Sprint("turn", n), n)
			if _, err := s.Session(ctx, keys[1:], "cand", 6*time.Hour); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			turn := 0
			for b.Loop() {
				turn++
				keys[0] = fmt.Sprintf("%sturn-%d", s.SessionKeyPrefix(), turn)
				if id, err := s.Session(ctx, keys, "other", 6*time.Hour); err != nil || id != "cand" {
					b.Fatal(id, err)
				}
			}
		})
	}
}

// A Redis that does not answer holds a session call no longer than the
// timeout; the caller then names the session from its own registry.
func TestSessionBoundedByTimeout(t *testing.T) {
	addr := startRedis(t)
	ctx := context.Background()
	s := Open(Options{Address: addr, Prefix: "x:", Timeout: 50 * time.Millisecond, LeaseTTL: time.Second}, "a")
	defer s.Close()
	keys := sessKeys(s, "slow", 4)
	if _, err := s.Session(ctx, keys, "warm", time.Hour); err != nil { // connected, script loaded
		t.Fatal(err)
	}
	pauseRedis(t, addr, 1500*time.Millisecond)
	start := time.Now()
	_, err := s.Session(ctx, keys, "cand", time.Hour)
	if d := time.Since(start); err == nil || d > time.Second {
		t.Fatalf("session call on a paused Redis: %v after %v; want an error within the 50ms timeout", err, d)
	}
}
