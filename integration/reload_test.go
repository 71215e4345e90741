package integration

// Issue #3: slot accounting across config reloads and client cancels.

import (
	"context"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"
)

// llmHandler turns a handler config into a route handler object.
func llmHandler(conf map[string]any) map[string]any {
	h := map[string]any{"handler": "llm_route"}
	for k, v := range conf {
		h[k] = v
	}
	return h
}

func TestReloadKeepsHeldSlot(t *testing.T) {
	g := newGate()
	defer g.open()
	up := newUpstream(t, g.handler(completion("held")))
	conf := basicConfig(up, 1)
	p := startProxy(t, conf)

	held := p.goChat(context.Background(), chatBody("m", false))
	g.waitArrivals(t, 1)

	// A different config (new model patch, a second model), same upstream id.
	conf2 := basicConfig(up, 1)
	conf2["models"] = []any{
		obj("name", "m", "upstreams", []string{"u1"}, "patch", obj("reloaded", true)),
		obj("name", "m2", "upstreams", []string{"u1"}),
	}
	p.load(conf2)

	// The new config sees the slot as taken, for either model.
	expectAPIError(t, p.chat(chatBody("m", false)), http.StatusServiceUnavailable, "all_upstreams_busy")
	expectAPIError(t, p.chat(chatBody("m2", false)), http.StatusServiceUnavailable, "all_upstreams_busy")
	if got := p.upstreamGauge("inflight", "u1", "p1"); got != 1 {
		t.Errorf("inflight after reload = %v, want 1", got)
	}

	g.open()
	if r := await(t, held); r.status != http.StatusOK || !strings.Contains(r.body, "held") {
		t.Fatalf("request started before the reload: status %d body %s", r.status, r.body)
	}
	eventually(t, 2*time.Second, "the old request's slot freed in the new accounting", func() bool {
		return p.upstreamGauge("inflight", "u1", "p1") == 0
	})
	resp := p.chat(chatBody("m", false))
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("after the held request ended: status %d: %s", resp.StatusCode, body)
	}
	calls := up.Calls()
	if len(calls) != 2 || !strings.Contains(string(calls[1].Body), `"reloaded":true`) {
		t.Errorf("calls = %d; the new request must use the new config", len(calls))
	}
}

func TestReloadChangedLimitAppliesAtOnce(t *testing.T) {
	g := newGate()
	defer g.open()
	up := newUpstream(t, g.handler(completion("ok")))
	p := startProxy(t, basicConfig(up, 1))
	ctx := context.Background()

	first := p.goChat(ctx, chatBody("m", false))
	g.waitArrivals(t, 1)
	expectAPIError(t, p.chat(chatBody("m", false)), http.StatusServiceUnavailable, "all_upstreams_busy")

	p.load(basicConfig(up, 2)) // raised: one more fits right away
	second := p.goChat(ctx, chatBody("m", false))
	g.waitArrivals(t, 1)
	expectAPIError(t, p.chat(chatBody("m", false)), http.StatusServiceUnavailable, "all_upstreams_busy")

	p.load(basicConfig(up, 1)) // lowered below what is in flight
	expectAPIError(t, p.chat(chatBody("m", false)), http.StatusServiceUnavailable, "all_upstreams_busy")
	if got := p.upstreamGauge("inflight", "u1", "p1"); got != 2 {
		t.Errorf("inflight = %v, want 2", got)
	}

	g.open()
	for _, ch := range []<-chan result{first, second} {
		if r := await(t, ch); r.status != http.StatusOK {
			t.Errorf("held request: status %d body %s", r.status, r.body)
		}
	}
	if peak := up.peak.Load(); peak != 2 {
		t.Errorf("upstream peak = %d, want 2", peak)
	}
	eventually(t, 2*time.Second, "inflight 0", func() bool { return p.upstreamGauge("inflight", "u1", "p1") == 0 })
	resp := p.chat(chatBody("m", false))
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
}

// TestFailedLoadKeepsRunningLimits: a config that provisions this handler
// but fails later (here: in a second handler) is never used, so it must not
// change the running config's slot limits.
func TestFailedLoadKeepsRunningLimits(t *testing.T) {
	g := newGate()
	defer g.open()
	up := newUpstream(t, g.handler(completion("ok")))
	running := basicConfig(up, 1)
	running["request_timeout"] = "5s" // so a request let through by mistake ends
	p := startProxy(t, running)

	held := p.goChat(context.Background(), chatBody("m", false))
	g.waitArrivals(t, 1)

	broken := basicConfig(up, 1)
	broken["models"] = []any{obj("name", "x", "upstreams", []string{"ghost"})}
	err := p.loadRoutes([]any{
		obj("match", []any{obj("path", []string{"/v1/*"})}, "handle", []any{llmHandler(basicConfig(up, 5))}),
		obj("handle", []any{llmHandler(broken)}),
	})
	if err == nil || !strings.Contains(err.Error(), "ghost") {
		t.Fatalf("load error = %v, want one naming the unknown upstream", err)
	}
	// Still the running config's limit of 1.
	expectAPIError(t, p.chat(chatBody("m", false)), http.StatusServiceUnavailable, "all_upstreams_busy")
	g.open()
	if r := await(t, held); r.status != http.StatusOK {
		t.Fatalf("held request: status %d body %s", r.status, r.body)
	}
	if n := len(up.Calls()); n != 1 {
		t.Errorf("upstream calls = %d, want 1", n)
	}
}

func TestClientCancelFreesSlot(t *testing.T) {
	ev1 := "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"one\"}}]}\n\n"
	upstreamDone := make(chan struct{}, 2)
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		defer func() { upstreamDone <- struct{}{} }()
		if !isStream(r) {
			completion("after")(w, r)
			return
		}
		if strings.Contains(r.Header.Get("X-Test-Phase"), "before-headers") {
			<-r.Context().Done()
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, ev1)
		http.NewResponseController(w).Flush()
		<-r.Context().Done() // a long generation, until the proxy hangs up
	})
	p := startProxy(t, basicConfig(up, 1))

	for _, phase := range []string{"mid-stream", "before-headers"} {
		t.Run(phase, func(t *testing.T) {
			cancelled := p.requests("m", "u1", "p1", "cancelled")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			respCh := make(chan *http.Response, 1)
			go func() {
				resp, err := p.post(ctx, chatBody("m", true), "X-Test-Phase", phase)
				if err != nil {
					respCh <- nil
					return
				}
				respCh <- resp
			}()
			if phase == "mid-stream" {
				var resp *http.Response
				select {
				case resp = <-respCh:
				case <-time.After(10 * time.Second):
					t.Fatal("no response headers")
				}
				if resp == nil {
					t.Fatal("request failed")
				}
				defer resp.Body.Close()
				buf := make([]byte, len(ev1))
				if _, err := io.ReadFull(resp.Body, buf); err != nil || string(buf) != ev1 {
					t.Fatalf("first event %q, %v", buf, err)
				}
			} else {
				eventually(t, 5*time.Second, "the request reaching the upstream", func() bool { return len(up.Calls()) > 0 })
			}
			if got := p.upstreamGauge("inflight", "u1", "p1"); got != 1 {
				t.Fatalf("inflight while streaming = %v", got)
			}
			cancel()
			eventually(t, time.Second, "slot released after the client left", func() bool {
				return p.upstreamGauge("inflight", "u1", "p1") == 0
			})
			select {
			case <-upstreamDone:
			case <-time.After(5 * time.Second):
				t.Fatal("the upstream request was not cancelled")
			}
			eventually(t, time.Second, "the cancelled result counted", func() bool {
				return p.requests("m", "u1", "p1", "cancelled")-cancelled == 1
			})
			if s := p.upstreamGauge("fail_streak", "u1", "p1"); s != 0 {
				t.Errorf("a client cancel counted as an upstream failure: fail_streak %v", s)
			}
			// The slot is really free: the limit is 1.
			resp := p.chat(chatBody("m", false))
			if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
				t.Fatalf("after cancel: status %d: %s", resp.StatusCode, body)
			}
			<-upstreamDone
			up.mu.Lock()
			up.calls = nil
			up.mu.Unlock()
		})
	}
}

func TestReloadsLeakNoGoroutines(t *testing.T) {
	up := newUpstream(t, nil)
	conf := func(limit int) map[string]any {
		c := basicConfig(up, limit)
		// A backoff makes the prober run, a session header the session code.
		c["providers"] = []any{obj("id", "p1", "url", up.base(), "key", "sk-test-secret-1", "backoff", "10s",
			"probe_interval", "100ms", "session_header", "X-Session")}
		return c
	}
	p := startProxy(t, conf(1))
	exercise := func() {
		for _, stream := range []bool{false, true} {
			resp := p.chat(chatBody("m", stream))
			if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
		}
		p.metrics()
	}
	exercise()
	settle := func() int {
		var n int
		// Idle connections and finished servers wind down asynchronously.
		for i := 0; i < 20; i++ {
			up.CloseClientConnections()
			runtime.GC()
			n = runtime.NumGoroutine()
			time.Sleep(10 * time.Millisecond)
		}
		return n
	}
	baseline := settle()

	for i := 0; i < 50; i++ {
		p.load(conf(1 + i%3))
		if i%10 == 0 {
			exercise()
		}
	}
	exercise()
	const tolerance = 8
	var n int
	eventually(t, 10*time.Second, "goroutines back to the baseline", func() bool {
		up.CloseClientConnections()
		n = runtime.NumGoroutine()
		return n <= baseline+tolerance
	})
	t.Logf("goroutines: baseline %d, after 50 reloads %d", baseline, n)
}

// TestReloadRemovesAndReAddsUpstream: a reload drops an upstream while a
// request holds its only slot, a second reload adds it back. The request is
// still counted against the limit until it ends.
func TestReloadRemovesAndReAddsUpstream(t *testing.T) {
	g := newGate()
	defer g.open()
	up := newUpstream(t, g.handler(completion("ok")))
	other := newUpstream(t, nil)
	p := startProxy(t, basicConfig(up, 1))
	held := p.goChat(context.Background(), chatBody("m", false))
	g.waitArrivals(t, 1)

	without := cfg(
		[]map[string]any{obj("id", "p2", "url", other.base())},
		[]map[string]any{obj("id", "u2", "provider", "p2", "model", "y")},
		[]map[string]any{obj("name", "m", "upstreams", []string{"u2"})},
	)
	p.load(without)
	resp := p.chat(chatBody("m", false))
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("without u1: %d %s", resp.StatusCode, body)
	}
	p.load(basicConfig(up, 1)) // u1 is back, its request still running
	expectAPIError(t, p.chat(chatBody("m", false)), http.StatusServiceUnavailable, "all_upstreams_busy")
	if got := p.upstreamGauge("inflight", "u1", "p1"); got != 1 {
		t.Errorf("inflight of the re-added upstream = %v, want 1", got)
	}
	g.open()
	if r := await(t, held); r.status != http.StatusOK {
		t.Fatalf("held request: %d %s", r.status, r.body)
	}
	eventually(t, 2*time.Second, "inflight 0", func() bool { return p.upstreamGauge("inflight", "u1", "p1") == 0 })
	resp = p.chat(chatBody("m", false))
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("after the held request: %d %s", resp.StatusCode, body)
	}
}
