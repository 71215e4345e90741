package llmroute

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/llm-route/caddy-llm-route/llmroute/transform"
)

// routerConfig is newBenchHandler's config plus a router model "auto"
// with n rules over 4 attributes, all using m, the last a catch-all that
// sends 10 % of users to m2 first.
func routerConfig(upstream string, n int) string {
	var rules []string
	attrs := []string{"language", "team", "task", "tier"}
	for i := 0; i < n-1; i++ {
		rules = append(rules, fmt.Sprintf(`{"name": "r%d", "priority": %d, "match": {%q: ["v%d", "w%d"], %q: "x"}, "use": ["m"]}`,
			i, 100-i, attrs[i%4], i, i, attrs[(i+1)%4]))
	}
	rules = append(rules, `{"name": "anything-else", "use": ["m", "m2"], "weights": [90, 10]}`)
	return `{
		"providers": [{"id": "bench-p", "url": "` + upstream + `/v1", "key": "sk-bench"}],
		"upstreams": [{"id": "bench-u", "provider": "bench-p", "model": "real-model", "max_concurrency": 64},
			{"id": "bench-u2", "provider": "bench-p", "model": "real-model-2", "max_concurrency": 64}],
		"models": [{"name": "m", "upstreams": ["bench-u"]}, {"name": "m2", "upstreams": ["bench-u2"]},
			{"name": "auto", "rules": [` + strings.Join(rules, ",") + `]}]
	}`
}

func modelListServer(tb testing.TB) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			_, _ = w.Write([]byte(`{"object":"list","data":[]}`))
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(benchCompletion)
	}))
	tb.Cleanup(srv.Close)
	return srv
}

// ruleRequest is a router request with metadata attributes, a user and
// an X-LLM-Attr-* header, none matching any rule but the catch-all: the
// whole bucket is walked.
var ruleRequest = []byte(`{"model":"auto","metadata":{"language":"es","team":"billing","task":"code"},"user":"u-42",` +
	`"reasoning_effort":"high","messages":[{"role":"user","content":"Hello there, how are you doing today?"}]}`)

// parsed is a request body parsed as serveFront parses it.
type parsed struct {
	body   []byte
	spans  transform.Spans
	rt     *route
	pinned effort
}

func parseRule(h *Handler, body []byte) *parsed {
	c := frontCodecs[frontChat]
	p := &parsed{body: body, spans: c.prompt().spans()}
	c.rules().addSpans(&p.spans)
	model, _, _, err := transform.ParseRequestKeys(body, h.watchKeys, &p.spans)
	if err != nil {
		panic(err)
	}
	if p.rt = h.table.routes[model]; p.rt == nil {
		p.rt, p.pinned = h.table.suffixed(model)
	}
	return p
}

// resolveOnce resolves the rule of a parsed request.
func resolveOnce(h *Handler, w http.ResponseWriter, r *http.Request, p *parsed) *route {
	fr := frontReq{f: frontChat, codec: frontCodecs[frontChat]}
	fr.api = fr.codec.api()
	_, out := h.resolveRule(w, r, &fr, p.rt.rules, p.pinned, p.body, &p.spans, nil)
	return out
}

// TestRuleResolveAllocs: resolving a rule of a 20-rule router model (its
// effort, 4 attributes from the body and a header, the walk of the rules,
// the weighted choice by user) allocates nothing; the route headers are
// its one allocation.
func TestRuleResolveAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("race detector allocates")
	}
	h := provisionBench(t, routerConfig(modelListServer(t).URL, 20))
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	r.Header.Set("X-Llm-Attr-Tier", "gold")
	w := httptest.NewRecorder()
	p := parseRule(h, ruleRequest)
	if rt := resolveOnce(h, w, r, p); rt == nil || w.Header().Get(hdrRouteRule) != "anything-else" ||
		w.Header().Get(hdrRouteEffort) != "high (field)" {
		t.Fatalf("resolved %v, headers %v", rt, w.Header())
	}
	for _, headers := range []bool{false, true} {
		h.routeHeaders = headers
		allocs := testing.AllocsPerRun(200, func() { resolveOnce(h, w, r, p) })
		want := 0.0
		if headers {
			want = 1 // both header values in one array
		}
		if allocs != want {
			t.Errorf("route headers %v: %v allocations per resolution, want %v", headers, allocs, want)
		}
	}
}

// TestPlainModelAllocsUnchanged: a request to a plain model costs the same
// allocations whether or not the config has a router model.
func TestPlainModelAllocsUnchanged(t *testing.T) {
	if raceEnabled {
		t.Skip("race detector allocates")
	}
	srv := modelListServer(t)
	routed := provisionBench(t, routerConfig(srv.URL, 20))
	count := func(h *Handler) float64 {
		serve := func() {
			req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(benchRequest))
			rec := httptest.NewRecorder()
			if err := h.ServeHTTP(rec, req, nextNotCalled); err != nil || rec.Code != http.StatusOK {
				t.Fatalf("%v %d %s", err, rec.Code, rec.Body)
			}
		}
		serve()
		return testing.AllocsPerRun(200, serve)
	}
	// routerConfig's plain part, without the router model.
	plain := provisionBench(t, `{
		"providers": [{"id": "bench-p", "url": "`+srv.URL+`/v1", "key": "sk-bench"}],
		"upstreams": [{"id": "bench-u", "provider": "bench-p", "model": "real-model", "max_concurrency": 64}],
		"models": [{"name": "m", "upstreams": ["bench-u"]}]
	}`)
	a, b := count(plain), count(routed)
	if b > a {
		t.Errorf("plain model: %v allocations per request with a router model in the config, %v without", b, a)
	}
	t.Logf("plain model: %v allocations per request without a router, %v with", a, b)
}

// BenchmarkRuleSelect20 is what a router model adds to a request before
// its upstream is chosen: effort, attributes and the walk of 20 rules.
func BenchmarkRuleSelect20(b *testing.B) {
	h := provisionBench(b, routerConfig(modelListServer(b).URL, 20))
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	r.Header.Set("X-Llm-Attr-Tier", "gold")
	w := httptest.NewRecorder()
	h.routeHeaders = false
	p := parseRule(h, ruleRequest)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		resolveOnce(h, w, r, p)
	}
}

// BenchmarkServeRouter is BenchmarkServeHTTP's whole request path for a
// plain model and for `auto:medium`, a router model over it.
func BenchmarkServeRouter(b *testing.B) {
	h := provisionBench(b, routerConfig(modelListServer(b).URL, 20))
	for _, tc := range []struct{ name, model string }{{"plain", "m"}, {"router", "auto:medium"}} {
		body := bytes.Replace(benchRequest, []byte(`"model":"m"`), []byte(`"model":"`+tc.model+`"`), 1)
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(body))
				rec := httptest.NewRecorder()
				if err := h.ServeHTTP(rec, req, nextNotCalled); err != nil || rec.Code != http.StatusOK {
					b.Fatalf("%v %d %s", err, rec.Code, rec.Body)
				}
			}
		})
	}
}
