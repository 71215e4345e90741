package llmroute

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// Ranking a request's pool steps and ordering a route by them allocates
// nothing (the placing comes from a pool), and the order keeps the chain's
// steps in place while reordering a pool step's members.
func TestPlacementOrderAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("race detector allocates")
	}
	for _, policy := range []string{"sticky", "cache_aware", "least_busy"} {
		t.Run(policy, func(t *testing.T) { testPlacementAllocs(t, policy) })
	}
}

func testPlacementAllocs(t *testing.T, policy string) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`{"object":"list","data":[]}`))
	}))
	defer srv.Close()
	h := provisionBench(t, `{
		"providers": [{"id": "p", "url": "`+srv.URL+`/v1"}],
		"upstreams": [{"id": "a", "provider": "p", "model": "x"}, {"id": "b", "provider": "p", "model": "x"},
			{"id": "c", "provider": "p", "model": "x"}, {"id": "d", "provider": "p", "model": "x"}],
		"pools": [{"id": "gpus", "upstreams": ["a", "b", "c"], "placement": "`+policy+`"}],
		"models": [{"name": "m", "upstreams": ["d", "gpus"]}]
	}`)
	rt := h.table.routes["m"]
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	r.Header.Set("X-Claude-Code-Session-Id", "s1")
	body := []byte(`{"model":"m","messages":[{"role":"system","content":"` + strings.Repeat("be brief. ", 4000) + `"},{"role":"user","content":"hi"}]}`)
	in := &placeInput{r: r, body: body, codec: chatCodec{}, led: h.led, now: time.Now()}
	var first []int
	allocs := testing.AllocsPerRun(100, func() {
		pl := placeRequest(rt, in)
		o := rt.orderFor(pl)
		if first == nil {
			first = append([]int(nil), o...)
		} else if policy == "sticky" && (o[0] != first[0] || o[1] != first[1]) {
			t.Fatalf("order %v, then %v: one key, idle members, one order", first, o)
		}
		donePlacing(pl)
	})
	if allocs != 0 {
		t.Errorf("placement and order: %v allocations per request, want 0", allocs)
	}
	if len(first) != 4 || first[0] != 0 {
		t.Errorf("order %v: the directly named upstream d is the chain's first step and stays first", first)
	}
}

// BenchmarkPlacement is what a pool adds to a request: the ranking of its
// members (placeRequest, orderFor) and the record of where it went (sent),
// for three members. The cache_aware case has a 100 K-token history (about
// 400 KB of prompt: a long coding-agent session); "keyless" finds its key
// in the conversation's own session id.
func BenchmarkPlacement(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`{"object":"list","data":[]}`))
	}))
	defer srv.Close()
	small := []byte(`{"model":"m","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Hello there"}]}`)
	var long strings.Builder
	long.WriteString(`{"model":"m","messages":[{"role":"system","content":"` + strings.Repeat("Follow the style. ", 500) + `"}`)
	for i := 0; long.Len() < 400_000; i++ {
		long.WriteString(`,{"role":"user","content":"tool result ` + strings.Repeat("line of output ", 200) + `"},{"role":"assistant","content":"next step"}`)
	}
	long.WriteString(`]}`)
	for _, tc := range []struct {
		name, policy string
		body         []byte
		session      string
	}{
		{"first", "first", small, ""},
		{"least_busy", "least_busy", small, ""},
		{"sticky", "sticky", small, "s1"},
		{"sticky_keyless", "sticky", small, ""},
		{"cache_aware_100K", "cache_aware", []byte(long.String()), "s1"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			h := provisionBench(b, `{
				"providers": [{"id": "p", "url": "`+srv.URL+`/v1"}],
				"upstreams": [{"id": "a", "provider": "p", "model": "x"}, {"id": "b", "provider": "p", "model": "x"},
					{"id": "c", "provider": "p", "model": "x"}],
				"pools": [{"id": "gpus", "upstreams": ["a", "b", "c"], "placement": "`+tc.policy+`"}],
				"models": [{"name": "m", "upstreams": ["gpus"]}]
			}`)
			rt := h.table.routes["m"]
			r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
			if tc.session != "" {
				r.Header.Set("X-Session-Affinity", tc.session)
			}
			in := &placeInput{r: r, body: tc.body, codec: chatCodec{}, led: h.led}
			b.SetBytes(int64(len(tc.body)))
			b.ReportAllocs()
			var decide, record time.Duration
			for b.Loop() {
				in.now = time.Now()
				pl := placeRequest(rt, in)
				o := rt.orderFor(pl)
				t1 := time.Now()
				pl.sent(nil, &rt.targets[o[0]], in.now)
				donePlacing(pl)
				decide += t1.Sub(in.now)
				record += time.Since(t1)
			}
			b.ReportMetric(float64(decide.Nanoseconds())/float64(b.N), "decide-ns/op")
			b.ReportMetric(float64(record.Nanoseconds())/float64(b.N), "record-ns/op")
		})
	}
}
