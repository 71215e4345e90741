package integration

// Issue 16: shared state across Caddy instances through Redis.
// These tests run a real redis-server and real Caddy processes (the load
// benchmark's binary: Caddy's standard main with this module), so that two
// instances share nothing but Redis.

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisServer is a redis-server of the test's own, on a free loopback port,
// without persistence.
type redisServer struct {
	t    testing.TB
	addr string
	port int
	dir  string
	cmd  *exec.Cmd
}

// startRedis starts redis-server. Missing, it fails the test (it does not
// skip): ./test.sh installs Debian's redis-server.
func startRedis(t testing.TB) *redisServer {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatal("redis-server is not installed (./test.sh installs it, or apt-get install redis-server)")
	}
	r := &redisServer{t: t, port: freePort(t), dir: t.TempDir()}
	r.addr = fmt.Sprintf("127.0.0.1:%d", r.port)
	r.start()
	t.Cleanup(r.stop)
	return r
}

func (r *redisServer) start() {
	r.t.Helper()
	r.cmd = exec.Command("redis-server", "--port", fmt.Sprint(r.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", r.dir, "--enable-debug-command", "local")
	if err := r.cmd.Start(); err != nil {
		r.t.Fatalf("starting redis-server: %v", err)
	}
	c := r.client()
	defer c.Close()
	eventually(r.t, 10*time.Second, "redis-server answering", func() bool {
		return c.Ping(context.Background()).Err() == nil
	})
}

func (r *redisServer) stop() {
	if r.cmd == nil {
		return
	}
	_ = r.cmd.Process.Kill()
	_ = r.cmd.Wait()
	r.cmd = nil
}

func (r *redisServer) client() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: r.addr, DisableIdentity: true})
}

var (
	caddyBinOnce sync.Once
	caddyBin     string
	caddyBinErr  error
)

// buildCaddy builds the Caddy binary once per test run.
func buildCaddy(t testing.TB) string {
	t.Helper()
	caddyBinOnce.Do(func() {
		dir, err := os.MkdirTemp("", "llm-route-caddy-")
		if err != nil {
			caddyBinErr = err
			return
		}
		caddyBin = filepath.Join(dir, "caddy")
		out, err := exec.Command("go", "build", "-o", caddyBin, "./loadbench/caddy").CombinedOutput()
		if err != nil {
			caddyBinErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if caddyBinErr != nil {
		t.Fatal(caddyBinErr)
	}
	return caddyBin
}

// instance is a Caddy process; its proxy value talks to it over HTTP.
type instance struct {
	*proxy
	cmd *exec.Cmd
}

// startInstance runs a Caddy process with one llm_route handler.
func startInstance(t testing.TB, handler map[string]any) *instance {
	t.Helper()
	bin := buildCaddy(t)
	p := &proxy{t: t, port: freePort(t), aport: freePort(t)}
	p.URL = fmt.Sprintf("http://127.0.0.1:%d", p.port)
	p.admin = fmt.Sprintf("http://127.0.0.1:%d", p.aport)
	dir := t.TempDir()
	p.logPath = filepath.Join(dir, "caddy.log")
	conf := filepath.Join(dir, "caddy.json")
	if err := os.WriteFile(conf, p.config(handler), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "run", "--config", conf)
	cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	in := &instance{proxy: p, cmd: cmd}
	t.Cleanup(in.kill)
	eventually(t, 20*time.Second, "the Caddy process serving", func() bool {
		resp, err := testClient.Get(p.URL + "/v1/models")
		if err != nil {
			return false
		}
		resp.Body.Close()
		// 401: the handler answers, and its config has client keys.
		return resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusUnauthorized
	})
	return in
}

// kill ends the process with SIGKILL: no cleanup, no lease released.
func (in *instance) kill() {
	if in.cmd.Process == nil || in.cmd.ProcessState != nil {
		return
	}
	_ = in.cmd.Process.Signal(syscall.SIGKILL)
	_ = in.cmd.Wait()
}

// fleetConfig is one provider with one upstream of the given limit and a
// model m that queues, on the redis state at addr.
func fleetConfig(up *fakeUpstream, addr string, limit int, state ...any) map[string]any {
	st := obj("backend", "redis", "address", addr, "prefix", "t:", "lease_ttl", "3s")
	for i := 0; i+1 < len(state); i += 2 {
		st[state[i].(string)] = state[i+1]
	}
	return cfg(
		[]map[string]any{obj("id", "p1", "url", up.base())},
		[]map[string]any{obj("id", "u1", "provider", "p1", "model", "real", "max_concurrency", limit)},
		[]map[string]any{obj("name", "m", "upstreams", []string{"u1"})},
		"queue_size", 100, "queue_timeout", "60s", "state", st,
	)
}

// waitHealthy waits until a proxy (in-process or an instance) reports its
// redis state healthy, or unhealthy.
func waitHealthy(t testing.TB, in interface{ status() (statusJSON, string) }, healthy bool) {
	t.Helper()
	eventually(t, 15*time.Second, fmt.Sprintf("state healthy=%v", healthy), func() bool {
		_, body := in.status()
		return strings.Contains(body, fmt.Sprintf(`"state":{"backend":"redis","healthy":%v`, healthy))
	})
}

func TestFleetTwoProcessesShareUpstreamLimit(t *testing.T) {
	rs := startRedis(t)
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(100 * time.Millisecond)
		completion("ok")(w, r)
	})
	a := startInstance(t, fleetConfig(up, rs.addr, 2))
	b := startInstance(t, fleetConfig(up, rs.addr, 2))
	waitHealthy(t, a, true)
	waitHealthy(t, b, true)

	start := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	for i := 0; i < 50; i++ {
		in := []*instance{a, b}[i%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := in.post(context.Background(), chatBody("m", false))
			if err != nil {
				t.Errorf("request: %v", err)
				return
			}
			readAll(t, resp)
			mu.Lock()
			codes[resp.StatusCode]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if codes[http.StatusOK] != 50 {
		t.Errorf("statuses %v, want 50 × 200 (queued for the shared slots)", codes)
	}
	if peak := up.peak.Load(); peak != 2 {
		t.Errorf("the fake's concurrency peak = %d, want exactly 2 (limit 2 shared by two instances)", peak)
	}
	t.Logf("50 requests over two processes, limit 2, 100 ms each: %v, peak %d", elapsed, up.peak.Load())
	// Both served some: the load really was spread.
	for name, in := range map[string]*instance{"a": a, "b": b} {
		if n := in.metric("llm_proxy_requests_total", "model", "m", "provider", "p1", "result", "ok", "upstream", "u1"); n == 0 {
			t.Errorf("instance %s served no request", name)
		}
	}
	st, body := a.status()
	if len(st.Upstreams) != 1 || !strings.Contains(body, `"fleet_inflight":0`) {
		t.Errorf("status lacks the fleet-wide use of u1 (0 at rest): %s", body)
	}
}

func TestFleetKilledInstanceLeaseExpires(t *testing.T) {
	rs := startRedis(t)
	g := newGate()
	defer g.open()
	up := newUpstream(t, g.handler(completion("held")))
	conf := fleetConfig(up, rs.addr, 1, "lease_ttl", "2s")
	conf["queue_size"] = 0
	a := startInstance(t, conf)
	b := startInstance(t, conf)
	waitHealthy(t, a, true)
	waitHealthy(t, b, true)

	go func() {
		if resp, err := a.post(context.Background(), chatBody("m", false)); err == nil {
			resp.Body.Close()
		}
	}()
	g.waitArrivals(t, 1)
	expectAPIError(t, b.chat(chatBody("m", false)), http.StatusServiceUnavailable, "all_upstreams_busy")

	a.kill()
	killed := time.Now()
	up.setHandler(completion("after"))
	for {
		resp := b.chat(chatBody("m", false))
		body := readAll(t, resp)
		if resp.StatusCode == http.StatusOK {
			break
		}
		if time.Since(killed) > 2*time.Second+time.Second {
			t.Fatalf("the killed instance's slot is still held %v after the kill (lease_ttl 2s): %d %s",
				time.Since(killed), resp.StatusCode, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("slot back %v after kill -9 (lease_ttl 2s)", time.Since(killed))
}

func TestFleetRedisDownFallsBackAndRecovers(t *testing.T) {
	rs := startRedis(t)
	g := newGate()
	defer g.open()
	up := newUpstream(t, g.handler(completion("ok")))
	conf := fleetConfig(up, rs.addr, 1)
	conf["queue_size"] = 0
	a := startInstance(t, conf)
	b := startInstance(t, conf)
	waitHealthy(t, a, true)
	waitHealthy(t, b, true)

	rs.stop()
	// Local accounting, same limits: each instance serves one at a time.
	ra := a.goChat(context.Background(), chatBody("m", false))
	rb := b.goChat(context.Background(), chatBody("m", false))
	g.waitArrivals(t, 2)
	expectAPIError(t, a.chat(chatBody("m", false)), http.StatusServiceUnavailable, "all_upstreams_busy")
	g.open()
	for _, ch := range []<-chan result{ra, rb} {
		if r := await(t, ch); r.status != http.StatusOK {
			t.Fatalf("under local accounting: status %d %s", r.status, r.body)
		}
	}
	for _, in := range []*instance{a, b} {
		waitHealthy(t, in, false)
		if n := len(in.logEntries("shared state unreachable, local accounting until it answers")); n != 1 {
			t.Errorf("ERROR entries for the transition = %d, want exactly 1", n)
		}
		if in.metric("llm_proxy_state_errors_total") < 1 {
			t.Error("llm_proxy_state_errors_total did not count the failures")
		}
	}

	// Redis back (empty: its state was lost): shared again by itself.
	rs.start()
	waitHealthy(t, a, true)
	waitHealthy(t, b, true)
	g2 := newGate()
	defer g2.open()
	up.setHandler(g2.handler(completion("again")))
	held := a.goChat(context.Background(), chatBody("m", false))
	g2.waitArrivals(t, 1)
	expectAPIError(t, b.chat(chatBody("m", false)), http.StatusServiceUnavailable, "all_upstreams_busy")
	g2.open()
	if r := await(t, held); r.status != http.StatusOK {
		t.Fatalf("after recovery: status %d %s", r.status, r.body)
	}
	// Nothing counted twice: at rest the fleet holds nothing.
	eventually(t, 5*time.Second, "fleet-wide use back to 0", func() bool {
		_, body := b.status()
		return strings.Contains(body, `"fleet_inflight":0`)
	})
	resp := b.chat(chatBody("m", false))
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("after recovery, idle fleet: %d %s", resp.StatusCode, body)
	}
}

func TestFleetSlowRedisNeverHoldsARequest(t *testing.T) {
	rs := startRedis(t)
	up := newUpstream(t, nil)
	a := startInstance(t, fleetConfig(up, rs.addr, 2))
	waitHealthy(t, a, true)

	c := rs.client()
	defer c.Close()
	go func() { _ = c.Do(context.Background(), "DEBUG", "SLEEP", "3").Err() }()
	time.Sleep(200 * time.Millisecond) // the sleep has begun
	for i := 0; i < 5; i++ {
		start := time.Now()
		resp := a.chat(chatBody("m", false))
		body := readAll(t, resp)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("with Redis asleep: %d %s", resp.StatusCode, body)
		}
		// timeout 50 ms per call, claim + release: well under a second even
		// on a loaded machine, against Redis's 3 s sleep.
		if d := time.Since(start); d > time.Second {
			t.Errorf("request %d took %v with Redis asleep; each call is bounded by 50ms", i, d)
		}
	}
}

// TestFleetRequestPathFailureRechecksSoon: one Redis call of a request
// that times out puts the instance on its fallback; it is back on Redis
// within about a second of Redis answering again, not at the next renewal
// (lease_ttl/3, here 20 s).
func TestFleetRequestPathFailureRechecksSoon(t *testing.T) {
	rs := startRedis(t)
	up := newUpstream(t, nil)
	a := startInstance(t, fleetConfig(up, rs.addr, 2, "lease_ttl", "60s"))
	waitHealthy(t, a, true)

	c := rs.client()
	defer c.Close()
	slept := make(chan struct{})
	go func() { _ = c.Do(context.Background(), "DEBUG", "SLEEP", "1").Err(); close(slept) }()
	time.Sleep(200 * time.Millisecond) // the sleep has begun
	resp := a.chat(chatBody("m", false))
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("with Redis asleep: %d %s", resp.StatusCode, body)
	}
	waitHealthy(t, a, false) // the claim timed out (50 ms)
	<-slept
	awake := time.Now()
	// About a second after the failure, a second more if that check fell
	// in the sleep; 6 s of margin for a loaded machine, against 20 s.
	eventually(t, 6*time.Second, "back on Redis soon after it answers", func() bool {
		_, body := a.status()
		return strings.Contains(body, `"state":{"backend":"redis","healthy":true`)
	})
	t.Logf("back on Redis %v after it woke", time.Since(awake).Round(time.Millisecond))
}

// A cooling seen by one instance keeps the other off the upstream: a
// backoff scope's failure (500, backoff 30s), and the Retry-After hold of an
// upstream without a backoff scope (429 Retry-After: 30), for as long as it
// asked.
func TestFleetCoolingSeenByTheOtherInstance(t *testing.T) {
	for _, tc := range []struct {
		name     string
		bad      http.HandlerFunc
		provider map[string]any
		minCool  float64 // seconds of cooling instance b must show
	}{
		{"backoff scope", status(http.StatusInternalServerError), obj("backoff", "30s"), 0},
		{"Retry-After hold without backoff", status(http.StatusTooManyRequests, "Retry-After", "30"), obj(), 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := startRedis(t)
			bad := newUpstream(t, tc.bad)
			good := newUpstream(t, completion("good"))
			pb := obj("id", "pb", "url", bad.base(), "probe_interval", "0s")
			for k, v := range tc.provider {
				pb[k] = v
			}
			conf := cfg(
				[]map[string]any{pb, obj("id", "pg", "url", good.base())},
				[]map[string]any{obj("id", "ub", "provider", "pb", "model", "x"), obj("id", "ug", "provider", "pg", "model", "x")},
				[]map[string]any{obj("name", "m", "upstreams", []string{"ub", "ug"})},
				"state", obj("backend", "redis", "address", rs.addr, "prefix", "c:"),
			)
			a := startInstance(t, conf)
			b := startInstance(t, conf)
			waitHealthy(t, a, true)
			waitHealthy(t, b, true)

			resp := a.chat(chatBody("m", false))
			if body := readAll(t, resp); resp.StatusCode != http.StatusOK || !strings.Contains(body, "good") {
				t.Fatalf("instance a: %d %s", resp.StatusCode, body)
			}
			if n := len(bad.Calls()); n != 1 {
				t.Fatalf("the failing upstream got %d calls, want 1", n)
			}
			eventually(t, 5*time.Second, "instance b sees ub cooling", func() bool {
				st, _ := b.status()
				for _, u := range st.Upstreams {
					if u.ID == "ub" {
						return u.CoolingSeconds > tc.minCool
					}
				}
				return false
			})
			for range 3 {
				resp = b.chat(chatBody("m", false))
				if body := readAll(t, resp); resp.StatusCode != http.StatusOK || !strings.Contains(body, "good") {
					t.Fatalf("instance b: %d %s", resp.StatusCode, body)
				}
			}
			if n := len(bad.Calls()); n != 1 {
				t.Errorf("instance b tried the upstream that cools on instance a: %d calls, want 1", n)
			}
		})
	}
}

// An in-process Caddy on the redis state, reloaded to memory and back:
// each reload cleans the old fleet up (its listener, renewals, poll) without
// hanging, and the status names the backend in use.
func TestFleetReloadSwitchesBackend(t *testing.T) {
	rs := startRedis(t)
	up := newUpstream(t, nil)
	conf := fleetConfig(up, rs.addr, 2)
	p := startProxy(t, conf)
	eventually(t, 10*time.Second, "redis state healthy", func() bool {
		_, body := p.status()
		return strings.Contains(body, `"state":{"backend":"redis","healthy":true}`)
	})
	if resp := p.chat(chatBody("m", false)); resp.StatusCode != http.StatusOK {
		t.Fatalf("on redis: %d %s", resp.StatusCode, readAll(t, resp))
	} else {
		readAll(t, resp)
	}
	memory := fleetConfig(up, rs.addr, 2)
	delete(memory, "state")
	done := make(chan struct{})
	go func() {
		p.load(memory)
		p.load(conf)
		p.load(memory)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("reloading away from the redis state hangs")
	}
	if _, body := p.status(); !strings.Contains(body, `"state":{"backend":"memory","healthy":true}`) {
		t.Errorf("status after the reload to memory: %s", body)
	}
	resp := p.chat(chatBody("m", false))
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("on memory after reloads: %d %s", resp.StatusCode, body)
	}
}

// TestFaultSoakRedis is the fault soak on the redis state (shorter by
// default: 10s, LLM_ROUTE_SOAK overrides), with the same invariants: no
// upstream over its limit, no leaked slot or goroutine, every answer whole.
func TestFaultSoakRedis(t *testing.T) {
	rs := startRedis(t)
	if os.Getenv("LLM_ROUTE_SOAK") == "" {
		t.Setenv("LLM_ROUTE_SOAK", "10s")
	}
	soakState = obj("backend", "redis", "address", rs.addr, "prefix", "soak:", "lease_ttl", "3s")
	defer func() { soakState = nil }()
	TestFaultSoak(t)

	// The soak really ran on Redis: claims and releases are script calls.
	c := rs.client()
	defer c.Close()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var calls int
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_evalsha:calls="); ok {
			fmt.Sscanf(rest, "%d", &calls)
		}
	}
	if calls < 100 {
		t.Errorf("Redis saw %d script calls during the soak; the redis state was not in use", calls)
	}
	t.Logf("script calls during the soak: %d", calls)
}

// on_state_error reject: while Redis is away, requests get 503 (no local
// admission), and the instance takes requests again once Redis answers.
func TestFleetRejectWhileRedisIsDown(t *testing.T) {
	rs := startRedis(t)
	up := newUpstream(t, nil)
	conf := fleetConfig(up, rs.addr, 2, "on_state_error", "reject")
	conf["queue_size"] = 0
	p := startProxy(t, conf)
	healthy := func(want bool) {
		t.Helper()
		eventually(t, 15*time.Second, fmt.Sprintf("state healthy=%v", want), func() bool {
			_, body := p.status()
			return strings.Contains(body, fmt.Sprintf(`"state":{"backend":"redis","healthy":%v`, want))
		})
	}
	healthy(true)
	rs.stop()
	// The first request may be the one that finds Redis gone; from then on
	// every request is refused.
	_ = readAll(t, p.chat(chatBody("m", false)))
	healthy(false)
	calls := len(up.Calls())
	for i := 0; i < 3; i++ {
		expectAPIError(t, p.chat(chatBody("m", false)), http.StatusServiceUnavailable, "all_upstreams_busy")
	}
	if n := len(up.Calls()); n != calls {
		t.Errorf("the upstream got %d requests while Redis was down under reject", n-calls)
	}
	if _, body := p.status(); !strings.Contains(body, `"fallback":"reject"`) {
		t.Errorf("status does not name the reject fallback: %s", body)
	}
	rs.start()
	healthy(true)
	resp := p.chat(chatBody("m", false))
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("after Redis came back: %d %s", resp.StatusCode, body)
	}
}

// TestFleetSkippedNamesFleetFull: under state redis, a proxy 503 names a
// limit that the fleet found full although this instance's own counts have
// room (another instance holds the slot), with fleet_full after its local
// counts.
func TestFleetSkippedNamesFleetFull(t *testing.T) {
	r := startRedis(t)
	rc := r.client()
	defer rc.Close()
	for _, tc := range []struct {
		name       string
		limit, cap int
		hash, want string
	}{
		{"upstream", 1, 0, "t:up:u1", "u1=busy 0/1 fleet_full"},
		{"provider", 2, 1, "t:prov:p1", "u1=provider_capacity 0/1 fleet_full"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t, completion("ok"))
			ctx := context.Background()
			if err := rc.FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			prov := obj("id", "p1", "url", up.base())
			if tc.cap > 0 {
				prov["capacity"] = tc.cap
			}
			p := startProxy(t, cfg(
				[]map[string]any{prov},
				[]map[string]any{obj("id", "u1", "provider", "p1", "model", "real", "max_concurrency", tc.limit)},
				[]map[string]any{obj("name", "m", "upstreams", []string{"u1"})},
				"state", obj("backend", "redis", "address", r.addr, "prefix", "t:", "lease_ttl", "3s"),
			))
			// Another instance holds what is left, on a lease far ahead.
			held := int64(tc.limit)
			if tc.cap > 0 {
				held = int64(tc.cap)
			}
			if err := rc.HSet(ctx, tc.hash, "other", held).Err(); err != nil {
				t.Fatal(err)
			}
			if err := rc.ZAdd(ctx, tc.hash+":leases", redis.Z{Score: 9e12, Member: "other"}).Err(); err != nil {
				t.Fatal(err)
			}
			waitHealthy(t, p, true)
			resp := p.chat(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
			readAll(t, resp)
			if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("X-LLM-Route-Skipped") != tc.want {
				t.Fatalf("status %d, X-LLM-Route-Skipped %q; want 503 and %q", resp.StatusCode, resp.Header.Get("X-LLM-Route-Skipped"), tc.want)
			}
			if n := len(up.Calls()); n != 0 {
				t.Fatalf("the upstream was called %d times past the fleet's limit", n)
			}
			// The other instance lets go: this one is served.
			if err := rc.Del(ctx, tc.hash, tc.hash+":leases").Err(); err != nil {
				t.Fatal(err)
			}
			if resp := p.chat(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`); resp.StatusCode != http.StatusOK {
				t.Fatalf("after the release: %d %s", resp.StatusCode, readAll(t, resp))
			} else {
				readAll(t, resp)
			}
		})
	}
}
