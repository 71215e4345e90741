package integration

// Each llm_route handler counts in its own state: a config with two
// handlers, one on the redis state and one on memory, keeps the redis one's
// limits fleet-wide and the memory one's to this process, whichever of
// them starts last.

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// siteRoute is a route that runs handler for requests with X-Site: site,
// as two sites of one server would.
func siteRoute(site string, handler map[string]any) any {
	h := map[string]any{"handler": "llm_route"}
	for k, v := range handler {
		h[k] = v
	}
	return map[string]any{
		"match":    []any{map[string]any{"header": map[string]any{"X-Site": []string{site}}}},
		"handle":   []any{h},
		"terminal": true,
	}
}

// startProxyRoutes is startProxy for a config made of several routes.
func startProxyRoutes(t testing.TB, routes []any) *proxy {
	t.Helper()
	p := &proxy{t: t, port: freePort(t), aport: freePort(t)}
	p.URL = fmt.Sprintf("http://127.0.0.1:%d", p.port)
	p.admin = fmt.Sprintf("http://127.0.0.1:%d", p.aport)
	p.logPath = filepath.Join(t.TempDir(), "caddy.log")
	if err := p.loadRoutes(routes); err != nil {
		t.Fatalf("loading config: %v", err)
	}
	t.Cleanup(func() {
		if err := caddy.Stop(); err != nil {
			t.Logf("stopping caddy: %v", err)
		}
	})
	return p
}

// memorySite is one provider pb with one upstream ub of the given limit
// and a queueing model mb, on the memory state.
func memorySite(up *fakeUpstream, limit int) map[string]any {
	return cfg(
		[]map[string]any{obj("id", "pb", "url", up.base())},
		[]map[string]any{obj("id", "ub", "provider", "pb", "model", "real", "max_concurrency", limit)},
		[]map[string]any{obj("name", "mb", "upstreams", []string{"ub"})},
		"queue_size", 100, "queue_timeout", "60s",
	)
}

// redisKeysOf collects, while it runs, every key under prefix in Redis that
// names one of the ids (a memory handler's upstream or provider).
func redisKeysOf(t *testing.T, rs *redisServer, prefix string, ids ...string) (stop func() []string) {
	c := rs.client()
	done := make(chan struct{})
	var found []string
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		seen := map[string]bool{}
		for {
			keys, _ := c.Keys(context.Background(), prefix+"*").Result()
			for _, k := range keys {
				for _, id := range ids {
					if strings.Contains(k, ":"+id) && !seen[k] {
						seen[k] = true
						found = append(found, k)
					}
				}
			}
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return func() []string {
		close(done)
		wg.Wait()
		c.Close()
		return found
	}
}

func TestLedgerPerHandlerRedisAndMemorySites(t *testing.T) {
	rs := startRedis(t)
	slow := func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(100 * time.Millisecond)
		completion("ok")(w, r)
	}
	upA, upB := newUpstream(t, slow), newUpstream(t, slow)
	siteA := fleetConfig(upA, rs.addr, 2)
	siteB := memorySite(upB, 3)

	other := startInstance(t, fleetConfig(upA, rs.addr, 2)) // site A on a second Caddy process
	waitHealthy(t, other, true)
	// The memory site is listed, and so starts, last: the order that lost
	// the redis site's slot claims when one state served the process.
	p := startProxyRoutes(t, []any{siteRoute("a", siteA), siteRoute("b", siteB)})

	for round, order := range []string{"memory site last", "redis site last (reloaded)"} {
		if round == 1 {
			if err := p.loadRoutes([]any{siteRoute("b", siteB), siteRoute("a", siteA)}); err != nil {
				t.Fatalf("reload: %v", err)
			}
		}
		eventually(t, 15*time.Second, "the in-process redis site using Redis", func() bool {
			return strings.Contains(p.logs(), "shared state reachable, using it")
		})
		upA.peak.Store(0)
		upB.peak.Store(0)
		stop := redisKeysOf(t, rs, "t:", "ub", "pb")

		var wg sync.WaitGroup
		var mu sync.Mutex
		codes := map[string]int{}
		send := func(name string, post func() (*http.Response, error)) {
			defer wg.Done()
			resp, err := post()
			if err != nil {
				t.Errorf("%s: %v", name, err)
				return
			}
			readAll(t, resp)
			mu.Lock()
			codes[fmt.Sprintf("%s %d", name, resp.StatusCode)]++
			mu.Unlock()
		}
		for i := 0; i < 40; i++ {
			wg.Add(2)
			if i%2 == 0 {
				go send("A", func() (*http.Response, error) {
					return p.post(context.Background(), chatBody("m", false), "X-Site", "a")
				})
			} else {
				go send("A", func() (*http.Response, error) { return other.post(context.Background(), chatBody("m", false)) })
			}
			go send("B", func() (*http.Response, error) {
				return p.post(context.Background(), chatBody("mb", false), "X-Site", "b")
			})
		}
		wg.Wait()
		leaked := stop()

		if codes["A 200"] != 40 || codes["B 200"] != 40 {
			t.Errorf("%s: statuses %v, want 40 × 200 on each site", order, codes)
		}
		if peak := upA.peak.Load(); peak != 2 {
			t.Errorf("%s: site A's upstream peak = %d, want exactly 2 (limit 2 shared in Redis by two Caddy processes)", order, peak)
		}
		if peak := upB.peak.Load(); peak != 3 {
			t.Errorf("%s: site B's upstream peak = %d, want exactly 3 (its own limit, this process only)", order, peak)
		}
		if len(leaked) > 0 {
			t.Errorf("%s: the memory site's state reached Redis: %v", order, leaked)
		}
	}
}

// A slow Redis holds only the requests of the handler that uses it: a
// memory model's waiter is admitted when its slot frees, while a redis
// model's waiter is still finishing its claim in the sleeping Redis.
func TestLedgerSlowRedisDoesNotHoldMemoryQueue(t *testing.T) {
	rs := startRedis(t)
	gA, gB := newGate(), newGate()
	defer gA.open()
	defer gB.open()
	upA, upB := newUpstream(t, gA.handler(completion("a"))), newUpstream(t, nil)
	// A renewal every 500 ms, and a call timeout longer than the sleep: a
	// slow Redis, not an unreachable one.
	siteA := fleetConfig(upA, rs.addr, 1, "timeout", "10s", "lease_ttl", "1500ms")
	heldB := make(chan struct{})
	arrivedB := make(chan struct{}, 16)
	var callsB atomic.Int64
	upB.setHandler(func(w http.ResponseWriter, r *http.Request) {
		arrivedB <- struct{}{}
		if callsB.Add(1) == 1 { // the first B request holds B's slot
			select {
			case <-heldB:
			case <-r.Context().Done():
				return
			}
		}
		completion("b")(w, r)
	})
	siteB := memorySite(upB, 1)
	// The redis site starts last.
	p := startProxyRoutes(t, []any{siteRoute("b", siteB), siteRoute("a", siteA)})
	eventually(t, 15*time.Second, "the redis site using Redis", func() bool {
		return strings.Contains(p.logs(), "shared state reachable, using it")
	})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a1 := p.goChat(ctx, chatBody("m", false), "X-Site", "a")
	gA.waitArrivals(t, 1)
	b1 := p.goChat(ctx, chatBody("mb", false), "X-Site", "b")
	<-arrivedB
	a2 := p.goChat(ctx, chatBody("m", false), "X-Site", "a")
	eventually(t, 10*time.Second, "the redis model's first waiter queued", func() bool {
		_, body := p.status()
		return strings.Contains(body, `"queue_depth":1`)
	})
	// A second redis waiter ahead of the memory one: its turn is the one a
	// renewal defers.
	a3 := p.goChat(ctx, chatBody("m", false), "X-Site", "a")
	b2 := p.goChat(ctx, chatBody("mb", false), "X-Site", "b")
	eventually(t, 10*time.Second, "both models queued", func() bool {
		_, body := p.status()
		return strings.Contains(body, `"queue_depth":2`) && strings.Contains(body, `"queue_depth":1`)
	})

	// Redis sleeps 2 s; A's slot frees, so A's waiter starts its claim in
	// the sleeping Redis (and a renewal comes due behind it).
	slept := make(chan error, 1)
	go func() {
		c := rs.client()
		defer c.Close()
		slept <- c.Do(context.Background(), "DEBUG", "SLEEP", "2").Err()
	}()
	time.Sleep(100 * time.Millisecond) // the sleep has begun
	sleepStart := time.Now()
	gA.open()
	if r := await(t, a1); r.status != http.StatusOK {
		t.Fatalf("first A request: %d %s", r.status, r.body)
	}
	time.Sleep(600 * time.Millisecond) // a renewal is due meanwhile

	freed := time.Now()
	close(heldB)
	if r := await(t, b1); r.status != http.StatusOK {
		t.Fatalf("first B request: %d %s", r.status, r.body)
	}
	r := await(t, b2)
	admitted := time.Since(freed)
	if r.status != http.StatusOK {
		t.Fatalf("queued B request: %d %s", r.status, r.body)
	}
	if admitted > time.Second {
		t.Errorf("the memory model's waiter was served %v after its slot freed, want < 1s: it waited for the slow Redis", admitted)
	}
	select {
	case ra := <-a2:
		t.Errorf("the redis model's waiter was served (%d) before the memory one, %v into the 2 s sleep", ra.status, time.Since(sleepStart))
	default: // still claiming in the sleeping Redis, as it should
		if err := <-slept; err != nil {
			t.Fatalf("DEBUG SLEEP: %v", err)
		}
		for _, a := range []<-chan result{a2, a3} {
			if ra := await(t, a); ra.status != http.StatusOK {
				t.Errorf("queued A request: %d %s", ra.status, ra.body)
			}
		}
	}
	t.Logf("memory waiter served %v after its slot freed; the redis one %v after the sleep began", admitted, time.Since(sleepStart))
}
