package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fleetKeyConfig is fleetConfig with a price and one client key.
func fleetKeyConfig(up *fakeUpstream, addr string, key map[string]any) map[string]any {
	h := fleetConfig(up, addr, 100)
	h["upstreams"].([]map[string]any)[0]["price_output"] = 1000.0 // $1 per 1000 output tokens
	key["id"], key["secret"] = "k", secretTeam
	h["keys"] = []any{key}
	return h
}

// A daily spend budget is spent once across two Caddy processes sharing
// one Redis: 40 requests over both, each reserving $1 against $10.50, all
// held at the upstream until the others are answered → exactly 10 served
// in total, 30 refused with 429 insufficient_quota. (Each instance on its
// own accounting would serve 10: 20 in all.)
func TestFleetKeyBudgetSharedAcrossProcesses(t *testing.T) {
	rs := startRedis(t)
	g := newGate()
	up := newUpstream(t, gatedUsage(g, 20, 1000))
	t.Cleanup(g.open)
	conf := func() map[string]any {
		c := fleetKeyConfig(up, rs.addr, obj("spend_per_day", 10.5))
		// A call timing out on a loaded machine would fall back to the
		// instance's own budget (10 more served): this test is about sharing.
		c["state"].(map[string]any)["timeout"] = "2s"
		return c
	}
	a, b := startInstance(t, conf()), startInstance(t, conf())
	waitHealthy(t, a, true)
	waitHealthy(t, b, true)

	const n = 40
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":1000}`
	var ok, quota, other atomic.Int64
	var wg sync.WaitGroup
	for i := range n {
		in := []*instance{a, b}[i%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := in.post(context.Background(), body, "Authorization", "Bearer "+secretTeam)
			if err != nil {
				other.Add(1)
				return
			}
			rb, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			switch {
			case resp.StatusCode == http.StatusOK:
				ok.Add(1)
			case resp.StatusCode == http.StatusTooManyRequests && strings.Contains(string(rb), `"insufficient_quota"`):
				quota.Add(1)
			default:
				other.Add(1)
				t.Errorf("unexpected answer %d %s", resp.StatusCode, rb)
			}
		}()
	}
	eventually(t, 60*time.Second, "every request beyond the budget refused", func() bool { return quota.Load()+other.Load() >= n-10 })
	if got := len(up.Calls()); got > 10 {
		t.Fatalf("%d requests reached the upstream, the shared budget is for 10", got)
	}
	g.open()
	wg.Wait()
	if ok.Load() != 10 || quota.Load() != 30 {
		t.Fatalf("served %d, refused %d (other %d); want 10 and 30 across both instances", ok.Load(), quota.Load(), other.Load())
	}
	// Settled in Redis: both instances see the same spend and no reservation left.
	for name, in := range map[string]*instance{"a": a, "b": b} {
		k := in.keyStatus("k")
		if spend := k["spend_today_usd"].(float64); spend < 9.99 || spend > 10.5 {
			t.Errorf("instance %s: spend today %v, want 10 (fleet-wide)", name, spend)
		}
		if k["reserved_usd"].(float64) != 0 {
			t.Errorf("instance %s: reservations left: %+v", name, k)
		}
	}
	t.Logf("shared spend_per_day over two processes: served %d, refused %d", ok.Load(), quota.Load())
}

// A GCRA rate with burst 5 is one bucket for the fleet: five requests
// alternating between the two processes pass, the sixth is refused with
// 429 rate_limit_exceeded and a Retry-After.
func TestFleetKeyRateSharedAcrossProcesses(t *testing.T) {
	rs := startRedis(t)
	up := newUpstream(t, nil)
	a := startInstance(t, fleetKeyConfig(up, rs.addr, obj("rpm", 1, "burst", 5)))
	b := startInstance(t, fleetKeyConfig(up, rs.addr, obj("rpm", 1, "burst", 5)))
	waitHealthy(t, a, true)
	waitHealthy(t, b, true)
	for i := range 5 {
		in := []*instance{a, b}[i%2]
		resp := in.chat(chatBody("m", false), "Authorization", "Bearer "+secretTeam)
		if rb := readAll(t, resp); resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d of the burst: %d %s", i+1, resp.StatusCode, rb)
		}
	}
	resp := b.chat(chatBody("m", false), "Authorization", "Bearer "+secretTeam)
	rb := readAll(t, resp)
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(rb, `"rate_limit_exceeded"`) || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("6th request: %d %s (Retry-After %q), want 429 rate_limit_exceeded", resp.StatusCode, rb, resp.Header.Get("Retry-After"))
	}
	if got := len(up.Calls()); got != 5 {
		t.Fatalf("the upstream got %d requests, want the burst of 5", got)
	}
}

// Redis away: with on_state_error local the key's limits still hold, from
// this instance's memory store (a burst of 5, the 6th refused), and the
// errors are counted; with reject the key's requests get 503.
func TestFleetKeyRedisDownFollowsOnStateError(t *testing.T) {
	rs := startRedis(t)
	up := newUpstream(t, nil)
	local := startProxy(t, fleetKeyConfig(up, rs.addr, obj("rpm", 1, "burst", 5)))
	rejectConf := fleetKeyConfig(up, rs.addr, obj("spend_per_day", 10.0))
	rejectConf["state"].(map[string]any)["on_state_error"] = "reject"
	rejectConf["state"].(map[string]any)["prefix"] = "r:"
	// On Redis first: a fleet that never reached it would show unhealthy
	// before any call failed.
	waitHealthy(t, local, true)
	rs.stop()
	waitHealthy(t, local, false)
	for i := range 5 {
		resp := local.chat(chatBody("m", false), "Authorization", "Bearer "+secretTeam)
		if rb := readAll(t, resp); resp.StatusCode != http.StatusOK {
			t.Fatalf("local fallback, request %d: %d %s", i+1, resp.StatusCode, rb)
		}
	}
	resp := local.chat(chatBody("m", false), "Authorization", "Bearer "+secretTeam)
	if rb := readAll(t, resp); resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(rb, `"rate_limit_exceeded"`) {
		t.Fatalf("local fallback, 6th: %d %s; want the local GCRA's 429", resp.StatusCode, rb)
	}
	if got := local.metric("llm_proxy_state_errors_total"); got < 1 {
		t.Fatalf("llm_proxy_state_errors_total = %v, want counted", got)
	}

	rej := startProxy(t, rejectConf)
	for range 3 {
		start := time.Now()
		expectAPIError(t, rej.chat(chatBody("m", false), "Authorization", "Bearer "+secretTeam), http.StatusServiceUnavailable, "all_upstreams_busy")
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("a refusal under reject took %v", d)
		}
	}
}

// Requests in flight across reloads settle their budget reservations in
// Redis (issue 16): twelve clients keep the key busy on six slots —
// non-stream answers held 150 ms at the upstream, streams cut by a 150 ms
// pause — while the
// config is reloaded four times, twice with the same state block (one
// pooled fleet) and twice onto a changed one (a new fleet, the old one
// closed once its last request settled). Afterwards Redis holds no
// reservation and the key's use is exactly what the upstream reported.
func TestFleetKeyReservationsSettleAcrossReloads(t *testing.T) {
	rs := startRedis(t)
	const prompt, completion = 7, 11
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		usage := fmt.Sprintf(`"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}`, prompt, completion, prompt+completion)
		if !strings.Contains(string(body), `"stream":true`) {
			time.Sleep(150 * time.Millisecond)
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":"c1","object":"chat.completion","created":1,"model":"real","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],%s}`, usage)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		chunk := func(s string) { fmt.Fprintf(w, "data: %s\n\n", s); w.(http.Flusher).Flush() }
		chunk(`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"real","choices":[{"index":0,"delta":{"role":"assistant","content":"o"},"finish_reason":null}]}`)
		time.Sleep(150 * time.Millisecond)
		chunk(`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"real","choices":[{"index":0,"delta":{"content":"k"},"finish_reason":"stop"}]}`)
		chunk(`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"real","choices":[],` + usage + `}`)
		chunk("[DONE]")
	})
	// Generous Redis timeouts: this test is about reloads, and a call that
	// times out on a loaded machine falls back to local accounting.
	conf := fleetKeyConfig(up, rs.addr, obj("tokens_per_day", 1_000_000_000))
	conf["state"].(map[string]any)["timeout"] = "2s"
	changed := fleetKeyConfig(up, rs.addr, obj("tokens_per_day", 1_000_000_000))
	changed["state"].(map[string]any)["timeout"] = "3s" // another state block: another fleet, same accounts
	// Six slots for twelve clients: at each reload six requests of the old
	// config are at the upstream and six wait in its queue, to reserve
	// only once a slot frees (after the old fleet's last reservation may
	// have settled).
	for _, c := range []map[string]any{conf, changed} {
		c["upstreams"].([]map[string]any)[0]["max_concurrency"] = 6
	}
	p := startProxy(t, conf)
	waitHealthy(t, p, true)

	var stop atomic.Bool
	var ok, dropped, other atomic.Int64
	var wg sync.WaitGroup
	for i := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; !stop.Load(); n++ {
				stream := (i+n)%2 == 0
				resp, err := p.post(context.Background(), chatBody("m", stream), "Authorization", "Bearer "+secretTeam)
				if err != nil {
					// A connection Caddy's listener hand-over resets at the
					// reload (as the soak's dropped_at_reload); whether it
					// reached the upstream is checked below.
					dropped.Add(1)
					continue
				}
				rb, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK || (stream && !strings.Contains(string(rb), "[DONE]")) {
					other.Add(1)
					t.Errorf("answer %d: %s", resp.StatusCode, rb)
					continue
				}
				ok.Add(1)
			}
		}()
	}
	// Each reload waits for a dozen requests more, so that the requests it
	// catches in flight started under the config it replaces.
	loadWhenBusy := func(c map[string]any) {
		seen := len(up.Calls())
		eventually(t, 20*time.Second, "new requests in flight at the upstream", func() bool {
			return len(up.Calls()) >= seen+12 && up.inflight.Load() >= 6
		})
		if c != nil {
			p.load(c)
		}
	}
	for _, c := range []map[string]any{conf, changed, changed, conf, nil} {
		loadWhenBusy(c)
	}
	stop.Store(true)
	wg.Wait()

	calls := int64(len(up.Calls()))
	if ok.Load() != calls || other.Load() != 0 {
		t.Fatalf("%d answers ok, %d not, %d connections dropped, for %d upstream calls; want every call answered ok",
			ok.Load(), other.Load(), dropped.Load(), calls)
	}
	c := rs.client()
	defer c.Close()
	day := fmt.Sprintf("t:key:k:d:%d", time.Now().Unix()/86400)
	var acct map[string]string
	deadline := time.Now().Add(10 * time.Second)
	for acct = c.HGetAll(context.Background(), day).Val(); acct["rt"] != "0"; acct = c.HGetAll(context.Background(), day).Val() {
		if time.Now().After(deadline) {
			t.Fatalf("reservations left in Redis: %v, leases %v; state errors %v", acct,
				c.ZRangeWithScores(context.Background(), "t:key:k:holds", 0, -1).Val(), p.metric("llm_proxy_state_errors_total"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if want := fmt.Sprint(calls * (prompt + completion)); acct["ut"] != want {
		t.Fatalf("tokens used in Redis = %s, want %s (%d calls × %d): %v; state errors %v", acct["ut"], want, calls, prompt+completion, acct,
			p.metric("llm_proxy_state_errors_total"))
	}
	if n := c.ZCard(context.Background(), "t:key:k:holds").Val(); n != 0 {
		t.Fatalf("%d reservation leases left in Redis", n)
	}
	if k := p.keyStatus("k"); k["reserved_tokens"].(float64) != 0 || k["tokens_today"].(float64) != float64(calls*(prompt+completion)) {
		t.Fatalf("key status after the reloads: %v", k)
	}
	t.Logf("%d requests across 4 reloads (%d connections dropped at a reload, none of them sent upstream), %d tokens settled in Redis, none reserved",
		calls, dropped.Load(), calls*(prompt+completion))
}

// A reservation is a lease renewed while its request runs: held at the
// upstream for three lease lifetimes, the request keeps its reservation
// (the key's status drops expired leases, so it would show 0), and its
// settlement then leaves only the use.
func TestFleetKeyReservationRenewedWhileRequestRuns(t *testing.T) {
	rs := startRedis(t)
	p, g, done := startHeldKeyRequest(t, rs, "1s", "2s") // a loaded machine must not fall back
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if k := p.keyStatus("k"); k["reserved_tokens"].(float64) < 1000 {
			t.Fatalf("the running request's reservation lapsed: %v", k)
		}
	}
	g.open()
	if code := <-done; code != http.StatusOK {
		t.Fatalf("the held request answered %d", code)
	}
	eventually(t, 10*time.Second, "the reservation settled", func() bool {
		k := p.keyStatus("k")
		return k["reserved_tokens"].(float64) == 0 && k["tokens_today"].(float64) == 1020
	})
}

// kill -9 an instance whose request holds a budget reservation: the other
// instance sees the reservation go within lease_ttl (nobody renews it),
// so a dead instance does not shrink the fleet's budget for the day.
func TestFleetKeyReservationOfKilledInstanceLapses(t *testing.T) {
	rs := startRedis(t)
	g := newGate()
	up := newUpstream(t, gatedUsage(g, 20, 1000))
	t.Cleanup(g.open)
	const ttl = 2 * time.Second
	conf := func() map[string]any {
		c := fleetKeyConfig(up, rs.addr, obj("tokens_per_day", 1_000_000))
		c["state"].(map[string]any)["lease_ttl"] = ttl.String()
		c["state"].(map[string]any)["timeout"] = "2s" // a loaded machine must not fall back
		return c
	}
	a, b := startInstance(t, conf()), startInstance(t, conf())
	waitHealthy(t, a, true)
	waitHealthy(t, b, true)
	go func() {
		body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":1000}`
		if resp, err := a.post(context.Background(), body, "Authorization", "Bearer "+secretTeam); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	g.waitArrivals(t, 1)
	if k := b.keyStatus("k"); k["reserved_tokens"].(float64) < 1000 {
		t.Fatalf("the other instance does not see the reservation: %v", k)
	}
	a.kill()
	killed := time.Now()
	eventually(t, ttl+10*time.Second, "the killed instance's reservation gone", func() bool {
		return b.keyStatus("k")["reserved_tokens"].(float64) == 0
	})
	if d := time.Since(killed); d > ttl+2*time.Second {
		t.Fatalf("the reservation lapsed %v after kill -9, want within lease_ttl %v (+ polling)", d, ttl)
	}
	t.Logf("reservation gone %v after kill -9 (lease_ttl %v)", time.Since(killed), ttl)
}

// A settlement Redis does not take (here: Redis paused as the request
// ends, the call times out) is sent again once Redis answers, so the
// request's real use reaches the fleet's budget instead of lapsing with
// its reservation.
func TestFleetKeySettlementRetriedAfterRedisFails(t *testing.T) {
	rs := startRedis(t)
	p, g, done := startHeldKeyRequest(t, rs, "3s", "300ms")
	c := rs.client()
	defer c.Close()
	before := p.metric("llm_proxy_state_errors_total")
	if err := c.Do(context.Background(), "CLIENT", "PAUSE", "2000", "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	g.open()
	if code := <-done; code != http.StatusOK {
		t.Fatalf("the request answered %d", code)
	}
	eventually(t, 5*time.Second, "the settlement failed (counted)", func() bool {
		return p.metric("llm_proxy_state_errors_total") > before
	})
	day := fmt.Sprintf("t:key:k:d:%d", time.Now().Unix()/86400)
	eventually(t, 15*time.Second, "the request's use settled in Redis", func() bool {
		acct := c.HGetAll(context.Background(), day).Val()
		return acct["ut"] == "1020" && acct["rt"] == "0"
	})
}

// startHeldKeyRequest runs a proxy on rs whose key has a tokens_per_day
// budget (state lease_ttl and timeout as given) and sends it one request,
// which the upstream holds at the gate until g opens; done gets its
// status (0 for a transport error).
func startHeldKeyRequest(t *testing.T, rs *redisServer, leaseTTL, timeout string) (*proxy, *gate, <-chan int) {
	t.Helper()
	g := newGate()
	up := newUpstream(t, gatedUsage(g, 20, 1000))
	t.Cleanup(g.open)
	conf := fleetKeyConfig(up, rs.addr, obj("tokens_per_day", 1_000_000))
	conf["state"].(map[string]any)["lease_ttl"] = leaseTTL
	conf["state"].(map[string]any)["timeout"] = timeout
	p := startProxy(t, conf)
	waitHealthy(t, p, true)
	done := make(chan int, 1)
	go func() {
		body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":1000}`
		resp, err := p.post(context.Background(), body, "Authorization", "Bearer "+secretTeam)
		if err != nil {
			done <- 0
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	g.waitArrivals(t, 1)
	return p, g, done
}

// A settlement whose answer was lost is sent again without charging twice:
// Redis is busy (a long script) as the request ends, the settlement's call
// times out while it waits in Redis, Redis applies it afterwards and
// answers nobody; the instance sends it again with the next renewal, and
// the key's use in Redis is the request's once. (The call is not sent in
// every run: it may wait behind another call in flight and expire unsent,
// when only the retry applies it; redisstate's
// TestKeySettleReplyLostThenResent loses a reply every time.)
func TestFleetKeySettlementLostReplyChargedOnce(t *testing.T) {
	rs := startRedis(t)
	var n atomic.Int32
	release := make(chan struct{})
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 2 {
			<-release
		}
		usageAnswer(20, 1000)(w, r)
	})
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	conf := fleetKeyConfig(up, rs.addr, obj("tokens_per_day", 1_000_000))
	conf["state"].(map[string]any)["timeout"] = "300ms"
	// Renewals every 10 s: none is likely to be in flight, holding the
	// settlement back, when Redis turns busy.
	conf["state"].(map[string]any)["lease_ttl"] = "30s"
	p := startProxy(t, conf)
	waitHealthy(t, p, true)
	c := rs.client()
	defer c.Close()
	day := fmt.Sprintf("t:key:k:d:%d", time.Now().Unix()/86400)
	used := func() string { return c.HGet(context.Background(), day, "ut").Val() }

	// The first request settles as usual (and loads the scripts in Redis).
	if code, body := keyedChat(t, p, secretTeam); code != http.StatusOK || used() != "1020" {
		t.Fatalf("first request: %d %s; used %q, want 1020", code, body, used())
	}
	done := make(chan int, 1)
	go func() { code, _ := keyedChat(t, p, secretTeam); done <- code }()
	eventually(t, 10*time.Second, "the second request at the upstream", func() bool { return n.Load() == 2 })
	before := p.metric("llm_proxy_state_errors_total")
	busy := make(chan error, 1)
	go func() {
		// Redis reads nothing else for 1.5 s.
		busy <- c.Eval(context.Background(), `local t = redis.call('TIME')
local stop = tonumber(t[1]) * 1000000 + tonumber(t[2]) + 1500000
repeat t = redis.call('TIME') until tonumber(t[1]) * 1000000 + tonumber(t[2]) >= stop
return 1`, nil).Err()
	}()
	probe := rs.client()
	defer probe.Close()
	eventually(t, 5*time.Second, "Redis busy", func() bool {
		answered := make(chan struct{})
		go func() { probe.Ping(context.Background()); close(answered) }()
		select {
		case <-answered:
			return false
		case <-time.After(100 * time.Millisecond):
			return true
		}
	})
	close(release)
	if code := <-done; code != http.StatusOK {
		t.Fatalf("the second request answered %d", code)
	}
	if err := <-busy; err != nil {
		t.Fatal(err)
	}
	if p.metric("llm_proxy_state_errors_total") == before {
		t.Fatal("no Redis call failed while Redis was busy; the test lost its premise")
	}
	eventually(t, 10*time.Second, "the second request's use in Redis", func() bool { return atoi(used()) >= 2040 })
	// Healthy again means a renewal went through, the pending settlement
	// included; the next ones (every second while unhealthy) would send it
	// once more if it were still pending.
	waitHealthy(t, p, true)
	time.Sleep(2 * time.Second)
	if got := used(); got != "2040" {
		t.Fatalf("the key used %q tokens in Redis after two requests of 1020, want 2040 (the lost answer's settlement charged once)", got)
	}
}
