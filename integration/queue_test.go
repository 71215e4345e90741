package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// gatedUpstream answers each request only when the test lets it through,
// recording the order in which requests arrived (by their message text).
type gatedUpstream struct {
	*fakeUpstream
	gate chan struct{}
	mu   sync.Mutex
	seen []string
}

func newGatedUpstream(t *testing.T) *gatedUpstream {
	g := &gatedUpstream{gate: make(chan struct{}, 1000)}
	g.fakeUpstream = newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var req struct {
			Messages []struct{ Content string } `json:"messages"`
		}
		_ = json.Unmarshal(b, &req)
		g.mu.Lock()
		if len(req.Messages) > 0 {
			g.seen = append(g.seen, req.Messages[0].Content)
		}
		g.mu.Unlock()
		select {
		case <-g.gate:
		case <-r.Context().Done():
			return
		}
		completion("ok")(w, r)
	})
	return g
}

func (g *gatedUpstream) order() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.seen...)
}

func (g *gatedUpstream) let(n int) {
	for i := 0; i < n; i++ {
		g.gate <- struct{}{}
	}
}

func qBody(model, text string) string {
	return fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}]}`, model, text)
}

// send posts a chat request in the background; its status arrives on the
// returned channel.
func (p *proxy) send(ctx context.Context, body string) <-chan int {
	ch := make(chan int, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, p.URL+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := testClient.Do(req)
		if err != nil {
			ch <- -1
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		ch <- resp.StatusCode
	}()
	return ch
}

func (p *proxy) queueDepth(model string) float64 {
	v, _ := p.metricValue(fmt.Sprintf(`llm_proxy_queue_depth{model=%q}`, model))
	return v
}

func (p *proxy) inflight(upstream, provider string) float64 {
	v, _ := p.metricValue(fmt.Sprintf(`llm_proxy_upstream_inflight{provider=%q,upstream=%q}`, provider, upstream))
	return v
}

func queueConfig(up *fakeUpstream, limit, size int, timeout string) map[string]any {
	cfg := basicConfig(up, limit)
	cfg["queue_size"] = size
	cfg["queue_timeout"] = timeout
	return cfg
}

// TestQueueServesInArrivalOrder: ten requests against a one-slot upstream
// are all served, one at a time, in the order they arrived.
func TestQueueServesInArrivalOrder(t *testing.T) {
	up := newGatedUpstream(t)
	p := startProxy(t, queueConfig(up.fakeUpstream, 1, 10, "30s"))
	admitted := `llm_proxy_queue_wait_seconds_count{model="m",result="admitted"}`
	before, _ := p.metricValue(admitted)

	var results []<-chan int
	for i := 0; i < 10; i++ {
		results = append(results, p.send(context.Background(), qBody("m", fmt.Sprintf("req-%d", i))))
		if i == 0 {
			eventually(t, 5*time.Second, "first request at the upstream", func() bool { return len(up.order()) == 1 })
			continue
		}
		want := float64(i)
		eventually(t, 5*time.Second, fmt.Sprintf("queue depth %d", i), func() bool { return p.queueDepth("m") == want })
	}
	up.let(10)
	for i, ch := range results {
		if code := <-ch; code != http.StatusOK {
			t.Errorf("request %d: status %d", i, code)
		}
	}
	got := up.order()
	for i, s := range got {
		if s != fmt.Sprintf("req-%d", i) {
			t.Fatalf("served order %v, want req-0..req-9", got)
		}
	}
	if len(got) != 10 {
		t.Fatalf("upstream saw %d requests", len(got))
	}
	if peak := up.peak.Load(); peak != 1 {
		t.Errorf("upstream peak concurrency %d, want 1", peak)
	}
	eventually(t, time.Second, "queue empty", func() bool { return p.queueDepth("m") == 0 })
	if v, ok := p.metricValue(admitted); !ok || v-before != 10 {
		t.Errorf("admitted count grew by %v (%v), want 10", v-before, ok)
	}
}

// TestQueueFull: with the slot taken and the queue at its size, the next
// request gets 503 "queue full" at once.
func TestQueueFull(t *testing.T) {
	up := newGatedUpstream(t)
	p := startProxy(t, queueConfig(up.fakeUpstream, 1, 2, "30s"))
	full := `llm_proxy_queue_wait_seconds_count{model="m",result="full"}`
	before, _ := p.metricValue(full)
	first := p.send(context.Background(), qBody("m", "hold"))
	eventually(t, 5*time.Second, "slot taken", func() bool { return len(up.order()) == 1 })
	w1 := p.send(context.Background(), qBody("m", "w1"))
	w2 := p.send(context.Background(), qBody("m", "w2"))
	eventually(t, 5*time.Second, "two waiting", func() bool { return p.queueDepth("m") == 2 })

	resp := p.chat(qBody("m", "overflow"))
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, `"message":"queue full"`) || !strings.Contains(body, `"code":"queue_full"`) {
		t.Fatalf("overflow: %d %s", resp.StatusCode, body)
	}
	up.let(3)
	for _, ch := range []<-chan int{first, w1, w2} {
		if code := <-ch; code != http.StatusOK {
			t.Errorf("status %d", code)
		}
	}
	if v, _ := p.metricValue(full); v-before != 1 {
		t.Errorf("full count grew by %v, want 1", v-before)
	}
}

// TestQueueTimeout: a waiter whose slot never frees gets 503 with
// Retry-After after queue_timeout, and leaves the queue.
func TestQueueTimeout(t *testing.T) {
	up := newGatedUpstream(t)
	p := startProxy(t, queueConfig(up.fakeUpstream, 1, 5, "300ms"))
	first := p.send(context.Background(), qBody("m", "hold"))
	eventually(t, 5*time.Second, "slot taken", func() bool { return len(up.order()) == 1 })

	start := time.Now()
	resp := p.chat(qBody("m", "waits"))
	body := readAll(t, resp)
	waited := time.Since(start)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "timed out waiting for a slot") {
		t.Fatalf("got %d %s", resp.StatusCode, body)
	}
	if resp.Header.Get("Retry-After") == "" {
		t.Error("no Retry-After on queue timeout")
	}
	if waited < 250*time.Millisecond {
		t.Errorf("answered after %v, before the queue timeout", waited)
	}
	if d := p.queueDepth("m"); d != 0 {
		t.Errorf("queue depth %v after timeout", d)
	}
	up.let(1)
	<-first
	if len(up.order()) != 1 {
		t.Errorf("the timed-out request reached the upstream: %v", up.order())
	}
}

// TestQueueClientCancel: a waiter whose client goes away leaves the queue at
// once and never takes a slot.
func TestQueueClientCancel(t *testing.T) {
	up := newGatedUpstream(t)
	p := startProxy(t, queueConfig(up.fakeUpstream, 1, 1, "30s"))
	cancelled := `llm_proxy_queue_wait_seconds_count{model="m",result="cancelled"}`
	before, _ := p.metricValue(cancelled)
	first := p.send(context.Background(), qBody("m", "hold"))
	eventually(t, 5*time.Second, "slot taken", func() bool { return len(up.order()) == 1 })

	ctx, cancel := context.WithCancel(context.Background())
	gone := p.send(ctx, qBody("m", "gone"))
	eventually(t, 5*time.Second, "one waiting", func() bool { return p.queueDepth("m") == 1 })
	cancel()
	<-gone
	eventually(t, time.Second, "cancelled waiter left the queue", func() bool { return p.queueDepth("m") == 0 })

	// Its place is free: another request can wait (queue_size 1).
	next := p.send(context.Background(), qBody("m", "next"))
	eventually(t, 5*time.Second, "next waiting", func() bool { return p.queueDepth("m") == 1 })
	up.let(2)
	if code := <-first; code != http.StatusOK {
		t.Errorf("first: %d", code)
	}
	if code := <-next; code != http.StatusOK {
		t.Errorf("next: %d", code)
	}
	if got := up.order(); len(got) != 2 || got[1] != "next" {
		t.Errorf("upstream saw %v, want [hold next]", got)
	}
	if v, _ := p.metricValue(cancelled); v-before != 1 {
		t.Errorf("cancelled count grew by %v, want 1", v-before)
	}
	eventually(t, time.Second, "inflight 0", func() bool { return p.inflight("u1", "p1") == 0 })
}

// TestQueueSharedUpstreamGlobalOrder: two models over one upstream; a freed
// slot goes to the earliest waiter of either model.
func TestQueueSharedUpstreamGlobalOrder(t *testing.T) {
	up := newGatedUpstream(t)
	cfg := queueConfig(up.fakeUpstream, 1, 10, "30s")
	cfg["models"] = []any{
		map[string]any{"name": "a", "upstreams": []string{"u1"}},
		map[string]any{"name": "b", "upstreams": []string{"u1"}},
	}
	p := startProxy(t, cfg)
	first := p.send(context.Background(), qBody("a", "hold"))
	eventually(t, 5*time.Second, "slot taken", func() bool { return len(up.order()) == 1 })
	order := []struct{ model, text string }{{"a", "a1"}, {"b", "b1"}, {"a", "a2"}, {"b", "b2"}, {"b", "b3"}, {"a", "a3"}}
	var chans []<-chan int
	for i, o := range order {
		chans = append(chans, p.send(context.Background(), qBody(o.model, o.text)))
		want := i + 1
		eventually(t, 5*time.Second, "enqueued", func() bool { return int(p.queueDepth("a")+p.queueDepth("b")) == want })
	}
	up.let(len(order) + 1)
	<-first
	for _, ch := range chans {
		if code := <-ch; code != http.StatusOK {
			t.Errorf("status %d", code)
		}
	}
	want := []string{"hold", "a1", "b1", "a2", "b2", "b3", "a3"}
	if got := up.order(); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("served %v, want %v", got, want)
	}
}

// TestQueueSurvivesReload: waiters keep their place across a config reload,
// and a limit raised by the reload admits them at once.
func TestQueueSurvivesReload(t *testing.T) {
	up := newGatedUpstream(t)
	cfg := queueConfig(up.fakeUpstream, 1, 10, "30s")
	p := startProxy(t, cfg)
	first := p.send(context.Background(), qBody("m", "hold"))
	eventually(t, 5*time.Second, "slot taken", func() bool { return len(up.order()) == 1 })
	w1 := p.send(context.Background(), qBody("m", "w1"))
	eventually(t, 5*time.Second, "w1 waiting", func() bool { return p.queueDepth("m") == 1 })
	w2 := p.send(context.Background(), qBody("m", "w2"))
	eventually(t, 5*time.Second, "w2 waiting", func() bool { return p.queueDepth("m") == 2 })

	// Same limit, different config: the waiters stay queued, in order.
	cfg["request_timeout"] = "4m"
	p.load(cfg)
	time.Sleep(50 * time.Millisecond)
	if d := p.queueDepth("m"); d != 2 {
		t.Fatalf("queue depth after reload = %v, want 2", d)
	}
	if n := len(up.order()); n != 1 {
		t.Fatalf("a waiter got in without a free slot: %v", up.order())
	}
	// Raise the limit to 3: both waiters are admitted without any release.
	cfg = queueConfig(up.fakeUpstream, 3, 10, "30s")
	p.load(cfg)
	eventually(t, 5*time.Second, "waiters admitted by the raised limit", func() bool { return len(up.order()) == 3 })
	// Both were admitted at once; they may reach the upstream in any order.
	if got := up.order(); !(got[1] == "w1" && got[2] == "w2" || got[1] == "w2" && got[2] == "w1") {
		t.Errorf("order %v", got)
	}
	up.let(3)
	for _, ch := range []<-chan int{first, w1, w2} {
		if code := <-ch; code != http.StatusOK {
			t.Errorf("status %d", code)
		}
	}
	eventually(t, time.Second, "inflight 0", func() bool { return p.inflight("u1", "p1") == 0 })
}

// TestQueueWaitsForCoolingUpstream: an upstream in backoff that comes back
// within the wait serves the waiter; one that comes back later gets the
// cooling 503 at once.
func TestQueueWaitsForCoolingUpstream(t *testing.T) {
	up := newUpstream(t, status(500))
	cfg := queueConfig(up, 1, 5, "5s")
	cfg["upstreams"] = []any{map[string]any{"id": "u1", "provider": "p1", "model": "real-model", "max_concurrency": 1, "backoff": "1m", "probe_interval": "0s"}}
	p := startProxy(t, cfg)
	resp := p.chat(qBody("m", "fails"))
	readAll(t, resp)
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("failing upstream: %d", resp.StatusCode)
	}
	// Cooling for 1s now (first failure), within the 5s wait.
	up.setHandler(completion("back"))
	start := time.Now()
	resp = p.chat(qBody("m", "waits for the cooling to end"))
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "back") {
		t.Fatalf("after cooling: %d %s", resp.StatusCode, body)
	}
	if waited := time.Since(start); waited < 500*time.Millisecond {
		t.Errorf("served after %v: the cooling upstream was not skipped", waited)
	}

	// Two more failures: cooling 1s then 2s; with a 300ms queue timeout the
	// cooling 503 comes at once.
	cfg["queue_timeout"] = "300ms"
	p.load(cfg)
	up.setHandler(status(500))
	readAll(t, p.chat(qBody("m", "fail 1")))
	start = time.Now()
	resp = p.chat(qBody("m", "cooling"))
	body = readAll(t, resp)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "all upstreams cooling") || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("all cooling: %d %s %q", resp.StatusCode, body, resp.Header.Get("Retry-After"))
	}
	if waited := time.Since(start); waited > 200*time.Millisecond {
		t.Errorf("cooling 503 took %v; it should not wait", waited)
	}
}

// TestQueueThousandWithCancels: 1000 requests through a limit-2 upstream with
// random client cancels end with nothing in flight and nothing queued, and
// the upstream never saw more than 2 at once.
func TestQueueThousandWithCancels(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(time.Duration(rand.Intn(3)) * time.Millisecond):
		case <-r.Context().Done():
			return
		}
		completion("ok")(w, r)
	})
	p := startProxy(t, queueConfig(up, 2, 1000, "30s"))
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 100}}
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	work := make(chan int)
	for w := 0; w < 64; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				ctx, cancel := context.WithCancel(context.Background())
				if i%5 == 0 {
					time.AfterFunc(time.Duration(rand.Intn(20))*time.Millisecond, cancel)
				}
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, p.URL+"/v1/chat/completions", strings.NewReader(qBody("m", fmt.Sprint(i))))
				code := -1
				if resp, err := client.Do(req); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					code = resp.StatusCode
				}
				cancel()
				mu.Lock()
				codes[code]++
				mu.Unlock()
			}
		}()
	}
	for i := 0; i < 1000; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
	if codes[http.StatusOK] < 500 {
		t.Errorf("only %d of 1000 served: %v", codes[http.StatusOK], codes)
	}
	for code := range codes {
		if code != http.StatusOK && code != -1 {
			t.Errorf("unexpected status %d (%d times)", code, codes[code])
		}
	}
	eventually(t, 2*time.Second, "inflight 0", func() bool { return p.inflight("u1", "p1") == 0 })
	eventually(t, 2*time.Second, "queue empty", func() bool { return p.queueDepth("m") == 0 })
	if peak := up.peak.Load(); peak > 2 {
		t.Errorf("upstream peak concurrency %d > limit 2", peak)
	}
}
