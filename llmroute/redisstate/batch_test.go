package redisstate

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestBatchedClaimsKeepTheLimit sends 200 concurrent claims through one
// store's batcher against a limit of 10: exactly 10 are granted, fleet-wide
// counting says 10, and they went out in fewer pipelines than calls.
func TestBatchedClaimsKeepTheLimit(t *testing.T) {
	addr := startRedis(t)
	s := open(addr, "a", 30*time.Second)
	defer s.Close()
	ctx := context.Background()
	if _, _, err := s.Used(ctx, []string{"u"}, nil); err != nil { // connect first
		t.Fatal(err)
	}
	pipes0 := s.b.sent.Load()

	const n = 200
	var wg sync.WaitGroup
	start := make(chan struct{})
	verdicts := make([]Verdict, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			verdicts[i], errs[i] = s.Claim(ctx, "u", "p", 10, -1)
		}()
	}
	close(start)
	wg.Wait()
	granted := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("claim %d: %v", i, errs[i])
		}
		switch verdicts[i] {
		case Claimed:
			granted++
		case UpstreamFull:
		default:
			t.Fatalf("claim %d: verdict %v", i, verdicts[i])
		}
	}
	if granted != 10 {
		t.Fatalf("%d claims granted against a limit of 10", granted)
	}
	pipes := s.b.sent.Load() - pipes0
	if pipes >= n/2 {
		t.Errorf("%d concurrent claims took %d pipelines: not batched", n, pipes)
	}
	t.Logf("%d claims in %d pipelines", n, pipes)
	wantUsed(t, s, "u", 10)
}

// TestReleaseLaterKeepsOrderAndDrainsOnClose: releases nobody waits for
// reach Redis before a renewal queued after them, one wake message covers a
// batch of them, and Close sends those still queued; a call after Close
// fails with ErrClosed.
func TestReleaseLaterKeepsOrderAndDrainsOnClose(t *testing.T) {
	addr := startRedis(t)
	ctx := context.Background()
	s := open(addr, "a", 30*time.Second)
	for range 5 {
		if v, err := s.Claim(ctx, "u", "p", -1, -1); err != nil || v != Claimed {
			t.Fatal(v, err)
		}
	}
	// Three releases, then a renewal writing the count they leave (2):
	// applied out of order the count would end at -1 (the field dropped,
	// 0) instead of 2.
	var failures []error
	var mu sync.Mutex
	onErr := func(err error) { mu.Lock(); failures = append(failures, err); mu.Unlock() }
	for range 3 {
		s.ReleaseLater("u", "p", onErr)
	}
	if err := s.Renew(ctx, map[string]int64{"u": 2}, map[string]int64{"p": 2}); err != nil {
		t.Fatal(err)
	}
	ups, provs, err := s.Used(ctx, []string{"u"}, []string{"p"})
	if err != nil || ups["u"] != 2 || provs["p"] != 2 {
		t.Fatalf("after 3 queued releases and a renewal: %v %v %v, want u 2, p 2", ups, provs, err)
	}

	// Close drains: both queued releases reach Redis.
	s.ReleaseLater("u", "p", onErr)
	s.ReleaseLater("u", "p", onErr)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if len(failures) != 0 {
		t.Fatalf("queued releases failed: %v", failures)
	}
	mu.Unlock()
	other := open(addr, "b", 30*time.Second)
	defer other.Close()
	ups, provs, err = other.Used(ctx, []string{"u"}, []string{"p"})
	if err != nil || ups["u"] != 0 || provs["p"] != 0 {
		t.Fatalf("after Close: %v %v %v, want u 0, p 0 (releases queued before Close sent)", ups, provs, err)
	}
	if _, err := s.Claim(ctx, "u", "p", -1, -1); !errors.Is(err, ErrClosed) {
		t.Fatalf("claim after Close: %v, want ErrClosed", err)
	}
}

// TestBatchedReleasesPublishOnce: a batch of releases sends one wake
// message, not one each; a lone release sends its own.
func TestBatchedReleasesPublishOnce(t *testing.T) {
	addr := startRedis(t)
	ctx := context.Background()
	s := open(addr, "a", 30*time.Second)
	defer s.Close()
	c := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true})
	defer c.Close()
	for range 50 {
		if _, err := s.Claim(ctx, "u", "p", -1, -1); err != nil {
			t.Fatal(err)
		}
	}
	published := func() int64 {
		t.Helper()
		info, err := c.Info(ctx, "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		v := infoField(info, "cmdstat_publish")
		if v == "" {
			return 0
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(v, "calls="), ",")
		n, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			t.Fatalf("cmdstat_publish: %q", v)
		}
		return n
	}
	p0 := published()
	if err := s.Release(ctx, "u", "p"); err != nil {
		t.Fatal(err)
	}
	if got := published() - p0; got != 1 {
		t.Fatalf("a lone release published %d messages, want 1", got)
	}

	// Hold the batcher on a slow script so that the releases queue up
	// behind it and go out as one batch.
	p0 = published()
	slow := redis.NewScript(`local t = redis.call('TIME') local e = tonumber(t[1]) + tonumber(t[2]) / 1e6 + 0.3
while true do local n = redis.call('TIME') if tonumber(n[1]) + tonumber(n[2]) / 1e6 >= e then break end end
return 1`)
	done := make(chan error, 1)
	go func() { done <- s.run(ctx, slow, []string{"x:slow"}).Err() }()
	time.Sleep(50 * time.Millisecond)
	var wg sync.WaitGroup
	for range 49 {
		wg.Add(1)
		go func() { defer wg.Done(); _ = s.Release(ctx, "u", "p") }()
	}
	wg.Wait()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := published() - p0; got < 1 || got > 10 {
		t.Fatalf("49 concurrent releases published %d messages, want 1 per batch (1..10)", got)
	}
	wantUsed(t, s, "u", 0)
}

// TestBatchAfterScriptFlush: scripts the server forgot (a restart, SCRIPT
// FLUSH) are sent again in full within the same call.
func TestBatchAfterScriptFlush(t *testing.T) {
	addr := startRedis(t)
	ctx := context.Background()
	s := open(addr, "a", 30*time.Second)
	defer s.Close()
	if _, err := s.Claim(ctx, "u", "p", -1, -1); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true})
	defer c.Close()
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if v, err := s.Claim(ctx, "u", "p", -1, -1); err != nil || v != Claimed {
		t.Fatalf("claim after SCRIPT FLUSH: %v, %v", v, err)
	}
	if err := s.Release(ctx, "u", "p"); err != nil {
		t.Fatal(err)
	}
	wantUsed(t, s, "u", 1)
}

// holdBatcher keeps s's batcher busy on a slow script for d, so that the
// calls queued meanwhile go out together as the next batch; it returns a
// wait for the slow call.
func holdBatcher(t *testing.T, s *Store, d time.Duration) func() {
	t.Helper()
	slow := redis.NewScript(`local t = redis.call('TIME') local e = tonumber(t[1]) + tonumber(t[2]) / 1e6 + ` +
		strconv.FormatFloat(d.Seconds(), 'f', 3, 64) + `
while true do local n = redis.call('TIME') if tonumber(n[1]) + tonumber(n[2]) / 1e6 >= e then break end end
return 1`)
	done := make(chan error, 1)
	scripts0 := s.b.scripts.Load()
	go func() { done <- s.run(context.Background(), slow, []string{"x:slow"}).Err() }()
	deadline := time.Now().Add(10 * time.Second)
	for s.b.scripts.Load() == scripts0 { // counted as it is sent
		if time.Now().After(deadline) {
			t.Fatal("the slow call was not sent")
		}
		time.Sleep(time.Millisecond)
	}
	return func() {
		t.Helper()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// waitPending waits until s's batcher has exactly n calls queued.
func waitPending(t *testing.T, s *Store, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s.b.mu.Lock()
		got := len(s.b.pending)
		s.b.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d calls queued, want %d", got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestMergedReleasesKeepOrder: releases queued together for one pair go
// out as one script call with their count, one per pair, and never cross a
// renewal queued among them: releases before it are applied before its
// absolute counts, releases after it after them. The batch publishes one
// wake message.
func TestMergedReleasesKeepOrder(t *testing.T) {
	addr := startRedis(t)
	ctx := context.Background()
	s := open(addr, "a", 30*time.Second)
	defer s.Close()
	for range 10 {
		for _, u := range []string{"u", "v"} {
			if v, err := s.Claim(ctx, u, "p", -1, -1); err != nil || v != Claimed {
				t.Fatal(v, err)
			}
		}
	}
	published := publishCounter(t, addr)
	p0 := published()
	wait := holdBatcher(t, s, 500*time.Millisecond)
	scripts0 := s.b.scripts.Load()
	var mu sync.Mutex
	var failures []error
	onErr := func(err error) { mu.Lock(); failures = append(failures, err); mu.Unlock() }
	// 4 u and 3 v interleaved, the renewal (u 6, v 7, p 13: what they
	// leave), then 2 more u: u must end at 4 (at 6 had the 2 gone before
	// the renewal, at 2 had the 4 gone after it), v at 7, p at 11.
	for _, u := range []string{"u", "v", "u", "v", "u", "v", "u"} {
		s.ReleaseLater(u, "p", onErr)
	}
	q := s.QueueRenew(map[string]int64{"u": 6, "v": 7}, map[string]int64{"p": 13})
	s.ReleaseLater("u", "p", onErr)
	s.ReleaseLater("u", "p", onErr)
	waitPending(t, s, 10)
	wait()
	if err := q.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	ups, provs, err := s.Used(ctx, []string{"u", "v"}, []string{"p"})
	if err != nil || ups["u"] != 4 || ups["v"] != 7 || provs["p"] != 11 {
		t.Fatalf("used = %v %v %v; want u 4, v 7, p 11", ups, provs, err)
	}
	// 2 merged releases (u, v) + the renewal + 1 merged release (u) + Used.
	if got := s.b.scripts.Load() - scripts0; got != 5 {
		t.Errorf("10 queued calls and a read took %d script calls, want 5", got)
	}
	if got := published() - p0; got != 1 {
		t.Errorf("one batch of releases published %d messages, want 1", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(failures) != 0 {
		t.Fatalf("releases failed: %v", failures)
	}
}

// TestMergedClaimsGrantInQueueOrder: claims queued together for one pair
// go out as one "claim up to k" call; exactly the limit is granted, to the
// first callers in queue order, the others get the reason (upstream or
// provider full), and a release queued among them frees its slot for them.
func TestMergedClaimsGrantInQueueOrder(t *testing.T) {
	addr := startRedis(t)
	ctx := context.Background()
	s := open(addr, "a", 30*time.Second)
	defer s.Close()
	// One slot of u held already: the release queued below frees it. It
	// is the first release of this store: sent in full, not as a NOSCRIPT
	// sent again after the claims.
	if v, err := s.Claim(ctx, "u", "p", 10, 15); err != nil || v != Claimed {
		t.Fatal(v, err)
	}
	wait := holdBatcher(t, s, 500*time.Millisecond)
	scripts0 := s.b.scripts.Load()

	// 30 claims of u (limit 10) and 30 of w (limit 100) interleaved, both
	// on provider p (capacity 15), then one release of u: u gets 10 (the
	// release frees the slot held), w the 5 units of p left.
	const each = 30
	type claim struct {
		up string
		v  Verdict
	}
	claims := make([]claim, 2*each)
	errs := make([]error, 2*each)
	var wg sync.WaitGroup
	for i := range claims {
		claims[i].up = []string{"u", "w"}[i%2]
		limit := map[string]int64{"u": 10, "w": 100}[claims[i].up]
		wg.Add(1)
		go func() {
			defer wg.Done()
			claims[i].v, errs[i] = s.Claim(ctx, claims[i].up, "p", limit, 15)
		}()
		waitPending(t, s, i+1) // queue order = index order
	}
	var relErr error
	s.ReleaseLater("u", "p", func(err error) { relErr = err })
	waitPending(t, s, 2*each+1)
	wait()
	wg.Wait()
	granted := map[string]int{}
	for i, c := range claims {
		if errs[i] != nil {
			t.Fatalf("claim %d: %v", i, errs[i])
		}
		n := granted[c.up]
		var want Verdict
		switch {
		case c.up == "u" && n < 10, c.up == "w" && n < 5:
			want = Claimed
		case c.up == "u":
			want = UpstreamFull
		default:
			want = ProviderFull
		}
		if c.v != want {
			t.Fatalf("claim %d (%s, its #%d): %v, want %v", i, c.up, n+1, c.v, want)
		}
		if c.v == Claimed {
			granted[c.up]++
		}
	}
	if relErr != nil {
		t.Fatal(relErr)
	}
	// The release, one claim call for u, one for w.
	if got := s.b.scripts.Load() - scripts0; got != 3 {
		t.Errorf("61 queued calls took %d script calls, want 3", got)
	}
	ups, provs, err := s.Used(ctx, []string{"u", "w"}, []string{"p"})
	if err != nil || ups["u"] != 10 || ups["w"] != 5 || provs["p"] != 15 {
		t.Fatalf("used = %v %v %v; want u 10, w 5, p 15", ups, provs, err)
	}
}

// publishCounter returns a reader of the server's PUBLISH count.
func publishCounter(t *testing.T, addr string) func() int64 {
	c := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true})
	t.Cleanup(func() { _ = c.Close() })
	return func() int64 {
		t.Helper()
		info, err := c.Info(context.Background(), "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		v := infoField(info, "cmdstat_publish")
		if v == "" {
			return 0
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(v, "calls="), ",")
		n, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			t.Fatalf("cmdstat_publish: %q", v)
		}
		return n
	}
}

// TestPipelinedBatchAfterScriptFlush: a batch sent as a pipeline whose
// scripts the server forgot gets them again in full, and the counts end
// right.
func TestPipelinedBatchAfterScriptFlush(t *testing.T) {
	addr := startRedis(t)
	ctx := context.Background()
	s := open(addr, "a", 30*time.Second)
	defer s.Close()
	c := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true})
	defer c.Close()
	batch := func(claims int, rel string) {
		t.Helper()
		wait := holdBatcher(t, s, 300*time.Millisecond)
		var wg sync.WaitGroup
		for i := range claims {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if v, err := s.Claim(ctx, []string{"u", "v"}[i%2], "p", -1, -1); err != nil || v != Claimed {
					t.Errorf("claim: %v %v", v, err)
				}
			}()
		}
		waitPending(t, s, claims)
		s.ReleaseLater(rel, "p", func(err error) { t.Errorf("release: %v", err) })
		waitPending(t, s, claims+1)
		wait()
		wg.Wait()
	}
	// One slot each held first: a release is queued only after its claim.
	for _, u := range []string{"u", "v"} {
		if v, err := s.Claim(ctx, u, "p", -1, -1); err != nil || v != Claimed {
			t.Fatal(v, err)
		}
	}
	batch(4, "u") // first pipeline: scripts sent in full
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	batch(4, "v") // EVALSHA, NOSCRIPT, sent again in full
	ups, provs, err := s.Used(ctx, []string{"u", "v"}, []string{"p"})
	if err != nil || ups["u"] != 4 || ups["v"] != 4 || provs["p"] != 8 {
		t.Fatalf("used = %v %v %v; want u 4, v 4, p 8", ups, provs, err)
	}
}

// TestCallsBoundedByTheirOwnDeadline: callers have no timer of their own,
// so the bound is the batcher's. On a Redis that does not answer, a claim
// queued while an earlier batch is in flight must still fail within its
// own timeout, not after the earlier batch's timeout and then its own.
func TestCallsBoundedByTheirOwnDeadline(t *testing.T) {
	addr := startRedis(t)
	ctx := context.Background()
	const timeout = 300 * time.Millisecond
	s := Open(Options{Address: addr, Prefix: "x:", Timeout: timeout, LeaseTTL: time.Minute}, "a")
	defer s.Close()
	if _, err := s.Claim(ctx, "u", "p", -1, -1); err != nil { // connected, script loaded
		t.Fatal(err)
	}
	pauseRedis(t, addr, 1500*time.Millisecond)
	type outcome struct {
		d   time.Duration
		err error
	}
	first, second := make(chan outcome, 1), make(chan outcome, 1)
	claim := func(out chan<- outcome) {
		start := time.Now()
		_, err := s.Claim(ctx, "u", "p", -1, -1)
		out <- outcome{time.Since(start), err}
	}
	go claim(first)
	time.Sleep(30 * time.Millisecond) // the first claim's batch is in flight
	go claim(second)
	// Chained, the second would take about 2×timeout − 30ms (570ms).
	for name, ch := range map[string]chan outcome{"first": first, "second": second} {
		o := <-ch
		if o.err == nil || o.d > timeout+150*time.Millisecond {
			t.Errorf("%s claim on a paused Redis: %v after %v; want an error within the %v timeout", name, o.err, o.d, timeout)
		}
	}
}

// TestCallAboutToExpireDoesNotCutItsBatch: a call with less than a quarter
// of its timeout left is not sent; the calls batched with it still get
// their full time and their answers.
func TestCallAboutToExpireDoesNotCutItsBatch(t *testing.T) {
	addr := startRedis(t)
	s := Open(Options{Address: addr, Prefix: "x:", Timeout: time.Second, LeaseTTL: time.Minute}, "a")
	defer s.Close()
	ctx := context.Background()
	if _, err := s.Claim(ctx, "u", "p", -1, -1); err != nil { // connected, script loaded
		t.Fatal(err)
	}
	mk := func(until time.Time) *call {
		return &call{script: usedScript, keys: []string{"x:up:u", "x:up:u:leases"}, until: until, reply: make(chan *redis.Cmd, 1)}
	}
	now := time.Now()
	late := mk(now.Add(100 * time.Microsecond))
	batch := []*call{late}
	for range 20 {
		batch = append(batch, mk(now.Add(time.Second)))
	}
	others := append([]*call(nil), batch[1:]...) // send filters batch in place
	s.b.send(batch)
	if err := (<-late.reply).Err(); !errors.Is(err, errExpired) {
		t.Fatalf("the call about to expire: %v, want errExpired", err)
	}
	for i, c := range others {
		if vals, err := (<-c.reply).Int64Slice(); err != nil || len(vals) != 1 || vals[0] != 1 {
			t.Fatalf("call %d batched with it: %v %v, want the count 1", i, vals, err)
		}
	}
}

// wantUsed fails the test unless upstream id's fleet-wide count is n.
func wantUsed(t *testing.T, s *Store, id string, n int64) {
	t.Helper()
	ups, _, err := s.Used(context.Background(), []string{id}, nil)
	if err != nil || ups[id] != n {
		t.Fatalf("used = %v, %v; want %s %d", ups, err, id, n)
	}
}
