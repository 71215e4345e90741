package integration

// Issue 14 item 4: provider capacity, a provider-wide in-flight bound over
// all its upstreams and models.

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// capacityConfig is one provider (one fake server, like one local GPU) with
// capacity 1 serving two models through two upstreams, each allowed 2 on its
// own; idA names the upstream of model a.
func capacityConfig(up *fakeUpstream, idA string) map[string]any {
	return cfg(
		[]map[string]any{obj("id", "gpu", "url", up.base(), "capacity", 1)},
		[]map[string]any{
			obj("id", idA, "provider", "gpu", "model", "real-a", "max_concurrency", 2),
			obj("id", "ub", "provider", "gpu", "model", "real-b", "max_concurrency", 2),
		},
		[]map[string]any{
			obj("name", "a", "upstreams", []string{idA}),
			obj("name", "b", "upstreams", []string{"ub"}),
		},
		"queue_size", 20, "queue_timeout", "20s",
	)
}

func TestProviderCapacityAcrossModelsAndReload(t *testing.T) {
	g := newGate()
	defer g.open()
	up := newUpstream(t, nil)
	p := startProxy(t, capacityConfig(up, "ua"))

	// Many requests of both models at once: the fake never sees two.
	up.setHandler(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(30 * time.Millisecond)
		completion("ok")(w, r)
	})
	var wg sync.WaitGroup
	statuses := make(chan int, 12)
	var slowest atomic.Int64 // ns
	start := time.Now()
	for i := 0; i < 12; i++ {
		model := []string{"a", "b"}[i%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			began := time.Now()
			defer func() {
				for d := int64(time.Since(began)); ; {
					if old := slowest.Load(); d <= old || slowest.CompareAndSwap(old, d) {
						return
					}
				}
			}()
			resp, err := p.post(context.Background(), chatBody(model, false))
			if err != nil {
				t.Errorf("request: %v", err)
				return
			}
			readAll(t, resp)
			statuses <- resp.StatusCode
		}()
	}
	wg.Wait()
	close(statuses)
	for s := range statuses {
		if s != http.StatusOK {
			t.Errorf("status %d, want 200 (queued for the provider's capacity)", s)
		}
	}
	if peak := up.peak.Load(); peak != 1 {
		t.Fatalf("the fake's concurrency peak = %d, want 1 (provider capacity 1)", peak)
	}
	t.Logf("provider capacity 1, 12 requests of two models at once (30 ms each upstream): all 200, one at a time at the fake, %v in all, slowest request %v",
		time.Since(start).Round(time.Millisecond), time.Duration(slowest.Load()).Round(time.Millisecond))
	if got := p.metric("llm_proxy_provider_capacity", "provider", "gpu"); got != 1 {
		t.Errorf("llm_proxy_provider_capacity = %v, want 1", got)
	}

	// One request holds the capacity through a reload that renames its
	// upstream: the renamed upstream starts with no slot in use, yet the
	// provider still counts the held request.
	up.setHandler(g.handler(completion("held")))
	held := p.goChat(context.Background(), chatBody("a", false))
	g.waitArrivals(t, 1)
	if got := p.metric("llm_proxy_provider_inflight", "provider", "gpu"); got != 1 {
		t.Errorf("llm_proxy_provider_inflight while held = %v, want 1", got)
	}
	if ex := p.explain("b"); len(ex.Upstreams) != 1 || ex.Upstreams[0].Verdict != "capacity" ||
		!strings.Contains(ex.Upstreams[0].Detail, "gpu at capacity 1/1") {
		t.Errorf("explain b while gpu is full: %+v, want verdict capacity", ex.Upstreams)
	}
	p.load(capacityConfig(up, "ua-renamed"))
	if _, body := p.status(); !strings.Contains(body, `{"id":"gpu","inflight":1,"capacity":1`) {
		t.Errorf("status after the reload does not show gpu with 1 of capacity 1 in flight: %s", body)
	}

	second := p.goChat(context.Background(), chatBody("a", false))
	third := p.goChat(context.Background(), chatBody("b", false))
	select {
	case <-g.arrived:
		t.Fatal("a request reached the fake while the provider's only unit was held across the reload")
	case <-time.After(500 * time.Millisecond):
	}
	eventually(t, 5*time.Second, "both requests queued", func() bool {
		return p.metric("llm_proxy_queue_depth", "model", "a") == 1 && p.metric("llm_proxy_queue_depth", "model", "b") == 1
	})
	g.open()
	for _, ch := range []<-chan result{held, second, third} {
		if r := await(t, ch); r.status != http.StatusOK || !strings.Contains(r.body, "held") {
			t.Errorf("status %d body %s, want 200", r.status, r.body)
		}
	}
	if peak := up.peak.Load(); peak != 1 {
		t.Errorf("the fake's concurrency peak across the reload = %d, want 1", peak)
	}
	eventually(t, 5*time.Second, "the provider's in-flight count back to 0", func() bool {
		return p.metric("llm_proxy_provider_inflight", "provider", "gpu") == 0
	})
	if !strings.Contains(p.logs(), "provider at capacity, skipped") {
		t.Error("no debug log entry for an upstream skipped at the provider's capacity")
	}
}
