package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
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

// poolProxy starts a proxy whose model m is one pool of the given
// upstreams (ids g0, g1, …, limit each) with the pool settings kv.
func poolProxy(t *testing.T, ups []*fakeUpstream, limit int, kv ...any) *proxy {
	t.Helper()
	var provs, us []map[string]any
	var ids []string
	for i, up := range ups {
		id := "g" + string(rune('0'+i))
		provs = append(provs, obj("id", "p"+id, "url", up.base()))
		us = append(us, obj("id", id, "provider", "p"+id, "model", "x", "max_concurrency", limit))
		ids = append(ids, id)
	}
	return startProxy(t, cfg(provs, us, []map[string]any{obj("name", "m", "upstreams", []string{"gpus"})},
		"pools", []map[string]any{obj(append([]any{"id", "gpus", "upstreams", ids}, kv...)...)}))
}

// holdable answers at once, except a request whose prompt says "hold",
// which waits for g.
func holdable(g *gate, text string) http.HandlerFunc {
	answer := completion(text)
	return func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(strings.NewReader(string(body)))
		if strings.Contains(string(body), "hold") {
			g.handler(answer)(w, r)
			return
		}
		answer(w, r)
	}
}

func promptBody(text string) string {
	return `{"model":"m","messages":[{"role":"user","content":"` + text + `"}]}`
}

// least_busy (the default): a member holding a request is passed over for
// an idle one, and idle equals take turns.
func TestPoolLeastBusySpreadsLoad(t *testing.T) {
	g := newGate()
	defer g.open()
	ups := []*fakeUpstream{newUpstream(t, holdable(g, "from g0")), newUpstream(t, holdable(g, "from g1"))}
	p := poolProxy(t, ups, 4)

	// Idle equals alternate.
	prev := ""
	for i := 0; i < 10; i++ {
		resp := p.chat(promptBody("hi"))
		got := resp.Header.Get("X-LLM-Route-Upstream")
		if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: status %d: %s", i, resp.StatusCode, body)
		}
		if got == prev {
			t.Errorf("request %d went to %s again; idle members should take turns", i, got)
		}
		prev = got
	}

	// A request held on one member sends the next ones to the other.
	held := p.goChat(context.Background(), promptBody("hold"))
	g.waitArrivals(t, 1)
	busy := "g0"
	if len(ups[1].Calls()) > 5 {
		busy = "g1"
	}
	for i := 0; i < 4; i++ {
		resp := p.chat(promptBody("hi"))
		if got := resp.Header.Get("X-LLM-Route-Upstream"); resp.StatusCode != http.StatusOK || got == busy {
			t.Errorf("request %d with %s busy: status %d, upstream %s, want the idle member", i, busy, resp.StatusCode, got)
		}
		readAll(t, resp)
	}
	g.open()
	if r := await(t, held); r.status != http.StatusOK || r.header.Get("X-LLM-Route-Upstream") != busy {
		t.Errorf("held request: status %d upstream %q, want 200 from %s", r.status, r.header.Get("X-LLM-Route-Upstream"), busy)
	}
}

// sticky: one session keeps its member over many requests; while that
// member is busy the session goes to its next-ranked member, and back
// afterwards.
func TestPoolStickyKeepsASessionOnItsMember(t *testing.T) {
	g := newGate()
	defer g.open()
	ups := []*fakeUpstream{newUpstream(t, holdable(g, "a")), newUpstream(t, holdable(g, "b")), newUpstream(t, holdable(g, "c"))}
	// Limit 2: a finished request's slot may still be on its way back when
	// the next request of the session arrives; one left free keeps the
	// member free.
	p := poolProxy(t, ups, 2, "placement", "sticky")

	member := func(session string) string {
		t.Helper()
		resp := p.chat(promptBody("hi"), "X-Claude-Code-Session-Id", session)
		if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
			t.Fatalf("session %s: status %d: %s", session, resp.StatusCode, body)
		}
		return resp.Header.Get("X-LLM-Route-Upstream")
	}
	home := member("session-1")
	for i := 0; i < 50; i++ {
		if got := member("session-1"); got != home {
			t.Fatalf("request %d of session-1 went to %s, want its member %s", i, got, home)
		}
	}
	// Other sessions spread over the members.
	seen := map[string]bool{}
	for i := 0; i < 30; i++ {
		seen[member("session-x"+string(rune('a'+i)))] = true
	}
	if len(seen) < 2 {
		t.Errorf("30 sessions all went to %v; sticky should spread keys over the members", seen)
	}

	// Its member busy (two held requests of the session fill it): the
	// session goes to another member, the same one each time, and comes
	// home once the member frees up.
	var held []<-chan result
	for i := 0; i < 2; i++ {
		held = append(held, p.goChat(context.Background(), promptBody("hold"), "X-Claude-Code-Session-Id", "session-1"))
		g.waitArrivals(t, 1)
	}
	second := member("session-1")
	if second == home {
		t.Fatalf("session-1 went to its busy member %s", home)
	}
	for i := 0; i < 5; i++ {
		if got := member("session-1"); got != second {
			t.Errorf("with %s busy, request %d went to %s, want the next-ranked %s", home, i, got, second)
		}
	}
	g.open()
	for _, h := range held {
		if r := await(t, h); r.status != http.StatusOK || r.header.Get("X-LLM-Route-Upstream") != home {
			t.Errorf("held request: status %d upstream %q, want 200 from %s", r.status, r.header.Get("X-LLM-Route-Upstream"), home)
		}
	}
	eventually(t, 5*time.Second, "the home member's slots back", func() bool {
		return p.upstreamGauge("inflight", home, "p"+home) == 0
	})
	if got := member("session-1"); got != home {
		t.Errorf("after its member freed up, session-1 went to %s, want %s", got, home)
	}
}

// A failed member fails over to the next member of this request's order,
// then to the chain's next step.
func TestPoolFailoverGoesThroughMembersThenNextStep(t *testing.T) {
	bad1 := newUpstream(t, status(http.StatusInternalServerError))
	bad2 := newUpstream(t, status(http.StatusInternalServerError))
	cloud := newUpstream(t, completion("from cloud"))
	p := startProxy(t, cfg(
		[]map[string]any{obj("id", "p1", "url", bad1.base()), obj("id", "p2", "url", bad2.base()), obj("id", "pc", "url", cloud.base())},
		[]map[string]any{
			obj("id", "gpu1", "provider", "p1", "model", "x"),
			obj("id", "gpu2", "provider", "p2", "model", "x"),
			obj("id", "cloud", "provider", "pc", "model", "x"),
		},
		[]map[string]any{obj("name", "m", "upstreams", []string{"gpus", "cloud"})},
		"pools", []map[string]any{obj("id", "gpus", "upstreams", []string{"gpu1", "gpu2"})},
	))
	resp := p.chat(promptBody("hi"))
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK || resp.Header.Get("X-LLM-Route-Upstream") != "cloud" {
		t.Fatalf("status %d upstream %q: %s; want 200 from cloud", resp.StatusCode, resp.Header.Get("X-LLM-Route-Upstream"), body)
	}
	if n1, n2, nc := len(bad1.Calls()), len(bad2.Calls()), len(cloud.Calls()); n1 != 1 || n2 != 1 || nc != 1 {
		t.Errorf("calls gpu1 %d gpu2 %d cloud %d, want each member once, then cloud once", n1, n2, nc)
	}
}

// A queued request of a pooled model is served by the member that frees
// up, whichever it is in the pool.
func TestPoolQueuedRequestTakesTheMemberThatFreesUp(t *testing.T) {
	g0, g1 := newGate(), newGate()
	defer g0.open()
	defer g1.open()
	ups := []*fakeUpstream{newUpstream(t, holdable(g0, "from g0")), newUpstream(t, holdable(g1, "from g1"))}
	p := startProxy(t, cfg(
		[]map[string]any{obj("id", "pg0", "url", ups[0].base()), obj("id", "pg1", "url", ups[1].base())},
		[]map[string]any{
			obj("id", "g0", "provider", "pg0", "model", "x", "max_concurrency", 1),
			obj("id", "g1", "provider", "pg1", "model", "x", "max_concurrency", 1),
		},
		[]map[string]any{obj("name", "m", "upstreams", []string{"gpus"}, "queue_size", 4)},
		"pools", []map[string]any{obj("id", "gpus", "upstreams", []string{"g0", "g1"})},
	))
	ctx := context.Background()
	first := p.goChat(ctx, promptBody("hold"))
	second := p.goChat(ctx, promptBody("hold"))
	eventually(t, 10*time.Second, "both members busy", func() bool {
		return len(ups[0].Calls()) == 1 && len(ups[1].Calls()) == 1
	})
	queued := p.goChat(ctx, promptBody("queued"))
	eventually(t, 10*time.Second, "the third request queued", func() bool {
		return p.metric("llm_proxy_queue_depth", "model", "m") == 1
	})
	g1.open() // g1 frees up first: the queued request takes it
	r := await(t, queued)
	if r.status != http.StatusOK || r.header.Get("X-LLM-Route-Upstream") != "g1" {
		t.Errorf("queued request: status %d upstream %q, want 200 from g1", r.status, r.header.Get("X-LLM-Route-Upstream"))
	}
	g0.open()
	await(t, first)
	await(t, second)
}

// sticky with weights [90, 10]: of 1,000 sessions 90 ± 3 % land on the
// first member; a reload that removes a member moves only its sessions.
func TestPoolStickyWeightsAndReload(t *testing.T) {
	ups := []*fakeUpstream{newUpstream(t, completion("a")), newUpstream(t, completion("b")), newUpstream(t, completion("c"))}
	p := poolProxy(t, ups[:2], 8, "placement", "sticky", "weights", []int{90, 10})
	member := func(session string) string {
		t.Helper()
		resp := p.chat(promptBody("hi"), "Session-Id", session)
		if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
			t.Fatalf("session %s: status %d: %s", session, resp.StatusCode, body)
		}
		return resp.Header.Get("X-LLM-Route-Upstream")
	}
	first := 0
	for i := range 1000 {
		if member(fmt.Sprintf("user-%d", i)) == "g0" {
			first++
		}
	}
	if first < 870 || first > 930 {
		t.Errorf("weights [90, 10]: %d of 1000 sessions on the first member, want 900 ± 30", first)
	}

	// Three equal members, then a reload without g2.
	conf := func(ids ...string) map[string]any {
		var provs, us []map[string]any
		for i, up := range ups {
			id := fmt.Sprintf("g%d", i)
			provs = append(provs, obj("id", "p"+id, "url", up.base()))
			us = append(us, obj("id", id, "provider", "p"+id, "model", "x", "max_concurrency", 8))
		}
		return cfg(provs, us, []map[string]any{obj("name", "m", "upstreams", []string{"gpus"})},
			"pools", []map[string]any{obj("id", "gpus", "upstreams", ids, "placement", "sticky")})
	}
	p.load(conf("g0", "g1", "g2"))
	before := map[string]string{}
	for i := range 300 {
		s := fmt.Sprintf("dev-%d", i)
		before[s] = member(s)
	}
	p.load(conf("g0", "g1"))
	moved := 0
	for s, was := range before {
		now := member(s)
		if was != "g2" && now != was {
			t.Errorf("session %s moved from %s to %s when only g2 was removed", s, was, now)
		}
		if was == "g2" {
			moved++
		}
	}
	if moved == 0 || moved > 150 {
		t.Errorf("%d of 300 sessions were on g2, want about a third", moved)
	}
}
