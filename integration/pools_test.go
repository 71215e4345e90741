package integration

import (
	"context"
	"net/http"
	"strings"
	"testing"
)

// A pool's config errors name the pool and what is wrong with it, and the
// running config survives each failed load.
func TestPoolConfigErrorsNameThePool(t *testing.T) {
	up := newUpstream(t, completion("ok"))
	p := startProxy(t, basicConfig(up, 1))
	provs := []map[string]any{obj("id", "p1", "url", up.base())}
	ups := []map[string]any{
		obj("id", "u1", "provider", "p1", "model", "x"),
		obj("id", "u2", "provider", "p1", "model", "x"),
	}
	pool := func(kv ...any) map[string]any {
		return obj(append([]any{"id", "gpus", "upstreams", []string{"u1", "u2"}}, kv...)...)
	}
	model := func(upstreams ...string) []map[string]any {
		return []map[string]any{obj("name", "m", "upstreams", upstreams)}
	}
	for _, tc := range []struct {
		name   string
		pools  []map[string]any
		models []map[string]any
		want   []string
	}{
		{"id of an upstream", []map[string]any{pool("id", "u1")}, model("u1"), []string{`pool "u1"`, "upstream"}},
		{"duplicate id", []map[string]any{pool(), pool()}, model("gpus"), []string{`pool "gpus"`, "duplicate"}},
		{"unknown member", []map[string]any{pool("upstreams", []string{"u1", "ghost"})}, model("gpus"),
			[]string{`pool "gpus"`, `"ghost"`}},
		{"no members", []map[string]any{pool("upstreams", []string{})}, model("gpus"), []string{`pool "gpus"`, "at least one"}},
		{"member twice", []map[string]any{pool("upstreams", []string{"u1", "u1"})}, model("gpus"), []string{`pool "gpus"`, "twice"}},
		{"weights not aligned", []map[string]any{pool("weights", []int{1})}, model("gpus"), []string{`pool "gpus"`, "weights"}},
		{"weight zero", []map[string]any{pool("weights", []int{1, 0})}, model("gpus"), []string{`pool "gpus"`, "positive"}},
		{"threshold above 1", []map[string]any{pool("cache_threshold", 1.5)}, model("gpus"), []string{`pool "gpus"`, "cache_threshold"}},
		{"unknown placement", []map[string]any{pool("placement", "random")}, model("gpus"), []string{`pool "gpus"`, `"random"`}},
		{"model names an unknown pool", []map[string]any{pool()}, model("gpuz"), []string{`model "m"`, `"gpuz"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := p.loadErr(cfg(provs, ups, tc.models, "pools", tc.pools))
			if err == nil {
				t.Fatal("config loaded, want an error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not mention %s: %v", w, err)
				}
			}
		})
	}
	if resp := p.chat(chatBody("m", false)); resp.StatusCode != http.StatusOK {
		t.Fatalf("the running config did not survive the failed loads: status %d", resp.StatusCode)
	}
}

// A model's chain may name a pool: its members are tried in the pool's
// order (placement first: list order), then the chain's next step; an
// upstream in a pool and named directly keeps one set of slots.
func TestPoolStepFailsOverThroughMembersThenNextStep(t *testing.T) {
	g1, g2, gc := newGate(), newGate(), newGate()
	defer g1.open()
	defer g2.open()
	defer gc.open()
	gpu1 := newUpstream(t, g1.handler(completion("from gpu1")))
	gpu2 := newUpstream(t, g2.handler(completion("from gpu2")))
	cloud := newUpstream(t, gc.handler(completion("from cloud")))
	p := startProxy(t, cfg(
		[]map[string]any{
			obj("id", "p1", "url", gpu1.base()),
			obj("id", "p2", "url", gpu2.base()),
			obj("id", "pc", "url", cloud.base()),
		},
		[]map[string]any{
			obj("id", "gpu1", "provider", "p1", "model", "x", "max_concurrency", 1),
			obj("id", "gpu2", "provider", "p2", "model", "x", "max_concurrency", 1),
			obj("id", "cloud", "provider", "pc", "model", "x", "max_concurrency", 1),
		},
		[]map[string]any{
			obj("name", "m", "upstreams", []string{"gpus", "cloud"}),
			obj("name", "direct", "upstreams", []string{"gpu1"}),
		},
		"pools", []map[string]any{obj("id", "gpus", "upstreams", []string{"gpu1", "gpu2"}, "placement", "first")},
	))
	ctx := context.Background()
	var pending []<-chan result
	for _, g := range []*gate{g1, g2, gc} {
		pending = append(pending, p.goChat(ctx, chatBody("m", false)))
		g.waitArrivals(t, 1)
	}
	// gpu1's one slot is the pool's: the model naming it directly finds it
	// busy.
	expectAPIError(t, p.chat(chatBody("direct", false)), http.StatusServiceUnavailable, "all_upstreams_busy")
	g1.open()
	g2.open()
	gc.open()
	for i, want := range []string{"gpu1", "gpu2", "cloud"} {
		r := await(t, pending[i])
		if r.status != http.StatusOK || r.header.Get("X-LLM-Route-Upstream") != want {
			t.Errorf("request %d: status %d upstream %q, want 200 from %s", i, r.status, r.header.Get("X-LLM-Route-Upstream"), want)
		}
	}
	if n := len(gpu1.Calls()) + len(gpu2.Calls()) + len(cloud.Calls()); n != 3 {
		t.Errorf("upstream calls = %d, want 3", n)
	}
}
